// The job manager's journal: round trip, a torn last record, corruption in the middle, a
// scheduler restored from it, and compaction to a snapshot.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include <algorithm>

#include "jobmanager/client_api.h"
#include "jobmanager/job_history.h"
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
  bool records_lost = true;
  auto records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  CHECK(records->size() == 2);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("torn last record") != std::string::npos);
  CHECK_FALSE(records_lost);  // only the record being written
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.CorruptionInTheMiddleStopsTheReplayThereWithAWarning") {
  auto dir = TempDir("copse-journal-bad");
  std::ofstream(dir / "journal.jsonl") << "{\"t\":\"job\",\"job\":1}\nGARBAGE\n{\"t\":\"job\",\"job\":7}\n"
                                       // 99 and 98 are in the user's job document, not ids:
                                       << "{\"doc\":{\"job\":99,\"p\":[{\"job\":98}]},\"job\":5,\"t\":\"job\"}\n"
                                       << "{\"t\":\"end\",\"job\":3,\"sta\n"
                                       << "{\"t\":\"ids\",\"job\":9007199254740993}\n";  // past 2^53: not an id
  std::vector<std::string> warnings;
  bool records_lost = false;
  auto records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK((*records)[0]["job"] == 1);
  // Job 7's record was not read, but its id stays handed out: the damaged copy holds it.
  CHECK((*records)[1] == Json{{"t", "ids"}, {"job", 7}});
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0].find(":2: malformed record") != std::string::npos);
  CHECK(warnings[1].find("job ids up to 7 appear from there on") != std::string::npos);
  CHECK(records_lost);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.RewriteReplacesTheJournalAndLaterRecordsAppendToTheSnapshot") {
  auto dir = TempDir("copse-journal-rewrite");
  auto j = Journal::Open(dir, false);
  REQUIRE(j.ok());
  for (int v = 0; v < 50; ++v) (*j)->Record({{"t", "done"}, {"job", 1}, {"v", v}});
  REQUIRE((*j)->Flush().ok());
  const uint64_t before = (*j)->bytes();
  CHECK(before == std::filesystem::file_size(dir / "journal.jsonl"));
  CHECK((*j)->records() == 50);
  (*j)->Record({{"t", "done"}, {"job", 1}, {"v", 99}});  // buffered: the snapshot supersedes it
  REQUIRE((*j)->Rewrite({{{"t", "job"}, {"job", 1}}, {{"t", "ids"}, {"job", 1}}}).ok());
  CHECK((*j)->bytes() < before);
  CHECK((*j)->bytes() == std::filesystem::file_size(dir / "journal.jsonl"));
  CHECK((*j)->records() == 2);
  CHECK_FALSE(std::filesystem::exists(dir / "journal.jsonl.tmp"));
  (*j)->Record({{"t", "end"}, {"job", 1}, {"state", "completed"}});
  REQUIRE((*j)->Flush().ok());
  CHECK(Journal::Open(dir, false).value()->records() == 3);  // counted again on opening
  auto records = Journal::Replay(dir, nullptr);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 3);
  CHECK((*records)[0]["t"] == "job");
  CHECK((*records)[1]["t"] == "ids");
  CHECK((*records)[2]["t"] == "end");
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.AFailedRewriteKeepsTheOldJournalInUse") {
  auto dir = TempDir("copse-journal-rewrite-fails");
  auto j = Journal::Open(dir, false);
  REQUIRE(j.ok());
  (*j)->Record({{"t", "job"}, {"job", 1}});
  REQUIRE((*j)->Flush().ok());
  std::filesystem::create_directory(dir / "journal.jsonl.tmp");  // the temporary file cannot be created
  CHECK_FALSE((*j)->Rewrite({{{"t", "ids"}, {"job", 1}}}).ok());
  (*j)->Record({{"t", "end"}, {"job", 1}, {"state", "completed"}});
  REQUIRE((*j)->Flush().ok());
  auto records = Journal::Replay(dir, nullptr);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK((*records)[0]["t"] == "job");
  CHECK((*records)[1]["t"] == "end");
  std::filesystem::remove_all(dir);
}

class RecordingJournal final : public JournalSink {
 public:
  void Record(const Json& r) override { records.push_back(r); }
  std::vector<Json> records;
};

class NullSink final : public DaemonSink {
 public:
  void SendToDaemon(DaemonId, const protocol::JmToDaemon& m) override {
    if (m.has_run()) runs.push_back(m.run());
  }
  std::vector<protocol::Run> runs;
};

