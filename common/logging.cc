#include "common/logging.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace copse {
namespace {

std::mutex g_mu;
spdlog::level::level_enum g_level = spdlog::level::warn;
bool g_level_from_env = false;

spdlog::level::level_enum InitialLevel() {
  if (!g_level_from_env) {
    g_level_from_env = true;
    if (const char* env = std::getenv("COPSE_LOG")) {
      auto lvl = spdlog::level::from_str(env);
      if (lvl != spdlog::level::off || std::string(env) == "off") g_level = lvl;
    }
  }
  return g_level;
}

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_level(InitialLevel());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n %v");
  return logger;
}

bool SetLogLevel(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  std::lock_guard<std::mutex> lock(g_mu);
  g_level_from_env = true;
  g_level = lvl;
  spdlog::apply_all([lvl](const std::shared_ptr<spdlog::logger>& l) { l->set_level(lvl); });
  return true;
}

}  // namespace copse
