// The job manager's journal: round trip, a torn last record, corruption in the middle, a
// scheduler restored from it, and compaction to a snapshot.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include <algorithm>

#include <google/protobuf/util/message_differencer.h>
#include <xxhash.h>

#include <functional>

#include "jobmanager/client_api.h"
#include "jobmanager/job_history.h"
#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"
#include "protocol/codec.h"
#include "tests/jobmanager/job_test_util.h"

namespace copse::jm {
namespace {

std::filesystem::path TempDir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

const char* const kOneVertex = R"({"stages": [{"name": "a", "program": "noop"}]})";

protocol::JournalRecord JobRec(uint64_t job, const std::string& doc = kOneVertex) {
  protocol::JournalRecord r;
  r.mutable_job()->set_job(job);
  r.mutable_job()->set_doc_json(doc);
  return r;
}

protocol::JournalRecord EndRec(uint64_t job, protocol::JobEndState state = protocol::JOB_COMPLETED) {
  protocol::JournalRecord r;
  r.mutable_end()->set_job(job);
  r.mutable_end()->set_state(state);
  return r;
}

protocol::JournalRecord IdsRec(uint64_t up_to) {
  protocol::JournalRecord r;
  r.mutable_ids()->set_up_to(up_to);
  return r;
}

protocol::JournalRecord DoneRec(uint64_t job, uint32_t vertex) {
  protocol::JournalRecord r;
  r.mutable_done()->set_job(job);
  r.mutable_done()->set_vertex(vertex);
  r.mutable_done()->set_version(1);
  r.mutable_done()->set_daemon("d0");
  return r;
}

std::string KindOf(const protocol::JournalRecord& r) { return std::string(protocol::BodyName(r)); }

bool Same(const std::vector<protocol::JournalRecord>& a, const std::vector<protocol::JournalRecord>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!google::protobuf::util::MessageDifferencer::Equals(a[i], b[i])) return false;
  }
  return true;
}

/// Writes `records` as a job manager would, and returns the journal file's bytes.
std::string WriteJournal(const std::filesystem::path& dir, const std::vector<protocol::JournalRecord>& records) {
  {
    auto j = Journal::Open(dir, false);
    REQUIRE(j.ok());
    for (const auto& r : records) (*j)->Record(r);
    REQUIRE((*j)->Flush().ok());
  }
  return ReadFile((dir / Journal::kFileName).string()).value();
}

