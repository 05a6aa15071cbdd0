// Writes the harnesses' seed corpora (fuzz/corpus/<name>/) from the project's own code, so
// that seeds follow the formats when they change:
//   make_seeds SOURCE_DIR OUT_DIR
//   - job_file: every example job of at most 16 KB (SOURCE_DIR/examples/**.json);
//   - journal: the journal a scheduler writes while running a few examples to completion on
//     two daemons, whole and cut mid-job;
//   - wire: frames of every message that scheduler sent its daemons, of what daemons send (a
//     registration, heartbeat, report, vertex log), of the handshake's JSON and of the data
//     plane (a fetch, a ping, their verdicts);
//   - tensor: encodings of float32, bfloat16, float16, scalar, empty and multi-tensor sets;
//   - output_store: output files a real store wrote, in the harness's input layout;
//   - client_request: a request of every kind a client sends (status, logs, chaos, ...).
// Run by hand after a format changes (docs/fuzzing.md); the output is committed.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "channels/buffer.h"
#include "channels/output_store.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "common/wire.h"
#include "fuzz/succeeded.h"
#include "jobmanager/job_loader.h"
#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"
#include "ml/serialize.h"
#include "protocol/codec.h"
#include "protocol/keys.h"

namespace fs = std::filesystem;
using copse::Json;