const char* const kChain = R"({"stages": [{"name": "a", "program": "noop"}, {"name": "b", "program": "noop"},
                                            {"name": "c", "program": "noop"}],
                                 "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})";

DaemonSpec D0() {
  DaemonSpec d;
  d.name = "d0";
  return d;
}

/// Reports `task`, from a run message, as succeeded with one 10-byte message.
void Succeed(Scheduler& s, JobId job, const protocol::Task& task) {
  AttemptReport r;
  r.job = job;
  r.vertex = VertexId(task.vertex());
  r.version = task.version();
  r.ok = true;
  r.output_bytes = {10};
  r.output_messages = {1};
  s.OnAttemptFinished(r);
}

/// The journal of a job manager that ran kChain on d0 until a completed, then "died" as b
/// started.
std::vector<Json> JournalOfAChainWhoseFirstVertexIsDone(ManualClock& clock) {
  RecordingJournal journal;
  NullSink sink;
  Scheduler s(sink, clock);
  s.set_journal(&journal);
  REQUIRE(s.AddDaemon(D0()).ok());
  JobId job = s.Submit(testing::MustLoad(kChain), "/tmp");
  s.Flush();
  Succeed(s, job, sink.runs.back().tasks(0));
  return journal.records;
}

TEST_CASE("Journal.ARestoredSchedulerRerunsOnlyWhatIsNotDone") {
  ManualClock clock;
  const std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  CHECK(records.size() == 2);  // the job, a's completion
  NullSink sink;
  Scheduler restored(sink, clock);
  CHECK(restored.Restore(records, testing::TestCatalog()) == 1);
  OutputInventory inventory = {{1, 0, 1, 0}};  // d0 still holds a's output
  REQUIRE(restored.AddDaemon(D0(), inventory).ok());
  restored.Flush();
  REQUIRE(sink.runs.size() == 1);
  const auto& tasks = sink.runs[0].tasks();
  REQUIRE(tasks.size() == 2);        // b, and c chained after it
  CHECK(tasks[0].name() == "b[0]");  // a is not re-run
  CHECK(tasks[0].version() > 1);
  CHECK(tasks[1].name() == "c[0]");
  CHECK(tasks[1].after(0).vertex() == tasks[0].vertex());
}

