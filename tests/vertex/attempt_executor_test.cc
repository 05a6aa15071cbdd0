// AttemptExecutor, alone: what it reports for attempts that succeed, fail in their program,
// cannot read an input, or are cancelled — the report the job manager acts on.
#include "vertex/attempt_executor.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/vertex/task_util.h"

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
  /// A task of job 5, vertex 2 as the job manager sends it.
  protocol::AttemptReport Execute(const std::string& program, const Json& params, std::vector<protocol::Input> inputs,
                                  std::vector<protocol::Output> outputs, uint32_t version = 1) {
    AttemptTask task;
    task.spec = Spec(program, params, version);
    for (auto& in : inputs) *task.spec.add_inputs() = std::move(in);
    for (auto& out : outputs) *task.spec.add_outputs() = std::move(out);
    task.log = std::make_shared<AttemptLog>();
    return executor->Execute(task);
  }
  static protocol::Task Spec(const std::string& program, const Json& params, uint32_t version = 1) {
    protocol::Task t;
    t.set_job(5);
    t.set_vertex(2);
    t.set_version(version);
    t.set_name("v[0]");
    t.set_program(program);
    t.set_params_json(params.dump());
    t.set_threads(1);
    return t;
  }
  fs::path dir;
  std::unique_ptr<chan::OutputStore> store;
  chan::ShmRegistry shm;
  GpuPool gpus;
  std::unique_ptr<AttemptExecutor> executor;
};

using testing::EmptyInput;
using testing::LocalInput;
using testing::StoredOutput;

TEST_CASE("AttemptExecutor.ASuccessfulAttemptReportsItsOutputs") {
  Fixture f;
  protocol::AttemptReport report =
      f.Execute("checksum", {{"bytes", 10}}, {}, {StoredOutput(protocol::CHANNEL_FILE), StoredOutput(protocol::CHANNEL_MEMORY)});
  REQUIRE_MESSAGE(report.ok(), report.DebugString());
  REQUIRE(report.output_bytes_size() == 2);
  CHECK(report.output_bytes(0) == 27);  // 16 hex digits and a newline, then 10 bytes
  CHECK(report.output_bytes(1) == 27);
  CHECK(report.output_messages(0) >= 1);
  CHECK(f.store->List(5).size() == 2);
  // A consumer reads it locally by its key.
  protocol::AttemptReport consumer = f.Execute("noop", Json::object(), {LocalInput({5, 2, 1, 0})}, {}, 1);
  CHECK_MESSAGE(consumer.ok(), consumer.DebugString());
}

TEST_CASE("AttemptExecutor.ProgramErrorsAreClassifiedAndDeterministicOnesSaySo") {
  Fixture f;
  protocol::AttemptReport missing_file =
      f.Execute("text.read_lines", {{"path", "no-such-file.txt"}}, {}, {StoredOutput(protocol::CHANNEL_FILE)});
  CHECK_FALSE(missing_file.ok());
  CHECK(missing_file.failure() == protocol::FAILURE_PROGRAM_ERROR);
  CHECK(missing_file.deterministic());
  protocol::AttemptReport unknown = f.Execute("no.such.program", Json::object(), {}, {});
  CHECK(unknown.failure() == protocol::FAILURE_PROGRAM_ERROR);
  CHECK_FALSE(unknown.deterministic());  // another daemon may have it
  protocol::AttemptReport fine = f.Execute("noop", Json::object(), {}, {});
  CHECK(fine.ok());
}

TEST_CASE("AttemptExecutor.AnInputThatCannotBeReadIsReportedWithItsPortAndVersion") {
  Fixture f;
  protocol::AttemptReport report = f.Execute("noop", Json::object(), {EmptyInput(), LocalInput({5, 9, 3, 0})}, {});
  CHECK_FALSE(report.ok());
  CHECK(report.failure() == protocol::FAILURE_INPUT_LOST);
  REQUIRE(report.has_lost_input());
  CHECK(report.lost_input() == 1);
  CHECK(report.lost_input_version() == 3);
}

TEST_CASE("AttemptExecutor.ACancelledAttemptReportsCancelled") {
  Fixture f;
  AttemptTask task;
  task.spec = Fixture::Spec("checksum", {{"sleep_ms", 5000}});
  *task.spec.add_outputs() = StoredOutput(protocol::CHANNEL_FILE);
  task.cancel->store(true);
  protocol::AttemptReport report = f.executor->Execute(task);
  CHECK(report.failure() == protocol::FAILURE_CANCELLED);
  // Params that are not JSON (the codec cannot know): the program's error, not a crash.
  task = AttemptTask();
  task.spec = Fixture::Spec("noop", Json::object());
  task.spec.set_params_json("{not json");
  task.log = std::make_shared<AttemptLog>();
  protocol::AttemptReport malformed = f.executor->Execute(task);
  CHECK(malformed.failure() == protocol::FAILURE_PROGRAM_ERROR);
  CHECK_MESSAGE(malformed.error().find("params of v[0]") != std::string::npos, malformed.error());
}

}  // namespace
}  // namespace copse::vertex
