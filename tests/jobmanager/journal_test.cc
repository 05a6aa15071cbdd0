// The job manager's journal: round trip, a torn last record, corruption in the middle, and a
// scheduler restored from it.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"
#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {

std::filesystem::path TempDir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST_CASE("Journal.RoundTripsAndDropsATornTail") {
  auto dir = TempDir("copse-journal");
  {
    auto j = Journal::Open(dir, false);
    REQUIRE(j.ok());
    (*j)->Record({{"t", "job"}, {"job", 1}});
    (*j)->Record({{"t", "end"}, {"job", 1}, {"state", "completed"}});
    REQUIRE((*j)->Flush().ok());
  }
  std::ofstream(dir / "journal.jsonl", std::ios::app) << R"({"t":"done","job":1,"v)";  // a crash mid-write
  std::vector<std::string> warnings;
  auto records = Journal::Replay(dir, &warnings);
  REQUIRE(records.ok());
  CHECK(records->size() == 2);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("torn last record") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.CorruptionInTheMiddleStopsTheReplayThereWithAWarning") {
  auto dir = TempDir("copse-journal-bad");
  std::ofstream(dir / "journal.jsonl") << "{\"t\":\"job\",\"job\":1}\nGARBAGE\n{\"t\":\"job\",\"job\":2}\n";
  std::vector<std::string> warnings;
  auto records = Journal::Replay(dir, &warnings);
  REQUIRE(records.ok());
  CHECK(records->size() == 1);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(":2: malformed record") != std::string::npos);
  std::filesystem::remove_all(dir);
}

class RecordingJournal final : public JournalSink {
 public:
  void Record(const Json& r) override { records.push_back(r); }
  std::vector<Json> records;
};

class NullSink final : public DaemonSink {
 public:
  void SendToDaemon(DaemonId, const Json& m) override {
    if (m["op"] == "run") runs.push_back(m);
  }
  std::vector<Json> runs;
};

TEST_CASE("Journal.ARestoredSchedulerRerunsOnlyWhatIsNotDone") {
  const char* chain = R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                     {"name": "c", "program": "noop"}],
                          "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})";
  RecordingJournal journal;
  ManualClock clock;
  {
    NullSink sink;
    Scheduler s(sink, clock);
    s.set_journal(&journal);
    DaemonSpec d;
    d.name = "d0";
    REQUIRE(s.AddDaemon(d).ok());
    JobId job = s.Submit(testing::MustLoad(chain), "/tmp");
    s.Flush();
    Json a = sink.runs.back()["tasks"][0];
    AttemptReport r;
    r.job = job;
    r.vertex = VertexId(a["vertex"].get<uint32_t>());
    r.version = a["version"];
    r.ok = true;
    r.output_bytes = {10};
    r.output_messages = {1};
    s.OnAttemptFinished(r);  // a done; b starts, then the job manager "dies"
  }
  CHECK(journal.records.size() == 2);  // the job, a's completion
  NullSink sink;
  Scheduler restored(sink, clock);
  CHECK(restored.Restore(journal.records, testing::TestCatalog()) == 1);
  DaemonSpec d;
  d.name = "d0";
  OutputInventory inventory = {{1, 0, 1, 0}};  // d0 still holds a's output
  REQUIRE(restored.AddDaemon(d, inventory).ok());
  restored.Flush();
  REQUIRE(sink.runs.size() == 1);
  const Json& tasks = sink.runs[0]["tasks"];
  REQUIRE(tasks.size() == 2);  // b, and c chained after it
  CHECK(tasks[0]["name"] == "b[0]");  // a is not re-run
  CHECK(tasks[0]["version"].get<uint32_t>() > 1);
  CHECK(tasks[1]["name"] == "c[0]");
  CHECK(tasks[1]["after"][0]["vertex"] == tasks[0]["vertex"]);
}

}  // namespace
}  // namespace copse::jm
