#pragma once
// Journal: the job manager's write-ahead log, so a job manager killed with SIGKILL and
// restarted resumes its jobs. Append-only JSON lines in STATE_DIR/journal.jsonl:
//
//   {"t":"job","job":N,"doc":{…},"job_dir":"…","source":"…"}   a job accepted
//   {"t":"done","job":N,"v":V,"ver":K,"daemon":"d0","bytes":[…],"msgs":[…]}   a vertex completed
//   {"t":"regen","job":N,"v":V}                                  a completed vertex must run again
//   {"t":"end","job":N,"state":"completed","failure":"…"}       a job finished
//   {"t":"ids","job":N}                                          job ids up to N were handed out
//   {"t":"restart","job":0,"n":R}                                the R-th restart resumed the jobs
//                                                                 (attempt versions from R x 10^6 on)
//
// Compaction: at start, and once the file outgrows a threshold with half of it superseded, the
// job manager replaces it with a snapshot of what it knows now (Rewrite): the jobs it still
// remembers, their completed vertices and ends, and the newest job id. Finished jobs it has
// forgotten and superseded completions go.
//
// Records are buffered and written together once per event-loop pass (group commit). They
// reach the kernel at every Flush, which survives a crash of the process; `fsync` also makes
// them survive a crash of the machine, at a latency price. Not thread-safe: the job manager's
// io thread owns it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace copse::jm {

/// Job ids a journal may name: below 2^53, so they stay exact in any JSON reader, far from
/// the invalid id and from wrapping.
inline constexpr uint64_t kMaxJournalJobId = uint64_t{1} << 53;

/// Where the scheduler's journal records go (a fake in tests).
class JournalSink {
 public:
  virtual ~JournalSink() = default;
  virtual void Record(const Json& record) = 0;
};

class Journal final : public JournalSink {
 public:
  /// Opens (creating) the journal in `dir`.
  static Result<std::unique_ptr<Journal>> Open(const std::filesystem::path& dir, bool fsync);
  ~Journal() override;

  /// Every record of an existing journal, in order. A torn last line (a crash mid-write) is
  /// dropped with a warning; a malformed line elsewhere stops the replay there, named in the
  /// returned warnings, never crashing the job manager, and sets `*records_lost`: the lines
  /// after it were not read. Either way the journal must be rewritten before records are
  /// appended to it, or they would follow the damage and be dropped with it next time. The
  /// largest job id the unread lines still name (below kMaxJournalJobId) is returned as a last
  /// `ids` record, so those ids, kept in the damaged copy, are not handed out again.
  static Result<std::vector<Json>> Replay(const std::filesystem::path& dir, std::vector<std::string>* warnings,
                                          bool* records_lost = nullptr);

  /// Copies the journal in `dir` to `journal.jsonl.damaged-<unix time>` beside it, for a person
  /// to look at, when a replay stopped before its end (`records_lost`): the records after the
  /// damage are not restored, and the rewrite that follows drops them. Returns the copy's path.
  static Result<std::filesystem::path> KeepDamagedCopy(const std::filesystem::path& dir);

  void Record(const Json& record) override;
  /// Writes the buffered records.
  Status Flush();

  /// Replaces the journal with `records`, a snapshot that supersedes every record written or
  /// buffered so far (buffered ones are dropped). Written to a temporary file, synced and
  /// renamed over the journal, then the directory is synced: a crash at any point leaves the
  /// old journal or the new one, whole. Later records append to the new file. On an error
  /// before the rename the old journal stays in use, unchanged; when only the directory sync
  /// fails, the new one is in use and the error says so.
  Status Rewrite(const std::vector<Json>& records);
  /// Bytes and records (lines) in the journal file, buffered ones not counted.
  uint64_t bytes() const { return bytes_; }
  uint64_t records() const { return records_; }

 private:
  Journal(std::filesystem::path dir, int fd, bool fsync, uint64_t bytes, uint64_t records)
      : dir_(std::move(dir)), fd_(fd), fsync_(fsync), bytes_(bytes), records_(records) {}
  std::filesystem::path dir_;
  int fd_;
  bool fsync_;
  uint64_t bytes_, records_;
  uint64_t buffered_ = 0;  // records in buffer_
  std::string buffer_;
};

}  // namespace copse::jm
