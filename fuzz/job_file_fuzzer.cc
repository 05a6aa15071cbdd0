// Fuzzes a job file from text to placed vertices, the path every `copse validate`, `copse
// submit` and the job manager's submit handler takes (jobmanager/job_loader.h): the JSON
// reader, the parser with its diagnostics, the graph's expansion and checks (edges, patterns,
// cycles, faults, gangs), then the scheduler accepting the job, placing what it can on two
// daemons of different sizes and answering status.
// Properties beyond "no crash, no sanitizer report": a file either loads or says why (never
// both, never neither); loading the text and loading its parsed JSON give the same graph; a loaded job is accepted and its status
// counts every vertex.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/job_size.h"
#include "jobmanager/job_loader.h"
#include "jobmanager/scheduler.h"

namespace {

using copse::jm::DaemonSpec;

class DroppingSink final : public copse::jm::DaemonSink {
 public:
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon&) override {}
};

copse::jm::ProgramCatalog Catalog() {
  return copse::jm::ProgramCatalog{{"noop", "checksum", "exec", "text.read_lines", "ml.grad", "ml.update"}, true, nullptr};
}

DaemonSpec Daemon(std::string name, double cpus, int gpus, std::string host) {
  DaemonSpec d;
  d.name = std::move(name);
  d.cpus = cpus;
  d.gpus = gpus;
  d.memory_mb = 4096;
  d.gpu_memory_mb = gpus > 0 ? 16384 : 0;
  d.labels = {{"host", std::move(host)}};
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  copse::SetLogLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto doc = copse::ParseJson(text, "fuzz");
  if (doc.ok() && copse::fuzz::TooLargeToFuzz(*doc)) return 0;
  const copse::jm::JobLoad load = copse::jm::LoadJobText(text, "fuzz.json", Catalog());
  COPSE_FUZZ_CHECK(load.ok() == load.diags.empty());
  if (!load.ok()) {
    COPSE_FUZZ_CHECK(!load.status().ok());
    return 0;
  }
  COPSE_FUZZ_CHECK(doc.ok());
  const copse::jm::JobLoad again = copse::jm::LoadJobJson(*doc, "fuzz.json", Catalog());
  COPSE_FUZZ_CHECK(again.ok());
  COPSE_FUZZ_CHECK(again.graph->vertices().size() == load.graph->vertices().size());

  copse::ManualClock clock;
  DroppingSink sink;
  copse::jm::Scheduler scheduler(sink, clock);
  COPSE_FUZZ_CHECK(scheduler.AddDaemon(Daemon("d0", 2, 0, "h0")).ok());
  COPSE_FUZZ_CHECK(scheduler.AddDaemon(Daemon("d1", 8, 2, "h1")).ok());
  (void)scheduler.WhyItCannotFit(*load.graph);
  const copse::JobId job = scheduler.Submit(load.graph, "/nonexistent");
  scheduler.Flush();
  const copse::Json status = scheduler.JobStatus(job);
  COPSE_FUZZ_CHECK(status.is_object());
  return 0;
}