TEST_CASE("Journal.EachRestartHandsOutVersionsNoEarlierLifeCouldHave") {
  // Two restarts in a row, the first dying before it journaled anything of what it ran: the
  // second must not hand out the versions the first did (a daemon still knows those attempts:
  // their outputs, and their ends, after which it withdraws tasks chained behind a failed one).
  ManualClock clock;
  std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  std::vector<uint32_t> first_versions;
  for (int life = 0; life < 2; ++life) {
    RecordingJournal journal;
    NullSink sink;
    Scheduler restored(sink, clock);
    restored.set_journal(&journal);
    REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
    // What the job manager journals once it has a journal again (jm_server.cc).
    journal.Record(restored.RestartRecord());
    REQUIRE(restored.AddDaemon(D0(), {{1, 0, 1, 0}}).ok());
    restored.Flush();
    REQUIRE(sink.runs.size() == 1);
    std::vector<uint32_t> versions;
    for (const auto& t : sink.runs[0].tasks()) versions.push_back(t.version());
    if (life == 0) {
      first_versions = versions;
      CHECK(versions[0] > 1'000'000);
    } else {
      for (size_t i = 0; i < versions.size(); ++i) CHECK(versions[i] > first_versions[i] + 500'000);
    }
    // The next life reads what this one journaled (the restart record among it), and compacts
    // to a snapshot that keeps it.
    records.insert(records.end(), journal.records.begin(), journal.records.end());
    const auto snapshot = restored.Snapshot();
    CHECK(std::count_if(snapshot.begin(), snapshot.end(), [](const Json& r) { return r["t"] == "restart"; }) == 1);
    CHECK(restored.SnapshotRecords() == snapshot.size());
  }
}

TEST_CASE("Journal.ARestoredJobKeepsItsProgressSeries") {
  ManualClock clock;
  NullSink sink;
  Scheduler restored(sink, clock);
  REQUIRE(restored.Restore(JournalOfAChainWhoseFirstVertexIsDone(clock), testing::TestCatalog()) == 1);
  restored.RestoreHistory(JobId(1), {}, {}, {{{"elapsed_s", 0.5}, {"step", 1}, {"loss", 2.0}}});
  const Json series = restored.ProgressSeries(JobId(1));
  REQUIRE(series.size() == 1);
  CHECK(series[0]["loss"] == 2.0);
}

TEST_CASE("Journal.ARestoredJobsElapsedTimeCountsFromItsSubmissionOnTheWallClock") {
  // The injected clock's wall time, not the host's: a job restored 5 s after its submission
  // shows 5 s elapsed, whatever the monotonic clock of the new job manager reads.
  ManualClock clock;
  const std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  REQUIRE(records[0].value("submitted_unix_ms", int64_t{0}) == clock.UnixMs());
  ManualClock later;
  later.Advance(std::chrono::seconds(5));
  NullSink sink;
  Scheduler restored(sink, later);
  REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
  const Json status = restored.JobStatus(JobId(1));
  CHECK(status["elapsed_s"].get<double>() == doctest::Approx(5.0));
  CHECK(restored.JobsTable()[0]["submitted_unix_ms"] == clock.UnixMs());
}

TEST_CASE("Journal.ADoneRecordDamagedHalfWayLeavesItsVertexToRunAgain") {
  // Byte flips that rename one key of a "done" record: the vertex was marked completed before
  // the missing field threw, with no daemon, and the snapshot at the next start crashed.
  ManualClock clock;
  for (const char* key : {"ver", "daemon", "bytes", "msgs"}) {
    std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
    REQUIRE(records[1]["t"] == "done");
    records[1][std::string(key) + "]"] = records[1][key];
    records[1].erase(key);
    NullSink sink;
    Scheduler restored(sink, clock);
    CHECK(restored.Restore(records, testing::TestCatalog()) == 1);
    CHECK(restored.Snapshot().size() == 3);  // the job, the ids and the restart, no completion
    REQUIRE(restored.AddDaemon(D0()).ok());
    restored.Flush();
    REQUIRE(sink.runs.size() == 1);
    CHECK_MESSAGE(sink.runs[0].tasks(0).name() == "a[0]", key);  // runs again
  }
  std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  records[1]["ver"] = -1;  // not an attempt version
  NullSink sink;
  Scheduler restored(sink, clock);
  restored.Restore(records, testing::TestCatalog());
  CHECK(restored.Snapshot().size() == 3);
}

TEST_CASE("Journal.NumbersOutOfTheirRangeSkipTheirRecordNamingTheMember") {
  // Found by the journal fuzzer: a job id of 1e108 went through get<uint64_t>(), a float to
  // integer conversion beyond the type's range (undefined behaviour); a negative byte count
  // wrapped into a huge one. Each is now refused, and the record skipped saying which member.
  ManualClock clock;
  struct Case {
    size_t record;
    const char* key;
    Json value;
  };
  for (const Case& c : {Case{0, "job", 1e108}, Case{0, "job", -3}, Case{1, "v", 4294967296.0}, Case{1, "v", 1.5},
                        Case{1, "bytes", Json::array({-1})}, Case{1, "msgs", Json::array({1e300})}}) {
    CAPTURE(c.key);
    std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
    records[c.record][c.key] = c.value;
    NullSink sink;
    Scheduler restored(sink, clock);
    std::vector<std::string> skipped;
    restored.Restore(records, testing::TestCatalog(), &skipped);
    REQUIRE(skipped.size() >= 1);
    CHECK(skipped[0].find(std::string("\"") + c.key + "\"") != std::string::npos);
  }
}

TEST_CASE("Journal.AnOutputOnADaemonThatNeverCameBackRunsAgainOnceAConsumerNeedsIt") {
  // a (memory) -> b (file) -> c, a done on dB, b on dA, c running on dC when the job manager
  // dies with dA and dB; only dC comes back. b must run again (c needs its file), and so must
  // a: a restore does not know a's output was released, so it looked held on dB, and b was sent
  // with its input located at a daemon that never registered with this job manager (no
  // address): every daemon refused the task and the job failed. Found by the multi-host soak.
  ManualClock clock;
  RecordingJournal journal;
  NullSink sink;
  DaemonSpec db, da, dc;
  db.name = "dB", db.cpus = 1, da.name = "dA", da.cpus = 2, dc.name = "dC", dc.cpus = 3;
  for (DaemonSpec* d : {&db, &da, &dc}) d->data_host = "127.0.0.1", d->data_port = 9000;
  {
    Scheduler s(sink, clock);
    s.set_journal(&journal);
    REQUIRE(s.AddDaemon(db).ok());
    const JobId job = s.Submit(testing::MustLoad(R"({"stages": [{"name": "a", "program": "noop"},
        {"name": "b", "program": "noop", "resources": {"cpus": 2}},
        {"name": "c", "program": "noop", "resources": {"cpus": 3}}],
      "edges": [{"from": "a", "to": "b", "channel": "memory"}, {"from": "b", "to": "c", "channel": "file"}]})"),
                               "/tmp");
    auto run_next = [&](DaemonSpec* joining, bool finish) {
      if (joining) REQUIRE(s.AddDaemon(*joining).ok());
      clock.Advance(std::chrono::seconds(5));  // past any wait for the daemon holding the inputs
      s.Tick();
      s.Flush();
      REQUIRE(!sink.runs.empty());
      const protocol::Task task = sink.runs.back().tasks(0);
      if (finish) Succeed(s, job, task);
    };
    run_next(nullptr, true);  // a on dB
    run_next(&da, true);      // b on dA
    run_next(&dc, false);     // c on dC, running
  }
  Scheduler restored(sink, clock);
  REQUIRE(restored.Restore(journal.records, testing::TestCatalog()) == 1);
  REQUIRE(restored.AddDaemon(dc).ok());
  restored.StartRecoveryGrace();
  clock.Advance(std::chrono::seconds(10));  // dA and dB never come back
  restored.Tick();
  restored.Flush();
  auto state_of = [&](const std::string& stage) {
    Scheduler::VertexFilter f;
    f.stage = stage;
    return restored.VertexPage(JobId(1), f)["vertices"][0]["state"].get<std::string>();
  };
  CHECK(state_of("b") != "completed");
  CHECK(state_of("a") != "completed");
  CHECK(restored.StateOf(JobId(1)) == JobState::kRunning);
}

