// AttemptExecutor, alone: what it reports for attempts that succeed, fail in their program,
// cannot read an input, or are cancelled — the report the job manager acts on.
#include "vertex/attempt_executor.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>

namespace copse::vertex {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  Fixture() : dir(fs::temp_directory_path() / ("copse-executor-test-" + std::to_string(::getpid()))), gpus(0) {
    fs::remove_all(dir);
    store = chan::OutputStore::Make(dir / "outputs", 1 << 20).value();
    ExecutorEnv env;
    env.programs = &ProgramRegistry::Default();
    env.store = store.get();
    env.shm = &shm;
    env.gpus = &gpus;
    env.work_dir = dir;
    env.cpus = 2;
    env.memory_mb = 1024;
    executor = std::make_unique<AttemptExecutor>(std::move(env));
  }
  ~Fixture() { fs::remove_all(dir); }
  /// A task as the job manager sends it: `inputs` and `outputs` as in its "run" message.
  Json Execute(const std::string& program, Json params, Json inputs, Json outputs, uint32_t version = 1) {
    AttemptTask task;
    task.spec = {{"job", 5},           {"vertex", 2},      {"version", version}, {"name", "v[0]"},
                 {"program", program}, {"params", params}, {"inputs", inputs},   {"outputs", outputs}};
    task.log = std::make_shared<AttemptLog>();
    return executor->Execute(task);
  }
  fs::path dir;
  std::unique_ptr<chan::OutputStore> store;
  chan::ShmRegistry shm;
  GpuPool gpus;
  std::unique_ptr<AttemptExecutor> executor;
};

TEST_CASE("AttemptExecutor.ASuccessfulAttemptReportsItsOutputs") {
  Fixture f;
  Json report = f.Execute("checksum", {{"bytes", 10}}, Json::array(), {"file", "memory"});
  REQUIRE_MESSAGE(report["ok"] == true, report.dump());
  CHECK(report["output_bytes"] == Json({27, 27}));  // 16 hex digits and a newline, then 10 bytes
  CHECK(report["output_messages"][0].get<uint64_t>() >= 1);
  CHECK(f.store->List(5).size() == 2);
  // A consumer reads it locally by its key.
  Json in = {{"key", {{"job", 5}, {"vertex", 2}, {"version", 1}, {"port", 0}}}, {"local", true}};
  Json consumer = f.Execute("noop", Json::object(), Json::array({in}), Json::array(), 1);
  CHECK_MESSAGE(consumer["ok"] == true, consumer.dump());
}

TEST_CASE("AttemptExecutor.ProgramErrorsAreClassifiedAndDeterministicOnesSaySo") {
  Fixture f;
  Json missing_file = f.Execute("text.read_lines", {{"path", "no-such-file.txt"}}, Json::array(), {"file"});
  CHECK(missing_file["ok"] == false);
  CHECK(missing_file["class"] == "program_error");
  CHECK(missing_file["deterministic"] == true);
  Json unknown = f.Execute("no.such.program", Json::object(), Json::array(), Json::array());
  CHECK(unknown["class"] == "program_error");
  CHECK_FALSE(unknown.contains("deterministic"));  // another daemon may have it
  Json injected = f.Execute("noop", Json::object(), Json::array(), Json::array());
  CHECK(injected["ok"] == true);
}

TEST_CASE("AttemptExecutor.AnInputThatCannotBeReadIsReportedWithItsPortAndVersion") {
  Fixture f;
  // As parsed from the wire: whole numbers are unsigned.
  Json in = Json::parse(R"({"key": {"job": 5, "vertex": 9, "version": 3, "port": 0}, "local": true})");
  Json report = f.Execute("noop", Json::object(), Json::array({Json{{"empty", true}}, in}), Json::array());
  CHECK(report["ok"] == false);
  CHECK(report["class"] == "input_lost");
  CHECK(report["lost_input"] == 1);
  CHECK(report["lost_input_version"] == 3);
}

TEST_CASE("AttemptExecutor.ACancelledAttemptReportsCancelled") {
  Fixture f;
  AttemptTask task;
  task.spec = {{"job", 5},
               {"vertex", 2},
               {"version", 1},
               {"name", "v[0]"},
               {"program", "checksum"},
               {"params", {{"sleep_ms", 5000}}},
               {"inputs", Json::array()},
               {"outputs", {"file"}}};
  task.cancel->store(true);
  Json report = f.executor->Execute(task);
  CHECK(report["class"] == "cancelled");
  Json malformed = f.Execute("noop", Json::object(), Json::array({Json{{"key", "not a key"}}}), Json::array());
  CHECK(malformed["class"] == "program_error");
}

}  // namespace
}  // namespace copse::vertex
