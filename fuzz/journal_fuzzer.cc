// Fuzzes a job manager's restart from its journal (jobmanager/journal.h): the input is a mode
// byte and the journal file; it is replayed (torn and damaged records included), the scheduler
// restores the jobs, vertices and daemons it names, and a daemon the journal names comes back.
// Then the state is compacted the way the job manager compacts it: the snapshot is restored by
// a second scheduler.
//
// Mode byte even: each record's checksum is set to match its body before the replay, so that
// mutations reach the records' parsing and the restore rather than stop at the checksum (what a
// bug in the writer, not a torn disk, would feed it). Odd: the file as it is.
// Properties beyond "no crash, no sanitizer report": the replay's count of restored jobs is
// at most its job records; restoring a snapshot gives the same snapshot again (compaction loses
// nothing and invents nothing), the restart counter aside, which every restore advances.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <xxhash.h>

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

/// The snapshot's records serialized, the restart record left out.
std::vector<std::string> Comparable(const std::vector<copse::protocol::JournalRecord>& snapshot) {
  std::vector<std::string> out;
  for (const auto& record : snapshot) {
    if (!record.has_restart()) out.push_back(record.SerializeAsString());
  }
  return out;
}

/// Sets each frame's checksum (journal.h: marker, length, XXH3-64, body) to its body's, walking
/// the frames by their lengths after the header line.
void MatchChecksums(std::string& file) {
  size_t at = file.find('\n');
  if (at == std::string::npos) return;
  for (++at; at + 16 <= file.size();) {
    uint32_t size = 0;
    for (int i = 0; i < 4; ++i) size |= uint32_t{static_cast<unsigned char>(file[at + 4 + i])} << (8 * i);
    if (size > file.size() - at - 16) return;
    const uint64_t sum = XXH3_64bits(file.data() + at + 16, size);
    for (int i = 0; i < 8; ++i) file[at + 8 + i] = static_cast<char>(sum >> (8 * i));
    at += 16 + size;
  }
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
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) MatchChecksums(file);
  std::ofstream(g_dir / copse::jm::Journal::kFileName, std::ios::binary | std::ios::trunc) << file;
  std::vector<std::string> warnings;
  bool lost = false;
  auto records = copse::jm::Journal::Replay(g_dir, &warnings, &lost);
  if (!records.ok()) return 0;
  size_t job_records = 0;
  for (const auto& record : *records) {
    if (!record.has_job()) continue;
    ++job_records;
    if (auto doc = copse::ParseJson(record.job().doc_json(), "doc"); doc.ok() && copse::fuzz::TooLargeToFuzz(*doc)) return 0;
  }

  const auto catalog = copse::jm::ProgramCatalog::AcceptAny();
  copse::ManualClock clock;
  DroppingSink sink;
  copse::jm::Scheduler restored(sink, clock);
  std::vector<std::string> skipped;
  COPSE_FUZZ_CHECK(restored.Restore(*records, catalog, &skipped) <= job_records);
  const auto snapshot = restored.Snapshot();
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