/// Reports every task sent so far, and every one sent meanwhile, as succeeded.
void CompleteRuns(Scheduler& s, NullSink& sink, JobId job) {
  for (size_t seen = 0; seen < sink.runs.size();) {
    const protocol::Run run = sink.runs[seen++];
    for (const protocol::Task& t : run.tasks()) Succeed(s, job, t);
    s.Flush();
  }
}

/// A scheduler that journals to memory, with daemon d0 registered.
struct JournaledScheduler {
  JournaledScheduler() {
    s.set_journal(&journal);
    REQUIRE(s.AddDaemon(D0()).ok());
  }
  ManualClock clock;
  RecordingJournal journal;
  NullSink sink;
  Scheduler s{sink, clock};
};

TEST_CASE("Journal.AFinishedJobKeepsItsElapsedTimeAcrossARestart") {
  // The restored job manager's clock starts anew: without the journal's figure a job that ran
  // for 5 s was shown as having taken none.
  JournaledScheduler old;
  JobId job = old.s.Submit(testing::MustLoad(kChain), "/tmp");
  old.s.Flush();
  old.clock.Advance(std::chrono::seconds(5));
  CompleteRuns(old.s, old.sink, job);
  REQUIRE(old.s.StateOf(job) == JobState::kCompleted);
  for (const auto& records : {old.journal.records, old.s.Snapshot()}) {  // as written, and as compacted
    ManualClock later;
    later.Advance(std::chrono::hours(1));
    NullSink other;
    Scheduler restored(other, later);
    REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
    CHECK(restored.JobStatus(job)["elapsed_s"].get<double>() == doctest::Approx(5.0));
  }
}

TEST_CASE("Journal.ADaemonBackAfterTheRecoveryGraceStillServesACompletedJobsOutputs") {
  // A daemon that reaches a restarted job manager only after its recovery grace is a new
  // registration of its name: the finished job's declared output it holds stays its, where
  // before it was released as stale and the completed job's output was gone.
  JournaledScheduler old;
  const std::string doc = R"({"stages": [{"name": "a", "program": "noop"}], "outputs": [{"from": "a", "path": "out"}]})";
  JobId job = old.s.Submit(testing::MustLoad(doc), "/tmp");
  old.s.Flush();
  CompleteRuns(old.s, old.sink, job);
  REQUIRE(old.s.StateOf(job) == JobState::kCompleted);
  ManualClock clock;
  std::vector<protocol::Release> released;
  class ReleaseSink final : public DaemonSink {
   public:
    explicit ReleaseSink(std::vector<protocol::Release>& out) : out_(out) {}
    void SendToDaemon(DaemonId, const protocol::JmToDaemon& m) override {
      if (m.has_release()) out_.push_back(m.release());
    }
    std::vector<protocol::Release>& out_;
  } releases(released);
  Scheduler restored(releases, clock);
  REQUIRE(restored.Restore(old.journal.records, testing::TestCatalog()) == 1);
  restored.StartRecoveryGrace();
  clock.Advance(SchedulerOptions().recovery_grace + std::chrono::seconds(1));
  restored.Tick();
  DaemonSpec d0 = D0();
  d0.data_port = 9100;
  REQUIRE(restored.AddDaemon(d0, {{job.value(), 0, 1, 0}}).ok());
  restored.Tick();
  restored.Flush();
  CHECK(released.empty());
  auto outputs = restored.OutputLocations(job);
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["port"] == 9100);
  CHECK((*outputs)[0]["alive"] == true);
}

