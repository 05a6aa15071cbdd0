#pragma once
// Sends `copse trace` answers without stalling the job manager's thread: each request's
// TraceSnapshot (taken on that thread) is formatted on this streamer's own thread and sent in
// parts as it is made.
//
// Protocol (the answer to {"op":"trace","job":J}): any number of
//   {"op":"trace_part","events":[…]}   up to kEventsPerPart trace events each, in order
// then one
//   {"op":"trace","displayTimeUnit":"ms","otherData":{…}}
// (or {"op":"error"} instead of all of it, from the job manager's thread). A client writes
// {"traceEvents":[every part's events…], "displayTimeUnit":…, "otherData":…}.
//
// One trace is formatted at a time and at most kMaxQueued wait their turn, one per connection
// (a bound on the CPU and memory clients can make the job manager spend; beyond it Send
// refuses, and the caller answers with an error). A part waits while the connection has more
// than kMaxBacklogBytes unsent, so a slow reader holds a bounded amount of memory; a reader
// that takes nothing for kStallLimit is closed, so it cannot hold up the traces behind it; a
// closed connection ends its trace's formatting. Thread-safe.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/framed_connection.h"
#include "jobmanager/trace_export.h"

namespace copse::jm {

class TraceStreamer {
 public:
  static constexpr size_t kEventsPerPart = 10000;
  static constexpr size_t kMaxBacklogBytes = 32 << 20;
  static constexpr size_t kMaxQueued = 4;
  static constexpr std::chrono::seconds kStallLimit{30};

  TraceStreamer();
  /// Stops after the part being sent; traces not finished are abandoned.
  ~TraceStreamer();
  TraceStreamer(const TraceStreamer&) = delete;
  TraceStreamer& operator=(const TraceStreamer&) = delete;

  /// Whether a trace for `conn` would be taken now (not while it has one waiting, nor while
  /// kMaxQueued do): ask before taking the snapshot, which costs the caller's thread.
  bool Accepts(const std::shared_ptr<net::FramedConnection>& conn);
  /// Queues `snapshot` to be sent to `conn` (after Accepts said yes, on the same thread).
  void Send(std::shared_ptr<net::FramedConnection> conn, TraceSnapshot snapshot);

 private:
  void Loop();
  void Stream(net::FramedConnection& conn, const TraceSnapshot& snapshot);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<std::pair<std::weak_ptr<net::FramedConnection>, TraceSnapshot>> queue_;
  std::thread thread_;
};

}  // namespace copse::jm
