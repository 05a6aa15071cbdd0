// The job manager's own cost per vertex: the Scheduler driven in-process with a fake daemon
// sink that completes every task at once (no network, no daemons), on the cluster bench's
// 10,000-vertex noop DAG: each run message encoded into its frame, each report decoded from
// its body and checked by the codec, as the job manager's server does; on the job manager's
// allocator (tcmalloc, when the build found it). Prints microseconds of scheduler CPU per vertex (median of 5), and
// what compacting the journal to that job costs: the snapshot, and its rewrite (written,
// synced and renamed into place in a temporary directory). Runs alternate between a scheduler
// writing the job's history (event lines and attempt spans) and journal (a record per completed
// vertex), as the job manager's does, both flushed every 64 completions as a busy event loop
// would, and one writing neither, to show what they cost.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>

#include "bench/noop_dag.h"
#include "cli/program_catalog.h"
#include "jobmanager/job_history.h"
#include "jobmanager/job_loader.h"
#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"
#include "protocol/codec.h"

using copse::Json;
namespace jm = copse::jm;

namespace {

/// The fake daemons: each message is encoded into its frame as the job manager's sink does
/// (job manager work); the tasks a run carries are noted (what a daemon would know once it
/// parsed them: daemon work, left out).
class QueueSink final : public jm::DaemonSink {
 public:
  struct Sent {
    uint32_t vertex, version;
    int outputs;
  };
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon& m) override {
    frame_bytes += copse::protocol::EncodeFrame(m).size();
    if (!m.has_run()) return;
    for (const auto& t : m.run().tasks()) tasks.push_back({t.vertex(), t.version(), t.outputs_size()});
  }
  std::deque<Sent> tasks;
  uint64_t frame_bytes = 0;
};

/// A daemon's report that `t` succeeded, as it would send it (daemon work, a few hundred ns).
std::string ReportBody(copse::JobId job, const QueueSink::Sent& t) {
  copse::protocol::DaemonToJm m;
  copse::protocol::AttemptReport& a = *m.mutable_report()->add_attempts();
  a.set_job(job.value());
  a.set_vertex(t.vertex);
  a.set_version(t.version);
  a.set_ok(true);
  for (int p = 0; p < t.outputs; ++p) a.add_output_bytes(0), a.add_output_messages(0);
  a.set_duration_ms(0.5);
  return m.SerializeAsString();
}

}  // namespace

int main() {
  auto load = jm::LoadJobJson(copse::bench::NoopDag(100, 100), "bench", copse::cli::Catalog());
  if (!load.ok()) return 1;
  std::vector<double> us, us_bare, snapshot_ms, rewrite_ms;
  size_t records = 0;
  uint64_t bytes = 0, appended = 0;
  const auto dir = std::filesystem::temp_directory_path() / ("copse-scheduler-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (int run = 0; run < 10; ++run) {
    const bool with_history = run % 2 == 0;
    QueueSink sink;
    copse::SteadyClock clock;
    jm::Scheduler sched(sink, clock);
    std::filesystem::remove_all(dir / "history");
    auto history = jm::JobHistory::Open(dir / "history");
    if (!history.ok()) return 1;
    std::filesystem::remove_all(dir / "journal");
    std::filesystem::create_directories(dir / "journal");
    auto journal = jm::Journal::Open(dir / "journal", false);
    if (!journal.ok()) return 1;
    if (with_history) sched.set_history(history->get()), sched.set_journal(journal->get());
    for (int d = 0; d < 2; ++d) {
      jm::DaemonSpec spec;
      spec.name = "d" + std::to_string(d);
      spec.cpus = 2;
      (void)sched.AddDaemon(spec);
    }
    auto t0 = std::chrono::steady_clock::now();
    copse::JobId job = sched.Submit(load.graph, "/tmp");
    sched.Flush();
    size_t done = 0;
    while (!sink.tasks.empty()) {
      const std::string body = ReportBody(job, sink.tasks.front());
      sink.tasks.pop_front();
      // What the job manager does with a report frame's body (jm_server.cc).
      auto report = copse::protocol::DecodeDaemonToJm(body);
      if (!report.ok()) return 1;
      for (const auto& a : report->report().attempts()) sched.OnAttemptFinished(jm::AttemptReport::From(a));
      sched.Flush();
      if (++done % 64 == 0 && with_history) (*history)->Flush(), (void)(*journal)->Flush();
    }
    if (with_history) (*history)->Flush(), (void)(*journal)->Flush();
    const double per_vertex = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / done;
    (with_history ? us : us_bare).push_back(per_vertex);
    if (!with_history) continue;
    auto t1 = std::chrono::steady_clock::now();
    const auto snapshot = sched.Snapshot();
    auto t2 = std::chrono::steady_clock::now();
    appended = (*journal)->bytes();
    if (!(*journal)->Rewrite(snapshot).ok()) return 1;
    auto t3 = std::chrono::steady_clock::now();
    snapshot_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    rewrite_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    records = snapshot.size();
    bytes = (*journal)->bytes();
  }
  std::filesystem::remove_all(dir);
  std::sort(us.begin(), us.end());
  std::sort(us_bare.begin(), us_bare.end());
  std::sort(snapshot_ms.begin(), snapshot_ms.end());
  std::sort(rewrite_ms.begin(), rewrite_ms.end());
  std::printf(
      "scheduler_bench: 10,000-vertex noop DAG, scheduler + task encoding + job history + journal: median %.1f us per "
      "vertex (%.0f vertices/s of job manager CPU); without history and journal %.1f us (they cost %.2fx)\n",
      us[2], 1e6 / us[2], us_bare[2], us[2] / us_bare[2]);
  std::printf(
      "scheduler_bench: journal written while it ran %.2f MB; its compaction once it completed (%zu records, %.3f MB): "
      "snapshot median %.2f ms, rewrite (write, fdatasync, rename) median %.1f ms\n",
      appended / 1e6, records, bytes / 1e6, snapshot_ms[2], rewrite_ms[2]);
  return 0;
}