TEST_CASE("Journal.AFinishedJobKeepsItsFaultsAndRecoveriesAcrossARestart") {
  JournaledScheduler old;
  std::string doc = R"({"stages": [{"name": "a", "program": "noop"}], "faults": [{"fail": "a", "attempts": [1]}]})";
  JobId job = old.s.Submit(testing::MustLoad(doc), "/tmp");
  old.s.Flush();
  CompleteRuns(old.s, old.sink, job);  // the fault was injected into attempt 1's task (the test reports success)
  REQUIRE(old.s.StateOf(job) == JobState::kCompleted);
  ManualClock& clock = old.clock;
  std::vector<Json> records = old.s.Snapshot();
  Json& end = records[records.size() - 2];
  REQUIRE(end["t"] == "end");
  CHECK(end["faults"].size() == 1);
  end["recoveries"] = Json::array({{{"vertex", "a[0]"},
                                    {"failed_version", 1},
                                    {"reason", "program_error"},
                                    {"detail", "re-run"},
                                    {"charged", true},
                                    {"at_ms", 1.0}},
                                   {{"vertex", 7}}});  // damaged: not of the shape shown, dropped
  NullSink other;
  Scheduler restored(other, clock);
  REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
  const Json status = restored.JobStatus(job);
  REQUIRE(status["faults"].size() == 1);
  CHECK(status["faults"][0]["source"] == "/faults/0");
  CHECK(status["recoveries"].size() == 1);
  CHECK_FALSE(status.contains("faults_not_fired"));

  // The list of faults cut short (or damaged): which fired comes from faults_fired, whole.
  end["faults"] = Json::array({{{"fault", "fail"}, {"at_ms", 1.0}, {"source", 5}}});  // damaged: dropped
  Scheduler cut(other, clock);
  REQUIRE(cut.Restore(records, testing::TestCatalog()) == 1);
  CHECK(cut.JobStatus(job)["faults"].empty());
  CHECK_FALSE(cut.JobStatus(job).contains("faults_not_fired"));

  // A journal from before faults_fired: which fired is not known, so none is said not to have.
  end.erase("faults_fired");
  Scheduler older(other, clock);
  REQUIRE(older.Restore(records, testing::TestCatalog()) == 1);
  CHECK_FALSE(older.JobStatus(job).contains("faults_not_fired"));
}

TEST_CASE("Journal.AJobRestoredWhileRunningDoesNotClaimItsFaultsNeverFired") {
  // Which of a running job's faults had fired is not journaled: after the restart none can be
  // said never to have fired.
  JournaledScheduler old;
  JobId job = old.s.Submit(testing::MustLoad(R"({"stages": [{"name": "a", "program": "noop"}],
                                                 "faults": [{"kill_daemon": "d9"}]})"),
                           "/tmp");
  old.s.Flush();
  ManualClock& clock = old.clock;
  NullSink other;
  Scheduler restored(other, clock);
  REQUIRE(restored.Restore(old.journal.records, testing::TestCatalog()) == 1);
  REQUIRE(restored.AddDaemon(D0()).ok());
  restored.Flush();
  CompleteRuns(restored, other, job);
  REQUIRE(restored.StateOf(job) == JobState::kCompleted);
  CHECK_FALSE(restored.JobStatus(job).contains("faults_not_fired"));
  // Nor after the next restart, from its end record.
  NullSink third_sink;
  Scheduler third(third_sink, clock);
  REQUIRE(third.Restore(restored.Snapshot(), testing::TestCatalog()) == 1);
  CHECK_FALSE(third.JobStatus(job).contains("faults_not_fired"));
}

