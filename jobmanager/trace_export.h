#pragma once
// A job's execution trace (`copse trace`) in the Chrome / Perfetto trace-event format: one
// span per attempt, a process per daemon registration, a thread per concurrent slot, so
// pipeline bubbles and recoveries are visible.
//
// Made in two steps so that a job of a million attempts never stalls the scheduler: the
// scheduler's thread takes a TraceSnapshot (a copy of the spans, tens of milliseconds for a
// million), and any thread then formats it, in batches of events as JSON text, while the
// scheduler goes on (jm_server.cc streams each batch to the client as it is made).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"
#include "jobmanager/job_graph.h"

namespace copse::jm {

/// Everything a job's trace shows, copied out of the scheduler. Self-contained: the graph is
/// immutable and shared.
struct TraceSnapshot {
  struct Span {
    uint32_t vertex, version, daemon;
    double start_ms, end_ms;  // end_ms < 0: still running
    std::string outcome;
  };
  uint64_t job = 0;
  std::string name;   // the job's
  std::string state;  // the job's
  double now_ms = 0;  // the job's elapsed time when taken: where running spans end
  std::shared_ptr<const JobGraph> graph;
  /// Without a graph (a job read back from its history): per vertex, its name and stage.
  std::map<uint32_t, std::pair<std::string, std::string>> names;
  /// Per daemon id: its name, and which registration of that name it is (0: the only one).
  std::vector<std::pair<std::string, size_t>> daemons;
  std::vector<Span> spans;
  size_t total_spans = 0;  // the job's, of which `spans` may hold only the newest
};

/// The trace's events, `batch` at a time, as the comma-separated JSON text of each batch's
/// events (to go between the brackets of "traceEvents"); spans first, by start time, then a
/// process_name event per daemon that ran one. Stops early when `sink` returns false.
void FormatTraceEvents(const TraceSnapshot& snapshot, size_t batch, const std::function<bool(std::string_view events)>& sink);

/// The members that close a trace besides its events: displayTimeUnit and otherData.
Json TraceTrailer(const TraceSnapshot& snapshot);

/// The whole trace as one JSON value (tests, small jobs).
Json TraceJson(const TraceSnapshot& snapshot);

}  // namespace copse::jm
