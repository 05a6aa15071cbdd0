# Every header compiles on its own (Seastar's CheckHeaders.cmake): for each header of a library
# a source file that includes it — twice, so a missing `#pragma once` shows too — is compiled
# with the library's include directories and definitions, as part of the default build. A
# header that leans on its includer to have included something first fails the build here,
# not in the next person's new file.
#
#   copse_check_headers(copse_common)        # every *.h in this folder (not its subfolders)
#   copse_check_headers(copse_vertex programs)  # ... and in these subfolders too
option(COPSE_CHECK_HEADERS "Compile every header on its own as part of the build" ON)

function(copse_check_headers target)
  if(NOT COPSE_CHECK_HEADERS)
    return()
  endif()
  set(globs ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  foreach(sub ${ARGN})
    list(APPEND globs ${CMAKE_CURRENT_SOURCE_DIR}/${sub}/*.h)
  endforeach()
  file(GLOB headers CONFIGURE_DEPENDS ${globs})
  set(sources)
  foreach(header ${headers})
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${header})
    string(MAKE_C_IDENTIFIER ${rel} id)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cc)
    file(CONFIGURE OUTPUT ${source} CONTENT "#include \"${rel}\"\n#include \"${rel}\"\n")
    list(APPEND sources ${source})
  endforeach()
  if(sources)
    add_library(${target}_header_check OBJECT ${sources})
    # What the library's own sources see: its usage requirements and its private ones.
    target_link_libraries(${target}_header_check PRIVATE ${target})
    target_include_directories(${target}_header_check PRIVATE $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
    target_compile_definitions(${target}_header_check PRIVATE $<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>)
  endif()
endfunction()