TEST_CASE("Journal.ASnapshotRestoresWhatTheWholeJournalDoesWithoutForgottenJobs") {
  RecordingJournal journal;
  ManualClock clock;
  SchedulerOptions options;
  options.finished_job_ttl = std::chrono::minutes(1);
  std::vector<Json> snapshot;
  JobId running;
  {
    NullSink sink;
    Scheduler s(sink, clock, options);
    s.set_journal(&journal);
    REQUIRE(s.AddDaemon(D0()).ok());
    JobId forgotten = s.Submit(testing::MustLoad(kChain), "/tmp");  // completes, then is forgotten
    s.Flush();
    CompleteRuns(s, sink, forgotten);
    REQUIRE(s.StateOf(forgotten) == JobState::kCompleted);
    clock.Advance(std::chrono::minutes(2));
    s.Tick();
    REQUIRE_FALSE(s.HasJob(forgotten));
    sink.runs.clear();
    JobId finished = s.Submit(testing::MustLoad(kChain), "/tmp");  // completes, still remembered
    s.Flush();
    CompleteRuns(s, sink, finished);
    REQUIRE(s.StateOf(finished) == JobState::kCompleted);
    sink.runs.clear();
    running = s.Submit(testing::MustLoad(kChain), "/tmp/run");
    s.Flush();
    Succeed(s, running, sink.runs.back().tasks(0));  // a done; b starts, then the job manager "dies"
    snapshot = s.Snapshot();
    CHECK(s.SnapshotRecords() == snapshot.size());  // counted without building, the same
  }
  // The snapshot: the finished job (submission and end: it declares no output, the only
  // vertices a completed job's snapshot names), the running one (submission, a) and the newest
  // id; none of the forgotten job's 5 records.
  CHECK(journal.records.size() == 5 + 5 + 2);
  REQUIRE(snapshot.size() == 2 + 2 + 1);
  CHECK(snapshot.back() == Json{{"t", "ids"}, {"job", running.value()}});
  for (const Json& rec : snapshot) CHECK(rec["job"].get<uint64_t>() != 1);

  NullSink sink;
  Scheduler restored(sink, clock, options);
  CHECK(restored.Restore(snapshot, testing::TestCatalog()) == 2);
  CHECK(restored.StateOf(JobId(2)) == JobState::kCompleted);
  CHECK(restored.JobStatus(JobId(2))["vertices"]["completed"] == 3);
  OutputInventory inventory = {{running.value(), 0, 1, 0}};  // d0 still holds a's output
  REQUIRE(restored.AddDaemon(D0(), inventory).ok());
  restored.Flush();
  REQUIRE(sink.runs.size() == 1);
  CHECK(sink.runs[0].tasks(0).name() == "b[0]");  // a is not re-run
  CHECK(sink.runs[0].tasks(0).job_dir() == "/tmp/run");
}

TEST_CASE("Journal.ACompletedJobSnapshotsOnlyWhereItsDeclaredOutputsAre") {
  // A million-vertex job's snapshot was a "done" record per vertex (77 MB, an 11 s restart):
  // once it completed, only its declared outputs' places count.
  const char* doc = R"({"stages": [{"name": "a", "program": "noop", "replicas": 50}, {"name": "c", "program": "noop"}],
                        "edges": [{"from": "a", "to": "c", "pattern": "gather"}],
                        "outputs": [{"from": "c", "path": "out"}]})";
  ManualClock clock;
  std::vector<Json> snapshot;
  {
    NullSink sink;
    Scheduler s(sink, clock);
    REQUIRE(s.AddDaemon(D0()).ok());
    const JobId job = s.Submit(testing::MustLoad(doc), "/tmp");
    s.Flush();
    CompleteRuns(s, sink, job);
    REQUIRE(s.StateOf(job) == JobState::kCompleted);
    snapshot = s.Snapshot();
    CHECK(s.SnapshotRecords() == snapshot.size());
  }
  REQUIRE(snapshot.size() == 4);  // the job, c's "done", its end, the ids
  CHECK(snapshot[1]["t"] == "done");
  CHECK(snapshot[1]["v"] == 50);
  NullSink sink;
  Scheduler restored(sink, clock);
  REQUIRE(restored.Restore(snapshot, testing::TestCatalog()) == 1);
  CHECK(restored.StateOf(JobId(1)) == JobState::kCompleted);
  CHECK(restored.JobStatus(JobId(1))["vertices"]["completed"] == 51);
  const uint32_t version = snapshot[1]["ver"].get<uint32_t>();
  REQUIRE(restored.AddDaemon(D0(), {{1, 50, version, 0}}).ok());
  auto outputs = restored.OutputLocations(JobId(1));
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["alive"] == true);
  CHECK(restored.Snapshot().size() == 5);  // the same, and the restart
}

