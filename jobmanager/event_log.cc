#include "jobmanager/event_log.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

namespace copse::jm {

std::string CompletedLine(double end_ms, const std::string& vertex, uint32_t version, const std::string& daemon, double ran_ms) {
  return fmt::format("{:10.3f}s {} version {} completed on {} in {:.1f} ms", end_ms / 1000.0, vertex, version, daemon, ran_ms);
}

Json MergeEventLog(std::vector<EventLine> lines, size_t max_lines) {
  std::stable_sort(lines.begin(), lines.end(), [](const EventLine& a, const EventLine& b) {
    return std::tie(a.position, a.logged, a.end_ms) < std::tie(b.position, b.logged, b.end_ms);
  });
  Json out = Json::array();
  for (size_t i = 0; i < lines.size() && i < max_lines; ++i) out.push_back(std::move(lines[i].text));
  if (lines.size() > max_lines) {
    out.push_back(
        fmt::format("… {} more lines not shown (a job's log answers with its first {})", lines.size() - max_lines, max_lines));
  }
  return out;
}

}  // namespace copse::jm