void Overwrite(const std::filesystem::path& dir, const std::string& bytes) {
  std::ofstream(dir / Journal::kFileName, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_CASE("Journal.RoundTripsAndDropsATornTail") {
  auto dir = TempDir("copse-journal");
  const std::string whole = WriteJournal(dir, {JobRec(1), EndRec(1), DoneRec(1, 0)});
  CHECK(whole.rfind("copse journal 1\n", 0) == 0);    // a person can tell what the file is
  Overwrite(dir, whole.substr(0, whole.size() - 3));  // a crash mid-write of the third
  std::vector<std::string> warnings;
  bool records_lost = true;
  auto records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK((*records)[0].job().doc_json() == kOneVertex);
  CHECK((*records)[1].end().state() == protocol::JOB_COMPLETED);
  REQUIRE(warnings.size() == 1);
  CHECK_MESSAGE(warnings[0].find("record 3 (byte") != std::string::npos, warnings[0]);
  CHECK(warnings[0].find("torn last record") != std::string::npos);
  CHECK_FALSE(records_lost);  // only the record being written
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.DamageInTheMiddleStopsTheReplayThereWithAWarning") {
  auto dir = TempDir("copse-journal-bad");
  const std::string whole = WriteJournal(dir, {JobRec(1), JobRec(2), JobRec(7), JobRec(5), IdsRec(uint64_t{1} << 60)});
  const std::string first_two = WriteJournal(TempDir("copse-journal-bad-prefix"), {JobRec(1), JobRec(2)});
  std::string damaged = whole;
  damaged[first_two.size() - 3] ^= 0x20;  // a bit flipped in job 2's document
  Overwrite(dir, damaged);
  std::vector<std::string> warnings;
  bool records_lost = false;
  auto records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK((*records)[0].job().job() == 1);
  // Job 7's record was not read, but its id stays handed out: the damaged copy holds it. (The
  // ids record past 2^53 names no id.)
  CHECK((*records)[1].ids().up_to() == 7);
  REQUIRE(warnings.size() == 2);
  CHECK_MESSAGE(warnings[0].find("record 2 (byte") != std::string::npos, warnings[0]);
  CHECK(warnings[0].find("damaged record; the rest of the journal (3 whole records) is ignored") != std::string::npos);
  CHECK(warnings[1].find("job ids up to 7 appear from there on") != std::string::npos);
  CHECK(records_lost);

  // Garbage where the header was: damage from the first byte.
  Overwrite(dir, "GARBAGE\n" + whole.substr(std::string("copse journal 1\n").size()));
  warnings.clear();
  records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 1);
  CHECK((*records)[0].ids().up_to() == 7);
  CHECK_MESSAGE(warnings[0].find("not a copse journal header") != std::string::npos, warnings[0]);
  CHECK(records_lost);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(TempDir("copse-journal-bad-prefix"));
}

/// A frame around `body` as the journal writes one (journal.h), its checksum right or not.
std::string Frame(const std::string& body, uint32_t length, bool right_checksum = true) {
  std::string frame(16, '\0');
  const uint32_t marker = 0x1A5E0BC7;
  const uint64_t sum = XXH3_64bits(body.data(), body.size()) ^ (right_checksum ? 0 : 1);
  for (int i = 0; i < 4; ++i)
    frame[i] = static_cast<char>(marker >> (8 * i)), frame[4 + i] = static_cast<char>(length >> (8 * i));
  for (int i = 0; i < 8; ++i) frame[8 + i] = static_cast<char>(sum >> (8 * i));
  return frame + body;
}

TEST_CASE("Journal.ADamagedLastRecordIsDamageNotATear") {
  // A tear is a frame that runs past the end of the file (a write cut short). A last frame that
  // is all there but wrong (bit rot, a writer's bug) may be a job whose client heard its id:
  // the journal is kept for a person, as for damage in the middle.
  auto dir = TempDir("copse-journal-bad-last");
  const std::string whole = WriteJournal(dir, {JobRec(1)});
  const std::string unparseable = "\xff\xff\xff\xff";
  for (const std::string& last : {Frame(unparseable, 4), Frame(JobRec(2).SerializeAsString(), 0)}) {
    Overwrite(dir, whole + last);
    std::vector<std::string> warnings;
    bool records_lost = false;
    auto records = Journal::Replay(dir, &warnings, &records_lost);
    REQUIRE(records.ok());
    CHECK(records->size() == 1);
    REQUIRE(!warnings.empty());
    CHECK_MESSAGE(warnings[0].find("record 2 (byte " + std::to_string(whole.size()) +
                                   "): damaged record; the rest of the journal (0 whole records)") != std::string::npos,
                  warnings[0]);
    CHECK(records_lost);
  }
  std::filesystem::remove(dir / Journal::kFileName);
  std::string flipped = WriteJournal(dir, {JobRec(1), JobRec(2)});
  flipped.back() ^= 1;  // the last body's checksum no longer matches
  Overwrite(dir, flipped);
  bool records_lost = false;
  auto records = Journal::Replay(dir, nullptr, &records_lost);
  REQUIRE(records.ok());
  CHECK(records->size() == 1);
  CHECK(records_lost);

  // A length beyond the file: torn when last, damage when whole records follow.
  const std::string huge = Frame("", 0xFFFFFFFFu).substr(0, 16);
  Overwrite(dir, whole + huge);
  std::vector<std::string> warnings;
  records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  CHECK(records->size() == 1);
  CHECK_MESSAGE(warnings.at(0).find("torn last record") != std::string::npos, warnings[0]);
  CHECK_FALSE(records_lost);
  Overwrite(dir, whole + huge + whole.substr(16));
  records = Journal::Replay(dir, nullptr, &records_lost);
  REQUIRE(records.ok());
  CHECK(records->size() == 2);  // job 1, then the ids the following copy of it names
  CHECK(records->at(1).ids().up_to() == 1);
  CHECK(records_lost);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.RecordsAppendedAfterATornTailSurviveTheNextReplay") {
  // Opening cuts the torn frame off: a record appended after it would otherwise be read as
  // following damage, and dropped with it, if the rewrite at start failed.
  auto dir = TempDir("copse-journal-append-after-tear");
  const std::string whole = WriteJournal(dir, {JobRec(1), JobRec(2)});
  Overwrite(dir, whole.substr(0, whole.size() - 5));
  WriteJournal(dir, {JobRec(3)});
  std::vector<std::string> warnings;
  bool records_lost = true;
  auto records = Journal::Replay(dir, &warnings, &records_lost);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK(records->at(1).job().job() == 3);
  CHECK(warnings.empty());
  CHECK_FALSE(records_lost);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.AFileThatIsNoJournalIsRefusedAndTheRestartsAfterDamageStayCounted") {
  auto dir = TempDir("copse-journal-not-one");
  Overwrite(dir, R"({"t":"job","job":1,"doc":{}})"
                 "\n");  // journal.jsonl renamed by hand
  auto refused = Journal::Replay(dir, nullptr);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.status().message().find("is not a copse journal (it does not start \"copse journal 1\" and holds no "
                                                "record): move it aside") != std::string::npos,
                refused.status().message());

  // Damage, then lives that restarted twice: their attempt versions stay taken.
  protocol::JournalRecord restart;
  restart.mutable_restart()->set_restarts(2);
  std::string damaged = WriteJournal(dir, {JobRec(1), JobRec(2), restart});  // (Open made the file a journal)
  damaged[damaged.size() - restart.ByteSizeLong() - 20] ^= 1;                // inside job 2's body
  Overwrite(dir, damaged);
  auto records = Journal::Replay(dir, nullptr);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK(records->at(1).restart().restarts() == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.AnotherFormatIsRefusedSayingWhatToDo") {
  auto dir = TempDir("copse-journal-format");
  Overwrite(dir, "copse journal 2\nwhatever a later copse writes");
  auto refused = Journal::Replay(dir, nullptr);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.status().message().find("starts \"copse journal 2\", a format this copse (\"copse journal 1\") does "
                                                "not read: start the copse that wrote it") != std::string::npos,
                refused.status().message());
  // The JSON-lines journal of copse before this format: refused, never silently dropped.
  std::filesystem::remove(dir / Journal::kFileName);
  std::ofstream(dir / "journal.jsonl") << R"({"t":"job","job":1,"doc":{}})"
                                       << "\n";
  refused = Journal::Replay(dir, nullptr);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.status().message().find("journal.jsonl is the JSON-lines journal of a copse older than this one") !=
                    std::string::npos,
                refused.status().message());
  CHECK(refused.status().message().find("move the file aside") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.AHeaderTornByACrashIsAnEmptyJournalThatOpenMendsBeforeAppending") {
  auto dir = TempDir("copse-journal-torn-header");
  Overwrite(dir, "copse jour");
  std::vector<std::string> warnings;
  auto records = Journal::Replay(dir, &warnings);
  REQUIRE(records.ok());
  CHECK(records->empty());
  CHECK(warnings.empty());
  WriteJournal(dir, {JobRec(3)});
  records = Journal::Replay(dir, &warnings);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 1);
  CHECK(records->at(0).job().job() == 3);
  CHECK(warnings.empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.RewriteReplacesTheJournalAndLaterRecordsAppendToTheSnapshot") {
  auto dir = TempDir("copse-journal-rewrite");
  const auto path = dir / Journal::kFileName;
  auto j = Journal::Open(dir, false);
  REQUIRE(j.ok());
  for (uint32_t v = 0; v < 50; ++v) (*j)->Record(DoneRec(1, v));
  REQUIRE((*j)->Flush().ok());
  const uint64_t before = (*j)->bytes();
  CHECK(before == std::filesystem::file_size(path));
  CHECK((*j)->records() == 50);
  (*j)->Record(DoneRec(1, 99));  // buffered: the snapshot supersedes it
  REQUIRE((*j)->Rewrite({JobRec(1), IdsRec(1)}).ok());
  CHECK((*j)->bytes() < before);
  CHECK((*j)->bytes() == std::filesystem::file_size(path));
  CHECK((*j)->records() == 2);
  CHECK_FALSE(std::filesystem::exists(dir / "journal.bin.tmp"));
  (*j)->Record(EndRec(1));
  REQUIRE((*j)->Flush().ok());
  CHECK(Journal::Open(dir, false).value()->records() == 3);  // counted again on opening
  auto records = Journal::Replay(dir, nullptr);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 3);
  CHECK(KindOf((*records)[0]) == "job");
  CHECK(KindOf((*records)[1]) == "ids");
  CHECK(KindOf((*records)[2]) == "end");
  std::filesystem::remove_all(dir);
}