TEST_CASE("Journal.JobIdsGoOnAfterASnapshotOfAManagerThatForgotEveryJob") {
  const char* one = R"({"stages": [{"name": "a", "program": "noop"}]})";
  ManualClock clock;
  SchedulerOptions options;
  options.finished_job_ttl = std::chrono::minutes(1);
  std::vector<Json> snapshot;
  {
    NullSink sink;
    Scheduler s(sink, clock, options);
    REQUIRE(s.AddDaemon(D0()).ok());
    for (int i = 0; i < 2; ++i) {
      JobId job = s.Submit(testing::MustLoad(one), "/tmp");
      REQUIRE(s.Cancel(job).ok());
    }
    clock.Advance(std::chrono::minutes(2));
    s.Tick();
    snapshot = s.Snapshot();
    CHECK(s.SnapshotRecords() == snapshot.size());  // counted without building, the same
  }
  REQUIRE(snapshot.size() == 1);
  CHECK(snapshot[0] == Json{{"t", "ids"}, {"job", 2}});
  NullSink sink;
  Scheduler restored(sink, clock, options);
  CHECK(restored.Restore(snapshot, testing::TestCatalog()) == 0);
  CHECK(restored.Submit(testing::MustLoad(one), "/tmp") == JobId(3));  // never 1 again
}

TEST_CASE("Journal.AJobIdOutOfRangeIsSkippedAndIdsDoNotWrap") {
  const char* one = R"({"stages": [{"name": "a", "program": "noop"}]})";
  ManualClock clock;
  NullSink sink;
  Scheduler s(sink, clock);
  const std::vector<Json> records = {{{"t", "ids"}, {"job", std::numeric_limits<uint64_t>::max() - 1}},
                                     {{"t", "ids"}, {"job", Scheduler::kMaxJobId}},
                                     {{"t", "job"}, {"job", 0}, {"doc", Json::parse(one)}},
                                     {{"t", "ids"}, {"job", 4}}};
  CHECK(s.Restore(records, testing::TestCatalog()) == 0);
  CHECK(s.Submit(testing::MustLoad(one), "/tmp") == JobId(5));
  CHECK(s.Submit(testing::MustLoad(one), "/tmp") == JobId(6));
  CHECK(s.JobIdsLeft());
  // The last id a journal may name: the next one would be skipped at the following restart.
  CHECK(s.Restore({{{"t", "ids"}, {"job", Scheduler::kMaxJobId - 1}}}, testing::TestCatalog()) == 0);
  CHECK_FALSE(s.JobIdsLeft());
}

TEST_CASE("Journal.TheRecoveryGraceStartsAgainWhenTheJobManagerListens") {
  ManualClock clock;
  const std::vector<Json> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  NullSink sink;
  SchedulerOptions options;
  Scheduler restored(sink, clock, options);
  REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
  clock.Advance(options.recovery_grace - std::chrono::milliseconds(100));  // a slow start
  restored.StartRecoveryGrace();
  clock.Advance(std::chrono::milliseconds(200));
  restored.Tick();
  CHECK(restored.DaemonsTable()[0]["state"] == "awaited");  // not lost: its grace began just now
  clock.Advance(options.recovery_grace);
  restored.Tick();
  CHECK(restored.DaemonsTable()[0]["state"] == "lost");
}

