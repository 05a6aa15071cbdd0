// JobHistory: what the job manager keeps of a job on disk reads back as it was written, and
// damaged files cost the records they hold, never an exception on the job manager's thread.
#include "jobmanager/job_history.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace copse::jm {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / ("copse-history-test-" + std::to_string(::getpid()))) { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

HistorySpan Span(uint32_t vertex, uint32_t version, const std::string& name, const std::string& outcome, size_t before) {
  return {vertex, version, 1.5, 4.25, outcome, "d0", name, "a", before};
}

TEST_CASE("JobHistory.LinesSpansAndSummariesReadBack") {
  TempDir dir;
  {
    auto history = JobHistory::Open(dir.path);
    REQUIRE(history.ok());
    (*history)->JobLine(JobId(3), VertexId::Invalid(), "     0.001s submitted");
    (*history)->JobLine(JobId(3), VertexId(1), "     0.002s a[1] version 1 placed on d0 \"quoted\"\t\x01");
    (*history)->JobSpan(JobId(3), Span(1, 1, "a[1]", "completed", 2));
    (*history)->JobSpan(JobId(3), Span(0, 1, "a[0]", "program_error", 2));
    (*history)->JobFinished(JobId(3), {{"id", 3},
                                       {"name", "j"},
                                       {"state", "completed"},
                                       {"submitted_unix_ms", int64_t{1} << 41},
                                       {"finished_unix_ms", int64_t{1} << 41}});
  }
  auto history = JobHistory::Open(dir.path);  // as a restarted job manager
  REQUIRE(history.ok());
  auto events = (*history)->Load(JobId(3));
  REQUIRE(events->lines.size() == 2);
  CHECK(events->lines[1].first == VertexId(1));
  CHECK(events->lines[1].second == "     0.002s a[1] version 1 placed on d0 \"quoted\"\t\x01");
  REQUIRE(events->spans.size() == 2);
  CHECK(events->spans[0].vertex_name == "a[1]");
  CHECK(events->spans[0].end_ms == 4.25);
  CHECK(events->names.at(0).first == "a[0]");
  Json log = JobHistory::EventLog(*events, "a[1]");
  REQUIRE(log.size() == 2);
  CHECK(log[1].get<std::string>().find("a[1] version 1 completed on d0") != std::string::npos);
  CHECK(JobHistory::EventLog(*events, "b[0]").is_null());
  TraceSnapshot trace = JobHistory::Trace(JobId(3), *events, *(*history)->Summary(JobId(3)));
  CHECK(trace.spans.size() == 2);
  CHECK(TraceJson(trace)["traceEvents"][0]["name"] == "a[1]");
  CHECK((*history)->Summaries(0).size() == 1);
  CHECK((*history)->Summaries((int64_t{1} << 41) + 1).empty());
  CHECK((*history)->Summaries(0, 0).empty());  // the newest none
}

TEST_CASE("JobHistory.SummariesAreTheNewestAndTheProgressSeriesIsKeptApart") {
  TempDir dir;
  {
    auto history = JobHistory::Open(dir.path);
    REQUIRE(history.ok());
    for (uint64_t id = 1; id <= 3; ++id) {
      (*history)->JobFinished(
          JobId(id),
          {{"id", id}, {"submitted_unix_ms", 1000 * id}, {"progress_series", Json::array({{{"step", 1}, {"loss", 2.5}}})}});
    }
    const auto newest = (*history)->Summaries(0, 2);
    REQUIRE(newest.size() == 2);
    CHECK((*newest[0])["id"] == 2);  // oldest first
    CHECK((*newest[1])["id"] == 3);
    CHECK_FALSE((*history)->Summary(JobId(3))->contains("progress_series"));  // not held with the summary
    CHECK((*history)->ProgressSeries(JobId(3))[0]["loss"] == 2.5);            // before it is written
    (*history)->Flush();
  }
  {
    // A running job's points go with its events, for a restarted job manager to put back.
    auto history = JobHistory::Open(dir.path);
    REQUIRE(history.ok());
    (*history)->JobProgress(JobId(5), {{"step", 7}, {"loss", 1.25}});
    (*history)->Flush();
    const auto events = (*history)->Load(JobId(5));
    REQUIRE(events->progress.size() == 1);
    CHECK(events->progress[0]["loss"] == 1.25);
  }
  auto reopened = JobHistory::Open(dir.path);
  REQUIRE(reopened.ok());
  CHECK((*reopened)->Summaries(2000).size() == 2);
  CHECK((*reopened)->ProgressSeries(JobId(1))[0]["step"] == 1);  // from progress.json
  CHECK((*reopened)->ProgressSeries(JobId(9)).empty());
}

