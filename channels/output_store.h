#pragma once
// OutputStore: a daemon's store of vertex outputs, the producer side of `file` and `memory`
// channels.
//
// Each output is identified by an OutputKey (job, vertex, version, port) and becomes visible
// only when its writer closes: a reader either sees a complete output or nothing.
//
//  * `memory` outputs keep the writer's Buffers (no copy) and an xxh3 checksum per message;
//    local readers get the same Buffers back (zero-copy) after the checksum is verified.
//    Payload messages (objects, buffer.h) are kept and handed back as objects, never encoded
//    or hashed here unless they spill, are fetched remotely, or are corrupted on purpose.
//    Memory is budgeted: a writer reserves its bytes as it writes; when the budget cannot hold
//    the next message the *new* output spills — what it holds so far and everything after goes
//    to a file, and it reads back like a file output. Outputs already stored stay in memory
//    (they are usually being read); the budget covers stored outputs and in-flight writers.
//  * `file` outputs are written to `dir/job<J>/v<V>.<version>.p<P>.<n>.out` (see
//    record_format.h for the layout: a magic, then [u32 len][u64 xxh3][bytes] per message),
//    through a temp name renamed at Close, so a crash never leaves a half output that looks
//    complete. No fsync: a daemon whose machine crashes is lost anyway and its outputs are
//    regenerated. An output with no messages has no file at all.
//  * Reads verify every message's checksum: a mismatch or a missing/truncated file is DataLoss
//    naming the key, which the caller treats like a lost input (re-run the producer).
//
// Memory outputs end with the process. File outputs outlive it: Make() adopts the complete
// output files an earlier process left in `dir` (a daemon restarted on the same work dir), so
// that they are listed again and a job manager that held them for the daemon's return need not
// re-run their vertices. It removes temporary and foreign files, and every output when the
// machine has rebooted since they were written (they were never synced); an output file that
// does not parse (damaged while the daemon was down) is not served but moved to
// `dir/damaged/job<J>/` with a warning naming the file and what is wrong, for a person. What
// is set aside is kept kDamagedKeepDays days, and at most kDamagedMaxBytes of it (the newest):
// a disk that keeps damaging files must not fill up with them.
// Whoever no longer needs an adopted output drops it like any other.
//
// Thread-safety: every method may be called from any thread. Readers and writers are each used
// by one thread at a time; a reader stays valid (and keeps reading the data it opened) after
// the output is dropped, removed or corrupted.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <compare>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "channels/channel.h"
#include "common/json_util.h"
#include "common/status.h"

namespace copse::chan {

/// Identifies one stored output: a port of one execution (version) of a vertex of a job.
struct OutputKey {
  uint64_t job = 0;
  uint32_t vertex = 0;
  uint32_t version = 0;
  uint32_t port = 0;

  /// "job3/v12.v2/p0"
  std::string ToString() const;
  friend auto operator<=>(const OutputKey&, const OutputKey&) = default;
  /// {"job":3,"vertex":12,"version":2,"port":0}
  Json ToJson() const;
  /// InvalidArgument naming the member that is missing or not an unsigned integer in range.
  static Result<OutputKey> FromJson(const Json& j);
};

enum class StorageKind { kFile, kMemory };

/// What the store knows about one complete output.
struct OutputInfo {
  uint64_t bytes = 0;
  uint64_t messages = 0;
  StorageKind requested = StorageKind::kFile;  // the kind it was written as
  bool in_memory = false;                      // false for file outputs and spilled memory ones
};

/// The messages of a memory output, immutable once stored (shared with readers).
struct StoredMessages {
  std::vector<Buffer> messages;
  /// xxh3 of each byte message, computed when it was written. Payload messages (in-process
  /// objects, see buffer.h) have no bytes to protect until they are encoded: 0 here (unless a
  /// durable copy hashed them), and ChecksumOf computes theirs when bytes leave the process.
  std::vector<uint64_t> checksums;
  uint64_t bytes = 0;
  /// The checksum of message i's bytes (encoding a payload message first).
  uint64_t ChecksumOf(size_t i) const;
};

class OutputStore {
 public:
  /// Where damaged output files found at Make are set aside, under `dir`.
  static constexpr const char* kDamagedDir = "damaged";
  static constexpr int kDamagedKeepDays = 7;
  static constexpr uint64_t kDamagedMaxBytes = 1ull << 30;

