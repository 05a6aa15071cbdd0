#pragma once
// AttemptLog: what one attempt of a vertex printed — an in-process program's lines through
// VertexContext::log(), an `exec` child's standard error (and standard output, when that is not
// its output 0) — kept bounded on its way to the job manager, which stores it for `copse logs
// JOB VERTEX` (jobmanager/job_history.h keeps it).
//
// Bounded as Kubernetes bounds a container's log, but keeping both ends, since a failure's
// cause is usually near the end and its context near the start: the first kHeadBytes go out as
// they are written (the daemon sends what is new every kFlushInterval, so `copse logs -f`
// follows it); past that only the last kTailBytes are kept, and sent when the attempt ends,
// after a line saying how many bytes were left out between them. Thread-safe: the program's
// threads append while the daemon's io thread takes.
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace copse::vertex {

class AttemptLog {
 public:
  static constexpr size_t kHeadBytes = 256 << 10;
  static constexpr size_t kTailBytes = 256 << 10;
  static constexpr std::chrono::milliseconds kFlushInterval{250};
  /// The stream name of the log's own notes (what was left out).
  static constexpr std::string_view kNoteStream = "copse";

  struct Chunk {
    std::string stream;  // "log" (the program's logger), "stdout", "stderr", or kNoteStream
    std::string text;
  };

  /// Adds `text` written to `stream`. Ignored once Finish() was called.
  void Append(std::string_view stream, std::string_view text);
  /// What is ready to be sent: while it runs, what was appended within the head since the last
  /// Take; after Finish, everything left (the note on what was omitted, then the tail).
  std::vector<Chunk> Take();
  /// Whether Take would return anything now (an attempt that printed nothing: never).
  bool HasPending() const;
  /// The attempt ended: nothing more is appended, and the next Take returns the rest.
  void Finish();
  /// Bytes appended in all, kept or not.
  uint64_t bytes_written() const;

 private:
  static void AppendTo(std::vector<Chunk>& chunks, std::string_view stream, std::string_view text);

  mutable std::mutex mu_;
  bool finished_ = false;
  size_t head_used_ = 0;
  bool past_head_ = false;  // a note says where the head ended
  uint64_t written_ = 0;
  uint64_t omitted_ = 0;
  std::vector<Chunk> pending_;  // within the head, not yet taken
  std::deque<Chunk> tail_;      // past the head: the newest kTailBytes
  size_t tail_bytes_ = 0;
};

}  // namespace copse::vertex