namespace {

void Write(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

std::string ReadAll(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CapturingSink final : public copse::jm::DaemonSink {
 public:
  void SendToDaemon(copse::DaemonId, const copse::protocol::JmToDaemon& message) override { sent.push_back(message); }
  std::vector<copse::protocol::JmToDaemon> sent;
};

/// Runs `job_files` to completion on two daemons, journaling; returns what was sent.
std::vector<copse::protocol::JmToDaemon> RunJobs(const std::vector<fs::path>& job_files, const fs::path& journal_dir,
                                                 std::vector<copse::protocol::DaemonToJm>* reports) {
  fs::remove_all(journal_dir);
  fs::create_directories(journal_dir);
  auto journal = copse::jm::Journal::Open(journal_dir, false);
  if (!journal.ok()) throw std::runtime_error(journal.status().ToString());
  copse::ManualClock clock;
  CapturingSink sink;
  copse::jm::Scheduler scheduler(sink, clock);
  scheduler.set_journal(journal->get());
  for (const char* name : {"d0", "d1"}) {
    copse::jm::DaemonSpec d;
    d.name = name;
    d.cpus = 4;
    d.labels = {{"host", name}};
    (void)scheduler.AddDaemon(d);
  }
  for (const auto& file : job_files) {
    auto load = copse::jm::LoadJobFile(file.string(), copse::jm::ProgramCatalog::AcceptAny());
    if (!load.ok()) throw std::runtime_error(load.status().ToString());
    scheduler.Submit(load.graph, file.parent_path().string());
  }
  size_t next = 0;
  for (int round = 0; round < 10000 && next <= sink.sent.size(); ++round) {
    scheduler.Flush();
    (void)(*journal)->Flush();
    if (next == sink.sent.size()) break;
    for (; next < sink.sent.size(); ++next) {
      if (!sink.sent[next].has_run()) continue;
      for (const auto& task : sink.sent[next].run().tasks()) {
        scheduler.OnAttemptFinished(copse::fuzz::Succeeded(task));
        if (reports && reports->size() < 4) {
          copse::protocol::DaemonToJm m;
          auto& a = *m.mutable_report()->add_attempts();
          a.set_job(task.job());
          a.set_vertex(task.vertex());
          a.set_version(task.version());
          a.set_ok(true);
          for (int p = 0; p < task.outputs_size(); ++p) {
            a.add_output_bytes(10);
            a.add_output_messages(1);
          }
          a.set_duration_ms(1.5);
          reports->push_back(m);
        }
      }
    }
    clock.Advance(std::chrono::milliseconds(100));
    scheduler.Tick();
  }
  (void)(*journal)->Flush();
  return sink.sent;
}

void JobFileSeeds(const fs::path& src, const fs::path& out) {
  for (const auto& entry : fs::recursive_directory_iterator(src / "examples")) {
    // The generated training jobs (hundreds of KB) are beyond the harness's 16 KB inputs.
    if (entry.path().extension() != ".json" || entry.file_size() > 16384) continue;
    std::string name = fs::relative(entry.path(), src / "examples").string();
    for (char& c : name) c = c == '/' ? '_' : c;
    Write(out / "job_file" / name, ReadAll(entry.path()));
  }
}

void JournalAndWireSeeds(const fs::path& src, const fs::path& out, const fs::path& scratch) {
  const std::vector<std::vector<std::string>> sets = {
      {"diamond.json"}, {"wordcount/wordcount.json"}, {"stream_pipeline.json", "diamond.json"}};
  std::vector<copse::protocol::DaemonToJm> reports;
  std::vector<copse::protocol::JmToDaemon> sent;
  int n = 0;
  for (const auto& set : sets) {
    std::vector<fs::path> files;
    for (const auto& name : set) files.push_back(src / "examples" / name);
    auto messages = RunJobs(files, scratch / "journal", &reports);
    if (sent.empty()) sent = messages;
    // The harness's mode byte first (journal_fuzzer.cc): 0 matches checksums, 1 takes the file as it is.
    const std::string journal = ReadAll(scratch / "journal" / copse::jm::Journal::kFileName);
    Write(out / "journal" / ("run" + std::to_string(n)), std::string(1, '\0') + journal);
    // Cut mid-job, mid-record: a job manager killed while writing.
    Write(out / "journal" / ("run" + std::to_string(n) + "-cut"),
          std::string(1, '\1') + journal.substr(0, journal.size() * 2 / 3));
    ++n;
  }
  // Frames: each message the scheduler sent, one per seed; and the conversation whole.
  std::string conversation;
  std::map<std::string, int> kinds;
  for (const auto& m : sent) {
    const std::string frame = copse::protocol::EncodeFrame(m);
    conversation += frame;
    const std::string kind(copse::protocol::BodyName(m));
    if (kinds[kind]++ < 2) Write(out / "wire" / ("jm-" + kind + std::to_string(kinds[kind])), frame);
  }
  Write(out / "wire" / "jm-conversation", conversation);
  copse::protocol::DaemonToJm reg;
  auto& r = *reg.mutable_register_();
  r.set_name("d0");
  r.set_cpus(4);
  r.set_memory_mb(8192);
  (*r.mutable_labels())["host"] = "h0";
  r.set_data_host("10.0.0.2");
  r.set_data_port(7001);
  r.mutable_stream()->set_tcp("tcp://10.0.0.2:7002");
  r.mutable_stream()->set_ipc("ipc:///tmp/copse-d0");
  r.mutable_stream()->set_host("h0");
  *r.add_outputs() = copse::protocol::MakeOutputKey(1, 2, 1, 0);
  Write(out / "wire" / "daemon-register", copse::protocol::EncodeFrame(reg));
  copse::protocol::DaemonToJm beat;
  beat.mutable_heartbeat();
  Write(out / "wire" / "daemon-heartbeat", copse::protocol::EncodeFrame(beat));
  for (size_t i = 0; i < reports.size() && i < 2; ++i) {
    Write(out / "wire" / ("daemon-report" + std::to_string(i)), copse::protocol::EncodeFrame(reports[i]));
  }
  copse::protocol::DaemonToJm log;
  log.mutable_vertex_log()->set_job(1);
  log.mutable_vertex_log()->set_vertex(2);
  log.mutable_vertex_log()->set_version(1);
  auto& chunk = *log.mutable_vertex_log()->add_chunks();
  chunk.set_stream("stderr");
  chunk.set_text("loss 0.5\n");
  Write(out / "wire" / "daemon-vertex-log", copse::protocol::EncodeFrame(log));
  // The handshake, each side's JSON frames.
  const std::string secret(64, 'a');
  const Json hello = {{"op", "hello"}, {"nonce", "0123456789abcdef0123456789abcdef"}};
  auto answer = copse::auth::AnswerHello(hello, secret, "client");
  const Json welcome = copse::auth::Welcome(answer->message, secret, "0123456789abcdef0123456789abcdef");
  const auto json_frame = [](const Json& j) {
    return copse::wire::EncodeFrame(copse::wire::FrameType::kJson, copse::DumpJson(j));
  };
  Write(out / "wire" / "handshake", json_frame(hello) + json_frame(answer->message) + json_frame(welcome));
  Write(out / "wire" / "client-submit",
        json_frame({{"op", "submit"}, {"doc", copse::ParseJson(ReadAll(src / "examples" / "diamond.json"), "diamond").value()}}));
  // The data plane (protocol/data.proto): a fetch, a ping and their answers' verdicts.
  copse::protocol::DataRequest fetch;
  fetch.mutable_fetch()->mutable_key()->set_job(1);
  fetch.mutable_fetch()->mutable_key()->set_version(1);
  fetch.mutable_fetch()->set_wait_ms(100);
  Write(out / "wire" / "data-fetch", copse::protocol::EncodeFrame(fetch));
  copse::protocol::DataRequest ping;
  ping.mutable_ping();
  copse::protocol::DataReply pong;
  pong.mutable_pong();
  Write(out / "wire" / "data-ping-pong", copse::protocol::EncodeFrame(ping) + copse::protocol::EncodeFrame(pong));
  copse::protocol::FetchEnd end;
  end.set_ok(true);
  end.set_messages(2);
  end.set_bytes(10);
  Write(out / "wire" / "end-status", copse::wire::EncodeFrame(copse::wire::FrameType::kEnd, end.SerializeAsString()));
  end.Clear();
  end.set_code("NotFound");
  end.set_message("no output job1/v0.v1/p0");
  Write(out / "wire" / "end-not-found", copse::wire::EncodeFrame(copse::wire::FrameType::kEnd, end.SerializeAsString()));
}

void TensorSeeds(const fs::path& out) {
  using copse::ml::Tensor;
  const Tensor a = Tensor::FromVector({2, 3}, {1, -2, 3.5f, 0, 1e-8f, -7});
  const std::vector<std::pair<std::string, copse::ml::NamedTensors>> sets = {
      {"f32", {{"w", a}}},
      {"bf16", {{"w", a.Cast(copse::ml::DType::kBFloat16)}}},
      {"f16", {{"w", a.Cast(copse::ml::DType::kFloat16)}}},
      {"scalar", {{"loss", Tensor::FromVector({}, {0.25f})}}},
      {"empty", {{"e", Tensor::Zeros({0, 4})}}},
      {"set", {{"layer0.w", a}, {"layer0.b", Tensor::Full({3}, 0.5f)}, {"step", Tensor::FromVector({1}, {3})}}},
  };
  for (const auto& [name, tensors] : sets) {
    const std::string bytes = copse::ml::SerializeTensors(tensors);
    Write(out / "tensor" / (name + "-whole"), std::string(1, '\0') + bytes);
    Write(out / "tensor" / (name + "-body"), std::string(1, '\1') + bytes.substr(0, bytes.size() - 8));
  }
}

void OutputStoreSeeds(const fs::path& out, const fs::path& scratch) {
  const fs::path dir = scratch / "store";
  fs::remove_all(dir);
  std::string input;  // the harness's layout: u8 flags | u8 name length | name | u16 length | content
  {
    auto store = copse::chan::OutputStore::Make(dir, 1 << 20);
    int n = 0;
    for (const std::vector<std::string>& messages :
         std::vector<std::vector<std::string>>{{"hello", "world"}, {std::string(300, 'x')}, {"", "a", "bc"}}) {
      auto writer = (*store)->CreateWriter({1, static_cast<uint32_t>(n), 1, 0}, copse::chan::StorageKind::kFile);
      for (const auto& m : messages) (void)(*writer)->Write(copse::chan::Buffer::Copy(m));
      (void)(*writer)->Close();
      ++n;
    }
  }
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir / "job1")) {
    const std::string name = entry.path().filename().string();
    const std::string content = ReadAll(entry.path());
    std::string one;
    one += static_cast<char>(1);  // job1/, content as written (magic included)
    one += static_cast<char>(name.size());
    one += name;
    one += static_cast<char>(content.size() & 0xff);
    one += static_cast<char>(content.size() >> 8);
    one += content;
    Write(out / "output_store" / ("file" + std::to_string(n++)), one);
    input += one;
  }
  Write(out / "output_store" / "files", input);
}

void ClientRequestSeeds(const fs::path& out) {
  const std::vector<std::pair<std::string, Json>> requests = {
      {"status", {{"op", "status"}, {"job", 1}}},
      {"status-all", {{"op", "status"}}},
      {"jobs", {{"op", "jobs"}, {"since_unix_ms", 0}}},
      {"logs", {{"op", "logs"}, {"job", 2}, {"vertex", "a[0]"}}},
      {"logs-job", {{"op", "logs"}, {"job", 1}}},
      {"vertex-log", {{"op", "vertex_log"}, {"job", 1}, {"vertex", "c[0]"}, {"attempt", 0}, {"from", 0}}},
      {"outputs", {{"op", "outputs"}, {"job", 1}}},
      {"cancel", {{"op", "cancel"}, {"job", 2}}},
      {"daemons", {{"op", "daemons"}}},
      {"chaos-kill", {{"op", "chaos"}, {"action", "kill"}, {"daemon", "d0"}}},
      {"chaos-cut", {{"op", "chaos"}, {"action", "cut"}, {"daemon", "d1"}, {"ms", 500}}},
      {"chaos-fail", {{"op", "chaos"}, {"action", "fail"}, {"job", 2}, {"vertex", "b[1]"}, {"attempts", {2, 3}}}},
      {"chaos-delay", {{"op", "chaos"}, {"action", "delay"}, {"job", 2}, {"vertex", "c[0]"}, {"ms", 100}}},
      {"chaos-corrupt", {{"op", "chaos"}, {"action", "corrupt"}, {"job", 2}, {"vertex", "a[1]"}}},
      {"chaos-drop", {{"op", "chaos"}, {"action", "drop"}, {"job", 2}, {"vertex", "a[2]"}}},
      {"vertices", {{"op", "status"}, {"job", 2}, {"stage", "b"}, {"state", "waiting"}, {"offset", 1}, {"limit", 5}}},
  };
  for (const auto& [name, request] : requests) Write(out / "client_request" / (name + ".json"), copse::DumpJson(request));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_seeds SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  copse::SetLogLevel("off");
  const fs::path src = argv[1], out = argv[2];
  const fs::path scratch = fs::temp_directory_path() / ("copse-make-seeds-" + std::to_string(::getpid()));
  JobFileSeeds(src, out);
  JournalAndWireSeeds(src, out, scratch);
  TensorSeeds(out);
  OutputStoreSeeds(out, scratch);
  ClientRequestSeeds(out);
  fs::remove_all(scratch);
  std::cout << "seeds written to " << out.string() << "\n";
  return 0;
}
