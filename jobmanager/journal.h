#pragma once
// Journal: the job manager's write-ahead log, so a job manager killed with SIGKILL and
// restarted resumes its jobs. Records (protocol/journal.proto: a job accepted, a vertex done or
// to regenerate, a job ended, ids handed out, a restart) are appended to
// STATE_DIR/journal.bin:
//
//   "copse journal 1\n"                       the format's version, once
//   marker(4) length(4) xxh3(8) body(length)   per record, little-endian: the body is a
//                                              serialized JournalRecord, the checksum its XXH3-64
//
// The marker lets a replay find the records that follow damage (for the ids they name); the
// checksum tells a torn or damaged record from a whole one.
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

#include "common/status.h"
#include "protocol/journal.pb.h"

namespace copse::jm {

/// Where the scheduler's journal records go (a fake in tests).
class JournalSink {
 public:
  virtual ~JournalSink() = default;
  virtual void Record(const protocol::JournalRecord& record) = 0;
};

class Journal final : public JournalSink {
 public:
  /// Opens (creating) the journal in `dir`.
  static Result<std::unique_ptr<Journal>> Open(const std::filesystem::path& dir, bool fsync);
  ~Journal() override;

  /// The journal's file name in the state directory.
  static constexpr const char* kFileName = "journal.bin";

  /// Every record of an existing journal, in order, as parsed (Scheduler::Restore checks them).
  /// A torn last record (a crash mid-write: no whole record follows it) is dropped with a
  /// warning; a damaged record elsewhere stops the replay there, named in the returned warnings,
  /// never crashing the job manager, and sets `*records_lost`: the records after it were not
  /// read. Either way the journal must be rewritten before records are appended to it, or they
  /// would follow the damage and be dropped with it next time. The largest job id the whole
  /// records after the damage name is returned as a last `ids` record, so those ids, kept in the
  /// damaged copy, are not handed out again.
  ///
  /// Errors, refusing to start rather than dropping jobs: a journal of another format version,
  /// and the JSON-lines journal (`journal.jsonl`) of a copse before this format.
  static Result<std::vector<protocol::JournalRecord>> Replay(const std::filesystem::path& dir, std::vector<std::string>* warnings,
                                                             bool* records_lost = nullptr);

  /// Copies the journal in `dir` to `journal.bin.damaged-<unix time>` beside it, for a person
  /// to look at, when a replay stopped before its end (`records_lost`): the records after the
  /// damage are not restored, and the rewrite that follows drops them. Returns the copy's path.
  static Result<std::filesystem::path> KeepDamagedCopy(const std::filesystem::path& dir);

  void Record(const protocol::JournalRecord& record) override;
  /// Writes the buffered records.
  Status Flush();

  /// Replaces the journal with `records`, a snapshot that supersedes every record written or
  /// buffered so far (buffered ones are dropped). Written to a temporary file, synced and
  /// renamed over the journal, then the directory is synced: a crash at any point leaves the
  /// old journal or the new one, whole. Later records append to the new file. On an error
  /// before the rename the old journal stays in use, unchanged; when only the directory sync
  /// fails, the new one is in use and the error says so.
  Status Rewrite(const std::vector<protocol::JournalRecord>& records);
  /// Bytes (the header's included) and records in the journal file, buffered ones not counted.
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