TEST_CASE("Journal.RecordsThatContradictTheOthersAreSkippedAndNamed") {
  // Damage that still parses: a completed job must not be reset, run again or turned into a
  // cancelled one by a record that makes no sense after the ones before it.
  JournaledScheduler old;
  JobId job = old.s.Submit(testing::MustLoad(kChain), "/tmp");
  old.s.Flush();
  CompleteRuns(old.s, old.sink, job);
  REQUIRE(old.s.StateOf(job) == JobState::kCompleted);
  std::vector<Json> records = old.s.Snapshot();
  const size_t good = records.size();
  records.push_back(records[0]);  // a second copy of the job's record
  records.push_back({{"t", "end"}, {"job", job.value()}, {"state", "complet3d"}});
  records.push_back({{"t", "done"},
                     {"job", job.value()},
                     {"v", 4294967295u},
                     {"ver", 1u},
                     {"daemon", "d0"},
                     {"bytes", Json::array()},
                     {"msgs", Json::array()}});
  records.push_back({{"t", "regen"}, {"job", job.value()}, {"v", 99}});
  records.push_back({{"t", "dome"}, {"job", job.value()}});
  NullSink sink;
  ManualClock clock;
  Scheduler restored(sink, clock);
  std::vector<std::string> skipped;
  CHECK(restored.Restore(records, testing::TestCatalog(), &skipped) == 1);
  CHECK(restored.StateOf(job) == JobState::kCompleted);
  CHECK(restored.JobStatus(job)["vertices"]["completed"] == 3);
  REQUIRE(skipped.size() == 5);
  CHECK_MESSAGE(skipped[0].find("journal record " + std::to_string(good + 1) + ": a second record of job 1") == 0, skipped[0]);
  CHECK_MESSAGE(skipped[1].find("ended in \"complet3d\", which is not a job's end state") != std::string::npos, skipped[1]);
  CHECK_MESSAGE(skipped[2].find("job 1 has no vertex 4294967295") != std::string::npos, skipped[2]);
  CHECK_MESSAGE(skipped[3].find("job 1 has no vertex 99") != std::string::npos, skipped[3]);
  CHECK_MESSAGE(skipped[4].find("unknown record type \"dome\"") != std::string::npos, skipped[4]);
  // What the rewrite keeps: as before the damage, and that it was restored once.
  std::vector<Json> expected = old.s.Snapshot();
  expected.push_back({{"t", "restart"}, {"job", 0}, {"n", 1}});
  CHECK(restored.Snapshot() == expected);
}

}  // namespace
}  // namespace copse::jm

namespace copse::jm {
namespace {

TEST_CASE("Journal.AFinishedJobsHistoryStaysOnDiskAtARestartAndIsAnsweredFromThere") {
  // A restart reads back only running jobs' histories (the job manager calls RestoreHistory for
  // those): a finished job's event log, trace and progress come from its history files when
  // asked for, so that a restart after a million-vertex job does not parse its every attempt.
  const auto dir = std::filesystem::temp_directory_path() / ("copse-journal-history-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ManualClock clock;
  RecordingJournal journal;
  JobId job;
  {
    auto history = JobHistory::Open(dir);
    REQUIRE(history.ok());
    NullSink sink;
    Scheduler s(sink, clock);
    s.set_journal(&journal);
    s.set_history(history->get());
    REQUIRE(s.AddDaemon(D0()).ok());
    job = s.Submit(testing::MustLoad(kChain), "/tmp");
    size_t reported = 0;  // runs whose tasks succeeded (chained ones come in one run)
    for (int round = 0; round < 10 && s.StateOf(job) == JobState::kRunning; ++round) {
      s.Flush();
      for (; reported < sink.runs.size(); ++reported) {
        for (const auto& task : sink.runs[reported].tasks()) Succeed(s, job, task);
      }
      s.Tick();
    }
    REQUIRE(s.StateOf(job) == JobState::kCompleted);
    (*history)->Flush();
  }
  auto history = JobHistory::Open(dir);  // as a restarted job manager
  REQUIRE(history.ok());
  NullSink sink;
  Scheduler restored(sink, clock);
  restored.set_history(history->get());
  REQUIRE(restored.Restore(journal.records, testing::TestCatalog()) == 1);
  CHECK(restored.HasJob(job));
  CHECK_FALSE(restored.HistoryInMemory(job));
  ClientApi api(restored, **history);
  const auto logs = api.Answer("logs", {{"op", "logs"}, {"job", job.value()}, {"vertex", "b[0]"}});
  REQUIRE(logs.has_value());
  REQUIRE((*logs)["op"] == "logs");
  CHECK((*logs)["lines"].dump().find("b[0] version 1 completed on d0") != std::string::npos);
  auto trace = api.Trace(job);
  REQUIRE(trace.ok());
  CHECK(trace->spans.size() == 3);
  CHECK((*api.Answer("status", {{"op", "status"}, {"job", job.value()}}))["job"]["state"] == "completed");

  // Put back, as for a running job, it is answered from memory.
  const auto events = (*history)->Load(job);
  restored.RestoreHistory(job, events->lines, events->spans, events->progress);
  CHECK(restored.HistoryInMemory(job));
  auto from_memory = api.Trace(job);
  REQUIRE(from_memory.ok());
  CHECK(from_memory->spans.size() == 3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace copse::jm