  /// `dir`: where file outputs (and spilled memory outputs) live; created if absent.
  /// `memory_budget_bytes`: the most bytes memory outputs (stored and being written) may hold;
  /// a memory output that does not fit spills to disk (see above).
  static Result<std::unique_ptr<OutputStore>> Make(std::filesystem::path dir, uint64_t memory_budget_bytes);
  ~OutputStore();
  OutputStore(const OutputStore&) = delete;
  OutputStore& operator=(const OutputStore&) = delete;

  /// A writer for a new output. Data becomes readable only after Close(); an output whose
  /// writer is destroyed without Close is discarded. AlreadyExists if the key is already
  /// complete (checked again at Close, where a second writer of the same key loses).
  /// `durable_copy` (memory outputs only): also write every message to that file (same layout
  /// as a file output, through a temp name renamed at Close, parent directories created). The
  /// store never deletes it: it outlives this process, for readers on any daemon
  /// (OpenDurableCopy), and whoever named it removes it.
  Result<std::unique_ptr<ChannelWriter>> CreateWriter(const OutputKey& key, StorageKind kind,
                                                      std::filesystem::path durable_copy = {});
  /// A reader of the durable copy `file` of output `key`, written by any store; DataLoss or
  /// IOError (naming the key and the file) when it is gone or fails a checksum.
  static Result<std::unique_ptr<ChannelReader>> OpenDurableCopy(const std::filesystem::path& file, const OutputKey& key);
  /// A reader of an output file already open as `fd` (ownership taken), positioned at its
  /// start: a file output handed over by a daemon on the same host (data_server.h). DataLoss
  /// when it is not a regular file.
  static Result<std::unique_ptr<ChannelReader>> OpenOutputFile(int fd, std::string what);
  /// `primary` (a reader of output `key` from a store), continued from the durable copy `copy`
  /// should it fail part-way (a damaged message, a lost connection).
  static std::unique_ptr<ChannelReader> WithDurableFallback(std::unique_ptr<ChannelReader> primary,
                                                            const std::filesystem::path& copy, const OutputKey& key);
  /// A reader of a complete local output. NotFound when absent or incomplete; DataLoss when a
  /// message fails its checksum or the file is gone.
  Result<std::unique_ptr<ChannelReader>> OpenReader(const OutputKey& key);
  /// Bytes of a complete output; NotFound when absent.
  Result<uint64_t> Size(const OutputKey& key) const;
  /// Bytes, messages and storage of a complete output; NotFound when absent.
  Result<OutputInfo> Info(const OutputKey& key) const;
  bool Contains(const OutputKey& key) const;
  /// Waits until `key` is complete here, or was removed by Remove (a fault), or `timeout`
  /// passes; false only in the last case. For a consumer that asks for an output before its
  /// producer has finished (chained dispatch): a removed output will not come.
  bool WaitFor(const OutputKey& key, std::chrono::milliseconds timeout) const;
  /// Every complete output of `job` (all jobs when nullopt), in key order.
  std::vector<OutputKey> List(std::optional<uint64_t> job = std::nullopt) const;

  /// Garbage collection: forget an output / every output of a job (files deleted).
  void Drop(const OutputKey& key);
  void DropJob(uint64_t job);

  /// Fault injection: damages a stored output so its next read fails with DataLoss (bytes of
  /// one message are flipped and its checksum kept; an output without bytes is marked damaged).
  Status Corrupt(const OutputKey& key);
  /// Fault injection: deletes an output (NotFound when absent).
  Status Remove(const OutputKey& key);

  /// Bytes memory outputs hold now (stored ones and in-flight writers' reservations).
  uint64_t memory_bytes() const { return memory_bytes_.load(std::memory_order_relaxed); }
  uint64_t memory_budget_bytes() const { return memory_budget_; }
  /// Memory outputs that spilled to disk over the budget, and the bytes they held then.
  uint64_t spills() const { return spills_.load(std::memory_order_relaxed); }
  uint64_t spilled_bytes() const { return spilled_bytes_.load(std::memory_order_relaxed); }
  const std::filesystem::path& dir() const { return dir_; }

