#pragma once
// Named spdlog loggers ("jm", "sched", "daemon", "chan", "vertex", "cli"), created on first use
// and sharing one stderr sink. Thread-safe (spdlog's _mt sinks).
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace copse {

/// The logger called `name`, created with the process-wide level and pattern if new.
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

/// Sets the level of every logger, existing and future ("trace" … "off"); false if unknown.
bool SetLogLevel(const std::string& level);

}  // namespace copse
