// Fuzzes a job manager's restart from its journal (jobmanager/journal.h): the input is the
// journal file; it is replayed (torn and damaged lines included), the scheduler restores the
// jobs, vertices and daemons it names, and a daemon the journal names comes back. Then the
// state is compacted the way the job manager compacts it: the snapshot is restored by a second
// scheduler.
// Properties beyond "no crash, no sanitizer report": the replay's count of restored jobs is
// at most its job records; restoring a snapshot gives the same snapshot again (compaction loses
// nothing and invents nothing), the restart counter aside, which every restore advances.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/job_size.h"
#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"

namespace fs = std::filesystem;

namespace {

fs::path g_dir;

class DroppingSink final : public copse::jm::DaemonSink {
 public:
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon&) override {}
};

/// The snapshot's records as text, the restart record left out.
std::vector<std::string> Comparable(const std::vector<copse::Json>& snapshot) {
  std::vector<std::string> out;
  for (const auto& record : snapshot) {
    if (!(record.is_object() && record.contains("t") && record["t"] == "restart")) out.push_back(copse::DumpJson(record));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  g_dir = base / ("copse-fuzz-journal-" + std::to_string(::getpid()));
  fs::create_directories(g_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::ofstream(g_dir / "journal.jsonl", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  std::vector<std::string> warnings;
  bool lost = false;
  auto records = copse::jm::Journal::Replay(g_dir, &warnings, &lost);
  if (!records.ok()) return 0;
  size_t job_records = 0;
  for (const auto& record : *records) {
    if (copse::fuzz::TooLargeToFuzz(record)) return 0;
    // Compared, not read as a string: a record's "t" may be any JSON value.
    job_records += record.is_object() && record.contains("t") && record["t"] == "job";
  }

  const auto catalog = copse::jm::ProgramCatalog::AcceptAny();
  copse::ManualClock clock;
  DroppingSink sink;
  copse::jm::Scheduler restored(sink, clock);
  std::vector<std::string> skipped;
  COPSE_FUZZ_CHECK(restored.Restore(*records, catalog, &skipped) <= job_records);
  const std::vector<copse::Json> snapshot = restored.Snapshot();
  COPSE_FUZZ_CHECK(snapshot.size() == restored.SnapshotRecords());
  for (uint64_t id : restored.JobIds()) (void)restored.JobStatus(copse::JobId(id));
  (void)restored.JobsTable();
  copse::jm::DaemonSpec d0;
  d0.name = "d0";
  d0.cpus = 4;
  (void)restored.AddDaemon(d0, {{1, 0, 1, 0}, {1, 1, 1, 0}, {2, 0, 1, 0}});
  restored.Flush();

  copse::jm::Scheduler compacted(sink, clock);
  compacted.Restore(snapshot, catalog);
  COPSE_FUZZ_CHECK(Comparable(compacted.Snapshot()) == Comparable(snapshot));
  return 0;
}
