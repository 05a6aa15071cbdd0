#pragma once
// ml.tp_step: one training step of one member of a tensor-parallel group (tensor_parallel.cc
// says how the group's gang is joined and what each port carries).
#include <memory>

#include "vertex/program.h"

namespace copse::ml::programs {

std::unique_ptr<vertex::VertexProgram> MakeTensorParallelStepProgram();

}  // namespace copse::ml::programs
