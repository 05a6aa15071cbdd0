// The job manager's own cost per vertex: the Scheduler driven in-process with a fake daemon
// sink that completes every task at once (no network, no daemons), on the cluster bench's
// 10,000-vertex noop DAG. Prints microseconds of scheduler CPU per vertex (median of 5), and
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

using copse::Json;
namespace jm = copse::jm;

namespace {

class QueueSink final : public jm::DaemonSink {
 public:
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon& m) override {
    if (!m.has_run()) return;
    for (const auto& t : m.run().tasks()) tasks.push_back(t.SerializeAsString());  // what a real sink would write
  }
  std::deque<std::string> tasks;
};

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
      copse::protocol::Task t;
      if (!t.ParseFromString(sink.tasks.front())) return 1;  // what the server parses from a report
      sink.tasks.pop_front();
      jm::AttemptReport r;
      r.job = job;
      r.vertex = copse::VertexId(t.vertex());
      r.version = t.version();
      r.ok = true;
      r.output_bytes.assign(t.outputs_size(), 0);
      r.output_messages.assign(t.outputs_size(), 0);
      sched.OnAttemptFinished(r);
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