  /// Whether local reads of memory outputs verify checksums (default true). Turning it off
  /// makes memory reads pure pointer copies, at the price of not noticing corruption.
  void set_verify_memory_reads(bool verify) { verify_memory_reads_ = verify; }

  // ---- for the data server: the stored form of an output, to stream it without a reader --
  struct Stored {
    OutputKey key;
    OutputInfo info;
    std::shared_ptr<const StoredMessages> memory;  // set for in-memory outputs
    std::filesystem::path file;                    // set for file outputs with messages
    bool damaged = false;                          // an empty output marked by Corrupt
  };
  /// NotFound when absent.
  Result<Stored> Lookup(const OutputKey& key) const;

 private:
  class MemoryWriter;
  friend class FileSink;
  class FileWriter;
  struct Entry;

  OutputStore(std::filesystem::path dir, uint64_t budget);
  /// At Make: stores the complete output files found in `dir_`, sets damaged ones aside and
  /// removes the rest (see above).
  void AdoptEarlierOutputs();
  /// At Make, after AdoptEarlierOutputs: removes what was set aside longer than
  /// kDamagedKeepDays ago, then the oldest until at most kDamagedMaxBytes are left.
  void PruneDamaged();
  bool TryReserve(uint64_t bytes);
  void Release(uint64_t bytes);
  std::filesystem::path JobDir(uint64_t job) const;
  /// A fresh path in the job's directory (created if needed) for a new file output.
  Result<std::filesystem::path> NewFilePath(const OutputKey& key);
  /// Publishes a complete output; AlreadyExists when the key is taken.
  Status Publish(const OutputKey& key, std::shared_ptr<const Entry> entry);
  /// Removes the entry (releasing memory); returns it so files can be deleted outside the lock.
  std::shared_ptr<const Entry> Unlink(const OutputKey& key);
  void Forget(const std::shared_ptr<const Entry>& entry);

  const std::filesystem::path dir_;
  const uint64_t memory_budget_;
  std::atomic<uint64_t> memory_bytes_{0};
  std::atomic<uint64_t> spills_{0}, spilled_bytes_{0};
  std::atomic<uint64_t> next_file_id_{0};
  std::atomic<bool> verify_memory_reads_{true};
  mutable std::mutex mu_;
  /// Those waiting in WaitFor, by key: Publish and Remove wake only the waiters of their key
  /// (one condition for all woke every waiting data server thread at each publish).
  struct Waiters {
    std::condition_variable cv;
    int count = 0;
  };
  mutable std::map<OutputKey, Waiters> waiting_;               // guarded by mu_; erased by its last waiter
  void WakeWaitersOf(const OutputKey& key);                    // requires mu_
  std::map<OutputKey, std::shared_ptr<const Entry>> entries_;  // guarded by mu_
  std::set<OutputKey> removed_;                                // by Remove, until their job is dropped; guarded by mu_
};

/// One stored message with the checksum it was written with.
struct Record {
  Buffer bytes;
  uint64_t checksum = 0;
};

/// Reads the records of an output file in order, through a buffer of the file's size up to 1 MiB
/// (large messages are read straight into their own storage): a small output costs a small
/// allocation, not a zeroed megabyte. `verify`: check each checksum (DataLoss on mismatch);
/// the data server forwards records unverified and the fetching reader verifies them.
/// `what` names the output in errors. Not thread-safe.
class FileRecordReader {
 public:
  static Result<std::unique_ptr<FileRecordReader>> Open(const std::filesystem::path& file, std::string what, bool verify);
  /// The same over a descriptor open at the file's start (ownership taken, closed on failure).
  static Result<std::unique_ptr<FileRecordReader>> Open(int fd, std::string what, bool verify);
  ~FileRecordReader();
  /// The next record, nullopt at the end; DataLoss on a bad checksum or a truncated file.
  Result<std::optional<Record>> Next();

 private:
  FileRecordReader(int fd, std::string what, bool verify, size_t buffer_bytes);
  Status Fill(size_t need);
  int fd_;
  std::string what_;
  bool verify_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  uint64_t file_bytes_ = 0;  // the file's size when it is a regular file, else 0 (not known)
  uint64_t read_bytes_ = 0;  // read from fd_ so far
  uint64_t index_ = 0;
  bool eof_ = false;
};

}  // namespace copse::chan