TEST_CASE("JobHistory.DamagedFilesAreSkippedNotThrown") {
  TempDir dir;
  fs::create_directories(dir.path / "7" / "logs");
  std::ofstream(dir.path / "7" / "events.jsonl")
      << "not json\n{\"s\":[\"a\",1,2,3]}\n{\"l\":5}\n{\"s\":[1,2,3,4],\"o\":7,\"b\":\"x\"}\n"
      << "{\"l\":\"kept\",\"v\":-1}\n{\"truncated\":\"yes\"}\n[1,2]\n";
  std::ofstream(dir.path / "7" / "summary.json") << "{\"id\":7,\"finished_unix_ms\":\"yesterday\",\"submitted_unix_ms\":null}";
  std::ofstream(dir.path / "7" / "logs" / "x.y.jsonl") << "?";
  std::ofstream(dir.path / "not-a-job") << "";
  auto history = JobHistory::Open(dir.path);
  REQUIRE(history.ok());
  auto events = (*history)->Load(JobId(7));
  REQUIRE(events->lines.size() == 1);
  CHECK(events->lines[0].first == VertexId::Invalid());
  REQUIRE(events->spans.size() == 1);
  CHECK(events->spans[0].outcome.empty());
  CHECK_FALSE(events->truncated);
  CHECK((*history)->LoggedVersions(JobId(7), VertexId(0)).empty());
  CHECK((*history)->Summaries(0).size() == 1);
  CHECK((*history)->Prune(int64_t{1} << 50, {}) == 1);  // a finish time it cannot read: old
}

TEST_CASE("JobHistory.ATornLastRecordDoesNotSwallowTheNext") {
  TempDir dir;
  fs::create_directories(dir.path / "2");
  std::ofstream(dir.path / "2" / "events.jsonl") << "{\"l\":\"whole\"}\n{\"l\":\"torn by a cra";
  auto history = JobHistory::Open(dir.path);
  REQUIRE(history.ok());
  (*history)->JobLine(JobId(2), VertexId::Invalid(), "after the restart");
  (*history)->Flush();
  auto events = (*history)->Load(JobId(2));
  REQUIRE(events->lines.size() == 2);
  CHECK(events->lines[1].second == "after the restart");
}

/// A daemon's VertexLog chunks: (stream, text) pairs.
google::protobuf::RepeatedPtrField<protocol::LogChunk> Chunks(std::vector<std::pair<std::string, std::string>> pairs) {
  google::protobuf::RepeatedPtrField<protocol::LogChunk> chunks;
  for (auto& [stream, text] : pairs) {
    protocol::LogChunk& c = *chunks.Add();
    c.set_stream(stream);
    c.set_text(text);
  }
  return chunks;
}

TEST_CASE("JobHistory.VertexLogsAreReadFromAnOffsetInWholeRecords") {
  TempDir dir;
  auto history = JobHistory::Open(dir.path);
  REQUIRE(history.ok());
  REQUIRE((*history)->AppendVertexLog(JobId(1), VertexId(4), 2, Chunks({{"stderr", "one\n"}})).ok());
  auto first = (*history)->ReadVertexLog(JobId(1), VertexId(4), 2, 0, 1 << 20);
  REQUIRE(first.records.size() == 1);
  REQUIRE((*history)->AppendVertexLog(JobId(1), VertexId(4), 2, Chunks({{"stdout", "two"}, {"log", "\xff"}})).ok());
  auto rest = (*history)->ReadVertexLog(JobId(1), VertexId(4), 2, first.next, 1 << 20);
  REQUIRE(rest.records.size() == 2);
  CHECK(rest.records[0]["text"] == "two");
  CHECK(rest.records[1]["text"] == "\xef\xbf\xbd");  // invalid UTF-8 stored as U+FFFD
  CHECK((*history)->LoggedVersions(JobId(1), VertexId(4)) == std::vector<uint32_t>{2});
  // A record still being written (no newline yet) is left for the next read.
  std::ofstream(dir.path / "1" / "logs" / "4.2.jsonl", std::ios::app) << "{\"stream\":\"log\",\"te";
  auto partial = (*history)->ReadVertexLog(JobId(1), VertexId(4), 2, rest.next, 1 << 20);
  CHECK(partial.records.empty());
  CHECK(partial.next == rest.next);
}

TEST_CASE("JobHistory.PruneRemovesFinishedJobsPastTheRetentionOnly") {
  TempDir dir;
  auto history = JobHistory::Open(dir.path);
  REQUIRE(history.ok());
  for (uint64_t id : {1, 2, 3}) {
    (*history)->JobLine(JobId(id), VertexId::Invalid(), "line");
    (*history)->Flush();
  }
  (*history)->JobFinished(JobId(1), {{"id", 1}, {"finished_unix_ms", 1000}});
  (*history)->JobFinished(JobId(2), {{"id", 2}, {"finished_unix_ms", 5000}});
  // 3 never finished here and was written just now: kept, as 2 (finished after the cut) is.
  CHECK((*history)->Prune(2000, {}) == 1);
  CHECK_FALSE(fs::exists(dir.path / "1"));
  CHECK(fs::exists(dir.path / "2"));
  CHECK(fs::exists(dir.path / "3"));
  CHECK((*history)->Prune(9000, {2}) == 0);  // still held by the scheduler
  CHECK((*history)->Jobs().size() == 2);
}

}  // namespace
}  // namespace copse::jm
