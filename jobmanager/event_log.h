#pragma once
// A job's event log as `copse logs JOB` shows it: the scheduler's lines (placements, failures,
// recoveries) with a line per completed attempt made from its trace span, each where the log
// stood when the attempt ended. Shared by the scheduler (a job it holds) and the job history (a
// job read back from disk).
#include <cstdint>
#include <string>
#include <vector>

#include "common/json_util.h"

namespace copse::jm {

struct EventLine {
  size_t position;  // a logged line's index, or how many lines preceded a completion
  bool logged;      // a logged line (after the completions at the same position: they ended before it was logged)
  double end_ms;    // a completion's end, ordering completions at one position
  std::string text;
};

/// "   1.234s a[0] version 1 completed on d0 in 5.0 ms"
std::string CompletedLine(double end_ms, const std::string& vertex, uint32_t version, const std::string& daemon, double ran_ms);

/// The lines in order, at most `max_lines` of them (then a line saying how many more there are).
Json MergeEventLog(std::vector<EventLine> lines, size_t max_lines);

}  // namespace copse::jm
