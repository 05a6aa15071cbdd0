// The built-in programs, run directly against in-memory channels.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "channels/memory_queue.h"
#include "vertex/attempt_log.h"
#include "vertex/program_registry.h"
#include "vertex/programs/checksum.h"

namespace copse::vertex {
namespace {

using chan::Buffer;
using chan::MessageLog;

/// Runs `program` with `inputs` (one vector of messages per port) and `n_out` outputs.
struct Run {
  Status status;
  std::vector<std::shared_ptr<MessageLog>> outputs;
  std::string Output(size_t port) const {
    std::string s;
    for (const auto& m : outputs[port]->messages) s += m.view();
    return s;
  }
};

Run RunProgram(const std::string& program, Json params, std::vector<std::vector<std::string>> inputs, size_t n_out,
               std::string name = "v[0]", const std::function<void(VertexContext&)>& setup = {}) {
  auto prog = ProgramRegistry::Default().Create(program);
  REQUIRE(prog.ok());
  std::vector<std::unique_ptr<chan::ChannelReader>> readers;
  std::vector<std::unique_ptr<chan::ChannelWriter>> writers;
  Run run;
  VertexContext ctx;
  ctx.name = name;
  ctx.params = &params;
  auto scratch = std::filesystem::temp_directory_path() / ("copse-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  ctx.scratch_dir = scratch;
  ctx.job_dir = scratch;
  for (auto& msgs : inputs) {
    auto log = std::make_shared<MessageLog>();
    for (auto& m : msgs) log->messages.push_back(Buffer(m));
    log->closed = true;
    readers.push_back(std::make_unique<chan::MessageLogReader>(log));
    ctx.inputs.push_back(readers.back().get());
  }
  for (size_t i = 0; i < n_out; ++i) {
    run.outputs.push_back(std::make_shared<MessageLog>());
    writers.push_back(std::make_unique<chan::MessageLogWriter>(run.outputs.back()));
    ctx.outputs.push_back(writers.back().get());
  }
  if (setup) setup(ctx);
  run.status = (*prog)->Run(ctx);
  std::filesystem::remove_all(scratch);
  return run;
}

TEST_CASE("Programs.ChecksumDigestsNameParamsAndEveryInputByte") {
  Json params = {{"k", 1}};
  auto run = RunProgram("checksum", params, {{"ab", "c"}, {}}, 2);
  REQUIRE(run.status.ok());
  ChecksumHasher h("v[0]", params.dump());
  h.AddMessage("ab");
  h.AddMessage("c");
  h.EndPort();
  h.EndPort();
  CHECK(run.Output(0) == DigestLine(h.Digest()));
  CHECK(run.Output(1) == run.Output(0));
  // Message boundaries matter: "a","bc" is a different stream from "ab","c".
  auto other = RunProgram("checksum", params, {{"a", "bc"}, {}}, 1);
  CHECK(other.Output(0) != run.Output(0));
  auto extra = RunProgram("checksum", {{"bytes", 3000000}}, {}, 1);
  CHECK(extra.Output(0).size() == 17 + 3000000);
  // Chunks generated at an offset are the same bytes as the whole stream.
  std::string whole = DeterministicBytes(42, 3 << 20);
  CHECK(DeterministicBytesAt(42, 1 << 20, 1 << 20) == whole.substr(1 << 20, 1 << 20));
}

TEST_CASE("Programs.WordCountTrioCountsWords") {
  auto dir = std::filesystem::temp_directory_path() / "copse-wc-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in.txt") << "a b a\nc a\n\nb\n";
  auto read = RunProgram("text.read_lines", {{"path", (dir / "in.txt").string()}}, {}, 2);
  REQUIRE(read.status.ok());
  std::vector<std::string> shard0, shard1;
  for (auto& m : read.outputs[0]->messages) shard0.emplace_back(m.view());
  for (auto& m : read.outputs[1]->messages) shard1.emplace_back(m.view());
  auto count = RunProgram("text.count_words", {}, {shard0, shard1}, 1);
  REQUIRE(count.status.ok());
  CHECK(count.Output(0) == "a\t3\nb\t2\nc\t1\n");
  auto merge = RunProgram("text.merge_counts", {}, {{count.Output(0)}, {"a\t2\nz\t1\n"}}, 1);
  REQUIRE(merge.status.ok());
  CHECK(merge.Output(0) == "a\t5\nb\t2\nc\t1\nz\t1\n");
  auto bad = RunProgram("text.merge_counts", {}, {{"nonsense\n"}}, 1);
  CHECK(bad.status.code() == StatusCode::kInvalidArgument);
  auto missing = RunProgram("text.read_lines", {{"path", "/no/such/file"}}, {}, 1);
  CHECK(missing.status.code() == StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Programs.ReadLinesSplitsLinesAsGetlineDoesAcrossItsReadChunks") {
  auto dir = std::filesystem::temp_directory_path() / ("copse-lines-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string long_line(3 << 20, 'x');  // spans read chunks
  for (const std::string& text : {std::string("a\nb\n"), std::string("no break at the end"), std::string("\n\nx\n\n"),
                                  "start\n" + long_line + "\nend", std::string()}) {
    std::ofstream(dir / "in.txt", std::ios::binary) << text;
    auto read = RunProgram("text.read_lines", {{"path", (dir / "in.txt").string()}}, {}, 1);
    REQUIRE(read.status.ok());
    std::string expected, line;
    std::istringstream in(text);
    while (std::getline(in, line)) expected += line + "\n";
    CHECK(read.Output(0) == expected);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("Programs.ReadLinesOfADeviceWithoutLineBreaksFailsAtItsMemoryLimit" * doctest::timeout(30)) {
  // The hostile test: text.read_lines of /dev/zero grew its daemon to 9.4 GB in 10 s.
  auto read = RunProgram("text.read_lines", {{"path", "/dev/zero"}}, {}, 1, "read[0]", [](VertexContext& ctx) {
    ctx.memory_limit_bytes = 64 << 20;
    ctx.memory_declared = true;
  });
  CHECK(read.status.code() == StatusCode::kResourceExhausted);
  CHECK(read.status.message().find("read[0] needs more than its resources.memory_mb of 64 MB") != std::string::npos);
  CHECK(read.status.message().find("/dev/zero has a line longer than that") != std::string::npos);
}

TEST_CASE("Programs.ACancelledReadLinesStopsReading" * doctest::timeout(30)) {
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  auto read = RunProgram("text.read_lines", {{"path", "/dev/zero"}}, {}, 1, "read[0]",
                         [&](VertexContext& ctx) { ctx.cancel_flag = &cancel; });
  canceller.join();
  CHECK(read.status.code() == StatusCode::kCancelled);
}

TEST_CASE("Programs.AnExecChildIsBoundByItsDeclaredMemory" * doctest::timeout(30)) {
  const Json params = {{"argv", {"sh", "-c", "head -c 300000000 /dev/zero | sort > /dev/null"}}};
  auto bounded = RunProgram("exec", params, {}, 0, "big[0]", [](VertexContext& ctx) {
    ctx.memory_limit_bytes = 64 << 20;
    ctx.memory_declared = true;
  });
  CHECK_FALSE(bounded.status.ok());
  MESSAGE(bounded.status.message());
  auto unbounded = RunProgram("exec", {{"argv", {"sh", "-c", "head -c 1000 /dev/zero | sort > /dev/null"}}}, {}, 0, "small[0]",
                              [](VertexContext& ctx) {
                                ctx.memory_limit_bytes = 64 << 20;
                                ctx.memory_declared = true;
                              });
  CHECK(unbounded.status.ok());
}

TEST_CASE("Programs.AnExecChildCannotSignalItsDaemon" * doctest::timeout(30)) {
  // The hostile test: an exec of `kill -STOP $PPID` froze one daemon after another. Where the
  // kernel allows PID namespaces (root), the child sees no process of the host.
  if (::geteuid() != 0) {
    MESSAGE("skipped: PID namespaces need root here");
    return;
  }
  const std::string daemon = std::to_string(::getpid());  // the test process hosts the program
  auto probe = RunProgram("exec", {{"argv", {"sh", "-c", "echo $$; kill -0 " + daemon}}}, {}, 1);
  CHECK_FALSE(probe.status.ok());  // no such process, from inside
  auto pid = RunProgram("exec", {{"argv", {"sh", "-c", "echo $$"}}}, {}, 1);
  REQUIRE(pid.status.ok());
  CHECK(pid.Output(0) == "2\n");  // in a namespace of its own, after its init
  // As an ordinary process there, it may signal itself; the status it ends with is its own.
  // The daemon's workers block SIGTERM (its signal thread stops it): the program must not.
  sigset_t term, before;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &before);
  auto self = RunProgram("exec", {{"argv", {"sh", "-c", "kill -TERM $$; sleep 5"}}}, {}, 0);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  CHECK(self.status.message().find("was killed by signal 15") != std::string::npos);
  auto code = RunProgram("exec", {{"argv", {"sh", "-c", "exit 7"}}}, {}, 0);
  CHECK(code.status.message().find("exited with status 7") != std::string::npos);
}

TEST_CASE("Programs.AnExecChildThatFailsOnAFullDiskSaysSo" * doctest::timeout(30)) {
  // The hostile test: an exec vertex's error on a full disk was lost (its stderr could not be
  // written), leaving "stderr: " and nothing. A 64 KiB tmpfs stands for the full disk.
  namespace fs = std::filesystem;
  const fs::path small = fs::temp_directory_path() / ("copse-full-disk-" + std::to_string(::getpid()));
  fs::create_directories(small);
  if (std::system(("mount -t tmpfs -o size=64k copse-test " + small.string() + " 2>/dev/null").c_str()) != 0) {
    fs::remove_all(small);
    MESSAGE("skipped: cannot mount a small tmpfs here");
    return;
  }
  auto run = RunProgram("exec", {{"argv", {"sh", "-c", "head -c 1000000 /dev/zero; echo failed >&2; exit 3"}}}, {}, 1, "full[0]",
                        [&](VertexContext& ctx) { ctx.scratch_dir = small / "scratch"; });
  CHECK_FALSE(run.status.ok());
  // Its standard error is a pipe to its attempt's log, which a full disk cannot lose.
  CHECK_MESSAGE(run.status.message().find("is full") != std::string::npos, run.status.message());
  CHECK_MESSAGE(run.status.message().find("No space left on device\nfailed") != std::string::npos, run.status.message());
  CHECK(std::system(("umount " + small.string()).c_str()) == 0);
  fs::remove_all(small);
}

TEST_CASE("Programs.WhatAVertexPrintsGoesToItsAttemptLog") {
  // An exec child's standard error, and its standard output when that is not output 0, are
  // kept with its attempt whether it succeeds or not; so are an in-process program's log lines.
  AttemptLog log;
  auto run = RunProgram("exec", {{"argv", {"sh", "-c", "echo to-stdout; echo to-stderr >&2"}}, {"stdout", false}}, {}, 0, "v[0]",
                        [&](VertexContext& ctx) { ctx.attempt_log = &log; });
  REQUIRE_MESSAGE(run.status.ok(), run.status.ToString());
  log.Finish();
  std::map<std::string, std::string> streams;
  for (const auto& c : log.Take()) streams[c.stream] += c.text;
  CHECK(streams["stdout"] == "to-stdout\n");
  CHECK(streams["stderr"] == "to-stderr\n");

  AttemptLog own;
  VertexContext ctx;
  ctx.name = "p[0]";
  ctx.attempt_log = &own;
  ctx.log().info("step {} done", 3);
  ctx.log().debug("not kept: below info");
  own.Finish();
  auto chunks = own.Take();
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].stream == "log");
  CHECK(chunks[0].text.find("info step 3 done\n") != std::string::npos);
}

TEST_CASE("Programs.AnAttemptLogKeepsItsHeadAndTail") {
  AttemptLog log;
  const std::string line(1023, 'x');
  for (int i = 0; i < 1024; ++i) log.Append("stderr", line + (i == 0 ? "F" : i == 1023 ? "L" : "\n"));
  const auto head = log.Take();  // while it runs: the head only
  size_t head_bytes = 0;
  for (const auto& c : head) head_bytes += c.stream == "stderr" ? c.text.size() : 0;
  CHECK(head_bytes == AttemptLog::kHeadBytes);
  CHECK(head.front().text.substr(1023, 1) == "F");
  CHECK(head.back().stream == "copse");  // where the head ends, though no write straddled it
  CHECK(head.back().text.find("passed 256 KiB") != std::string::npos);
  log.Finish();
  const auto rest = log.Take();
  REQUIRE(rest.size() >= 2);
  CHECK(rest.front().stream == "copse");
  CHECK(rest.front().text.find("bytes left out here") != std::string::npos);
  CHECK(rest.back().text.back() == 'L');
  CHECK(rest.back().text.size() == AttemptLog::kTailBytes);
  CHECK(log.Take().empty());
}

TEST_CASE("Programs.ExecExitCodesListedAsNoRetryAreDeterministic") {
  auto run = RunProgram("exec", {{"argv", {"sh", "-c", "echo no input >&2; exit 66"}}, {"no_retry_exit_codes", {66}}}, {}, 0);
  CHECK(run.status.code() == StatusCode::kInvalidArgument);
  CHECK(IsDeterministicError(run.status.code()));
  CHECK(run.status.message().find("stderr: no input") != std::string::npos);
  auto other = RunProgram("exec", {{"argv", {"sh", "-c", "exit 3"}}, {"no_retry_exit_codes", {66}}}, {}, 0);
  CHECK_FALSE(IsDeterministicError(other.status.code()));
  auto missing = RunProgram("text.read_lines", {{"path", "no-such-file.txt"}}, {}, 1);
  CHECK(IsDeterministicError(missing.status.code()));
}

TEST_CASE("Programs.ExecRunsAChildWithInputsAndOutputs") {
  auto run = RunProgram("exec", {{"argv", {"tr", "a-z", "A-Z"}}, {"stdin", true}}, {{"hello ", "world"}}, 1);
  REQUIRE_MESSAGE(run.status.ok(), run.status.ToString());
  CHECK(run.Output(0) == "HELLO WORLD");
  auto files = RunProgram(
      "exec", {{"argv", {"sh", "-c", "cat {input0} {input1} > $COPSE_OUTPUT_0; echo $COPSE_REPLICA"}}, {"stdout", false}},
      {{"x"}, {"y"}}, 1);
  REQUIRE_MESSAGE(files.status.ok(), files.status.ToString());
  CHECK(files.Output(0) == "xy");
  auto fail = RunProgram("exec", {{"argv", {"sh", "-c", "echo boom >&2; exit 3"}}}, {}, 0);
  CHECK_FALSE(fail.status.ok());
  CHECK(fail.status.message().find("exited with status 3") != std::string::npos);
  CHECK(fail.status.message().find("boom") != std::string::npos);
}

TEST_CASE("Programs.AParamOfTheWrongTypeIsAnErrorNamingTheKey") {
  Json params = {{"batch", "64"}, {"sleep_ms", 5}};
  VertexContext ctx;
  ctx.params = &params;
  CHECK(ctx.param<int64_t>("sleep_ms", 0) == 5);
  CHECK(ctx.param<int64_t>("absent", 7) == 7);
  try {
    (void)ctx.param<int64_t>("batch", 128);
    FAIL("no ParamError");
  } catch (const ParamError& e) {
    CHECK(std::string(e.what()) == "param \"batch\": expected a number, got \"64\"");
  }
  CHECK_THROWS_AS((void)ctx.param<std::string>("sleep_ms", ""), ParamError);
}

TEST_CASE("Programs.RegistryRejectsUnknownAndDuplicateNames") {
  ProgramRegistry r;
  RegisterBuiltinPrograms(r);
  CHECK(r.Contains("checksum"));
  CHECK(r.Register("noop", nullptr).code() == StatusCode::kAlreadyExists);
  CHECK(r.Create("nope").status().code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace copse::vertex