TEST_CASE("Journal.AFailedRewriteKeepsTheOldJournalInUse") {
  auto dir = TempDir("copse-journal-rewrite-fails");
  auto j = Journal::Open(dir, false);
  REQUIRE(j.ok());
  (*j)->Record(JobRec(1));
  REQUIRE((*j)->Flush().ok());
  std::filesystem::create_directory(dir / "journal.bin.tmp");  // the temporary file cannot be created
  CHECK_FALSE((*j)->Rewrite({IdsRec(1)}).ok());
  (*j)->Record(EndRec(1));
  REQUIRE((*j)->Flush().ok());
  auto records = Journal::Replay(dir, nullptr);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK(KindOf((*records)[0]) == "job");
  CHECK(KindOf((*records)[1]) == "end");
  std::filesystem::remove_all(dir);
}

class RecordingJournal final : public JournalSink {
 public:
  void Record(const protocol::JournalRecord& r) override { records.push_back(r); }
  std::vector<protocol::JournalRecord> records;
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
std::vector<protocol::JournalRecord> JournalOfAChainWhoseFirstVertexIsDone(ManualClock& clock) {
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
  const std::vector<protocol::JournalRecord> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
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
  std::vector<protocol::JournalRecord> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
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
    CHECK(std::count_if(snapshot.begin(), snapshot.end(), [](const protocol::JournalRecord& r) { return r.has_restart(); }) == 1);
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
  const std::vector<protocol::JournalRecord> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
  REQUIRE(records[0].job().submitted_unix_ms() == clock.UnixMs());
  ManualClock later;
  later.Advance(std::chrono::seconds(5));
  NullSink sink;
  Scheduler restored(sink, later);
  REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
  const Json status = restored.JobStatus(JobId(1));
  CHECK(status["elapsed_s"].get<double>() == doctest::Approx(5.0));
  CHECK(restored.JobsTable()[0]["submitted_unix_ms"] == clock.UnixMs());
}

TEST_CASE("Journal.ARecordBreakingTheSchemasRulesIsSkippedNamingTheFieldAndItsVertexRunsAgain") {
  // A "done" record without its daemon or version: marking the vertex completed with no daemon
  // behind it crashed the snapshot at the next start.
  ManualClock clock;
  struct Case {
    std::function<void(protocol::JournalRecord&)> damage;
    const char* named;
  };
  for (const Case& c :
       {Case{[](auto& r) { r.mutable_done()->clear_daemon(); }, "JournalRecord.done.daemon: required"},
        Case{[](auto& r) { r.mutable_done()->set_version(0); }, "JournalRecord.done.version: required (>= 1)"},
        Case{[](auto& r) { r.mutable_done()->set_job(0); }, "JournalRecord.done.job: must be 1 to 9007199254740991"},
        Case{[](auto& r) { r.mutable_done()->set_job(uint64_t{1} << 53); }, "JournalRecord.done.job: must be 1 to"},
        Case{[](auto& r) { r.Clear(); }, "JournalRecord.body: empty"}}) {
    CAPTURE(c.named);
    std::vector<protocol::JournalRecord> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
    REQUIRE(records[1].has_done());
    c.damage(records[1]);
    NullSink sink;
    Scheduler restored(sink, clock);
    std::vector<std::string> skipped;
    CHECK(restored.Restore(records, testing::TestCatalog(), &skipped) == 1);
    REQUIRE(skipped.size() == 1);
    CHECK_MESSAGE(skipped[0].find(std::string("journal record 2: ") + c.named) == 0, skipped[0]);
    CHECK(restored.Snapshot().size() == 3);  // the job, the ids and the restart, no completion
    REQUIRE(restored.AddDaemon(D0()).ok());
    restored.Flush();
    REQUIRE(sink.runs.size() == 1);
    CHECK(sink.runs[0].tasks(0).name() == "a[0]");  // runs again
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
  std::vector<protocol::JournalRecord> records = old.s.Snapshot();
  protocol::JobEnded& end = *records[records.size() - 2].mutable_end();
  CHECK(end.faults_size() == 1);
  protocol::Recovery& recovery = *end.add_recoveries();
  recovery.set_vertex("a[0]");
  recovery.set_failed_version(1);
  recovery.set_reason("program_error");
  recovery.set_detail("re-run \xff");  // a program's words, not UTF-8
  recovery.set_charged(true);
  recovery.set_at_ms(1.0);
  NullSink other;
  Scheduler restored(other, clock);
  REQUIRE(restored.Restore(records, testing::TestCatalog()) == 1);
  const Json status = restored.JobStatus(job);
  REQUIRE(status["faults"].size() == 1);
  CHECK(status["faults"][0]["source"] == "/faults/0");
  CHECK(status["faults"][0]["vertex"] == "a[0]");
  CHECK(status["faults"][0]["attempt"] == 1);
  REQUIRE(status["recoveries"].size() == 1);
  CHECK(status["recoveries"][0]["reason"] == "program_error");
  CHECK(status["recoveries"][0]["charged"] == true);
  CHECK_FALSE(status.contains("faults_not_fired"));
  // Journaled again as it was read: the next restart sees the same.
  CHECK(google::protobuf::util::MessageDifferencer::Equals(restored.Snapshot()[records.size() - 2], records[records.size() - 2]));

  // The list of faults cut short: which fired comes from faults_fired, whole.
  end.clear_faults();
  Scheduler cut(other, clock);
  REQUIRE(cut.Restore(records, testing::TestCatalog()) == 1);
  CHECK(cut.JobStatus(job)["faults"].empty());
  CHECK_FALSE(cut.JobStatus(job).contains("faults_not_fired"));

  // Faults that fired unjournaled (the job ran across a restart): none is said not to have.
  end.clear_faults_fired();
  end.set_faults_unknown(true);
  Scheduler older(other, clock);
  REQUIRE(older.Restore(records, testing::TestCatalog()) == 1);
  CHECK_FALSE(older.JobStatus(job).contains("faults_not_fired"));
}

TEST_CASE("Journal.AnEndWithAnElapsedTimeItCannotUseStillEndsTheJob") {
  // A job submitted while the wall clock read 1970 ends with an elapsed time past 2^40 ms: the
  // end record is kept (the job stays completed), its elapsed time is not used.
  JournaledScheduler old;
  JobId job = old.s.Submit(testing::MustLoad(kChain), "/tmp");
  old.s.Flush();
  CompleteRuns(old.s, old.sink, job);
  std::vector<protocol::JournalRecord> records = old.s.Snapshot();
  protocol::JournalRecord& end = records[records.size() - 2];
  REQUIRE(end.has_end());
  end.mutable_end()->set_elapsed_ms(2e12);
  protocol::JournalRecord restart;
  restart.mutable_restart()->set_restarts(UINT32_MAX);  // beyond the versions' room: read as the most
  records.push_back(restart);
  NullSink other;
  Scheduler restored(other, old.clock);
  std::vector<std::string> skipped;
  REQUIRE(restored.Restore(records, testing::TestCatalog(), &skipped) == 1);
  CHECK(skipped.empty());
  CHECK(restored.StateOf(job) == JobState::kCompleted);
  CHECK(restored.RestartRecord().restart().restarts() == 4000);
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
  std::vector<protocol::JournalRecord> snapshot;
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
  CHECK(snapshot.back().ids().up_to() == running.value());
  for (const auto& rec : snapshot) CHECK((!rec.has_job() || rec.job().job() != 1));
  for (const auto& rec : snapshot) CHECK((!rec.has_done() || rec.done().job() != 1));

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
  std::vector<protocol::JournalRecord> snapshot;
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
  CHECK(snapshot[1].done().vertex() == 50);
  NullSink sink;
  Scheduler restored(sink, clock);
  REQUIRE(restored.Restore(snapshot, testing::TestCatalog()) == 1);
  CHECK(restored.StateOf(JobId(1)) == JobState::kCompleted);
  CHECK(restored.JobStatus(JobId(1))["vertices"]["completed"] == 51);
  const uint32_t version = snapshot[1].done().version();
  REQUIRE(restored.AddDaemon(D0(), {{1, 50, version, 0}}).ok());
  auto outputs = restored.OutputLocations(JobId(1));
  REQUIRE(outputs.ok());
  CHECK((*outputs)[0]["alive"] == true);
  CHECK(restored.Snapshot().size() == 5);  // the same, and the restart

  // Its declared output's record skipped (found by the journal fuzzer): the completed job's
  // snapshot then names no place for it, and counting the snapshot must say so too.
  snapshot[1].mutable_done()->clear_daemon();
  NullSink other;
  Scheduler damaged(other, clock);
  REQUIRE(damaged.Restore(snapshot, testing::TestCatalog()) == 1);
  CHECK(damaged.Snapshot().size() == 4);  // the job, its end, the ids and the restart
  CHECK(damaged.SnapshotRecords() == damaged.Snapshot().size());
}

TEST_CASE("Journal.JobIdsGoOnAfterASnapshotOfAManagerThatForgotEveryJob") {
  const char* one = R"({"stages": [{"name": "a", "program": "noop"}]})";
  ManualClock clock;
  SchedulerOptions options;
  options.finished_job_ttl = std::chrono::minutes(1);
  std::vector<protocol::JournalRecord> snapshot;
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
  CHECK(snapshot[0].ids().up_to() == 2);
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
  const std::vector<protocol::JournalRecord> records = {IdsRec(std::numeric_limits<uint64_t>::max() - 1),
                                                        IdsRec(Scheduler::kMaxJobId), JobRec(0, one), IdsRec(4)};
  CHECK(s.Restore(records, testing::TestCatalog()) == 0);
  CHECK(s.Submit(testing::MustLoad(one), "/tmp") == JobId(5));
  CHECK(s.Submit(testing::MustLoad(one), "/tmp") == JobId(6));
  CHECK(s.JobIdsLeft());
  // The last id a journal may name: the next one would be skipped at the following restart.
  CHECK(s.Restore({IdsRec(Scheduler::kMaxJobId - 1)}, testing::TestCatalog()) == 0);
  CHECK_FALSE(s.JobIdsLeft());
}

TEST_CASE("Journal.TheRecoveryGraceStartsAgainWhenTheJobManagerListens") {
  ManualClock clock;
  const std::vector<protocol::JournalRecord> records = JournalOfAChainWhoseFirstVertexIsDone(clock);
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
  std::vector<protocol::JournalRecord> records = old.s.Snapshot();
  const size_t good = records.size();
  records.push_back(records[0]);                                                // a second copy of the job's record
  records.push_back(EndRec(job.value(), protocol::JOB_END_STATE_UNSPECIFIED));  // an end in no state
  records.push_back(DoneRec(job.value(), 4294967295u));
  protocol::JournalRecord regen;
  regen.mutable_regen()->set_job(job.value());
  regen.mutable_regen()->set_vertex(99);
  records.push_back(regen);
  records.emplace_back();  // an empty record
  NullSink sink;
  ManualClock clock;
  Scheduler restored(sink, clock);
  std::vector<std::string> skipped;
  CHECK(restored.Restore(records, testing::TestCatalog(), &skipped) == 1);
  CHECK(restored.StateOf(job) == JobState::kCompleted);
  CHECK(restored.JobStatus(job)["vertices"]["completed"] == 3);
  REQUIRE(skipped.size() == 5);
  CHECK_MESSAGE(skipped[0].find("journal record " + std::to_string(good + 1) + ": a second record of job 1") == 0, skipped[0]);
  CHECK_MESSAGE(skipped[1].find("JournalRecord.end.state: must be COMPLETED, FAILED or CANCELLED, got 0") != std::string::npos,
                skipped[1]);
  CHECK_MESSAGE(skipped[2].find("job 1 has no vertex 4294967295") != std::string::npos, skipped[2]);
  CHECK_MESSAGE(skipped[3].find("job 1 has no vertex 99") != std::string::npos, skipped[3]);
  CHECK_MESSAGE(skipped[4].find("JournalRecord.body: empty") != std::string::npos, skipped[4]);
  // What the rewrite keeps: as before the damage, and that it was restored once.
  std::vector<protocol::JournalRecord> expected = old.s.Snapshot();
  expected.emplace_back().mutable_restart()->set_restarts(1);
  CHECK(Same(restored.Snapshot(), expected));
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
