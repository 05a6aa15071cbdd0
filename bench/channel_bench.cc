// Throughput of the file and memory channels (issue: data plane).
//
//   channel_bench [--mib N] [--msg-kib K] [--runs R] [--dir PATH]
//
// Pushes N MiB (default 1024) in K KiB messages (default 1024) through:
//   * a `memory` output written and read back on the same daemon (zero-copy reads),
//   * a `file` output written and read back on the same daemon (page cache, checksums verified),
//   * a remote fetch: a producer daemon (OutputStore + DataServer) in a forked child process, the
//     consumer (its own OutputStore + DataServer) in this process, over TCP on 127.0.0.1,
//   * the same fetch over TLS (a second data server of the producer, with a cluster certificate
//     made for the run: what a cluster with `copse jm --tls` does between hosts),
//   * the same fetch through the producer's same-host local socket (data_server.h: a memory
//     output streamed over a Unix domain socket, a file output handed over as its descriptor),
//   * raw ZeroMQ PUSH/PULL over TCP on 127.0.0.1 between the same two processes, zero-copy sends,
//     as the yardstick for the remote fetch.
// Prints the median of R runs (default 5) of each; GB/s means 1e9 bytes per second.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "bench/flags.h"
#include "channels/data_server.h"
#include "channels/output_store.h"
#include "channels/remote_reader.h"

using namespace copse;
using namespace copse::chan;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "channel-bench-secret-0123456789abcdef";
const std::string kHost = "127.0.0.1";

struct Config {
  size_t mib = 1024;
  size_t msg_kib = 1024;
  int runs = 5;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("copse-channel-bench-" + std::to_string(getpid()));
  size_t messages() const { return mib * 1024 / msg_kib; }
  size_t msg_bytes() const { return msg_kib * 1024; }
  double total_bytes() const { return static_cast<double>(messages() * msg_bytes()); }
};

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "channel_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

void Check(const Status& st, const std::string& what) {
  if (!st.ok()) Die(what, st);
}

/// Distinct messages (so reads and checksums do not run from cache).
std::vector<Buffer> MakeMessages(const Config& c) {
  std::vector<Buffer> out;
  out.reserve(c.messages());
  for (size_t i = 0; i < c.messages(); ++i) {
    std::string s(c.msg_bytes(), static_cast<char>(i));
    for (size_t k = 0; k + 8 <= s.size(); k += 4096) std::memcpy(s.data() + k, &i, sizeof i);
    out.emplace_back(std::move(s));
  }
  return out;
}

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void Write(OutputStore& store, const OutputKey& key, StorageKind kind, const std::vector<Buffer>& msgs) {
  auto w = Check(store.CreateWriter(key, kind), "create writer");
  for (const auto& m : msgs) Check(w->Write(m), "write");
  Check(w->Close(), "close");
}

/// Drains a reader; returns bytes read.
uint64_t Drain(ChannelReader& r) {
  uint64_t bytes = 0;
  for (;;) {
    auto m = Check(r.Next(), "read");
    if (!m) return bytes;
    bytes += m->size();
  }
}

// ---- the producer daemon (child process) ----------------------------------------------------

struct ChildPorts {
  uint16_t data = 0;
  uint16_t tls_data = 0;
  uint16_t zmq = 0;
};

/// Runs in the child: stores the outputs, serves them, and answers ZeroMQ send requests read
/// from `cmd` ('z': send every message over PUSH; 'q': exit).
[[noreturn]] void ProducerMain(const Config& c, int cmd, int reply) {
  auto msgs = MakeMessages(c);
  auto store = Check(OutputStore::Make(c.dir / "producer", 4ull << 30), "producer store");
  Write(*store, {1, 0, 0, 0}, StorageKind::kMemory, msgs);
  Write(*store, {1, 1, 0, 0}, StorageKind::kFile, msgs);
  auto server = Check(DataServer::Start(*store, kHost, 0, kSecret), "producer data server");
  DataServerOptions tls_options;
  tls_options.local_socket = false;
  tls_options.tls = Check(copse::tls::Context::Load(c.dir / "tls"), "TLS directory");
  auto tls_server = Check(DataServer::Start(*store, kHost, 0, kSecret, tls_options), "producer TLS data server");
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 64);
  push.bind("tcp://127.0.0.1:*");
  std::string endpoint = push.get(zmq::sockopt::last_endpoint);
  ChildPorts ports{server->port(), tls_server->port(),
                   static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)))};
  (void)!::write(reply, &ports, sizeof ports);
  char op;
  while (::read(cmd, &op, 1) == 1 && op == 'z') {
    for (const auto& m : msgs) {
      zmq::message_t zm(const_cast<char*>(m.data()), m.size(), nullptr, nullptr);  // zero-copy
      push.send(zm, zmq::send_flags::none);
    }
  }
  server->Stop();
  tls_server->Stop();
  ::_exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return copse::bench::FlagValue(argc, argv, &i); };
    if (a == "--mib")
      c.mib = std::stoul(next());
    else if (a == "--msg-kib")
      c.msg_kib = std::stoul(next());
    else if (a == "--runs")
      c.runs = std::stoi(next());
    else if (a == "--dir")
      c.dir = next();
    else {
      std::fprintf(stderr, "usage: channel_bench [--mib N] [--msg-kib K] [--runs R] [--dir PATH]\n");
      return 2;
    }
  }
  std::filesystem::create_directories(c.dir);
  Check(copse::tls::CreateClusterCertificateIfAbsent(c.dir / "tls"), "TLS certificate");

  // Fork first, while this process has no threads.
  int cmd[2], reply[2];
  if (::pipe(cmd) != 0 || ::pipe(reply) != 0) return 1;
  pid_t child = ::fork();
  if (child < 0) return 1;
  if (child == 0) {
    ::close(cmd[1]);
    ::close(reply[0]);
    ProducerMain(c, cmd[0], reply[1]);
  }
  ::close(cmd[0]);
  ::close(reply[1]);

  auto msgs = MakeMessages(c);
  const double gb = c.total_bytes() / 1e9;
  std::printf("channel_bench: %zu MiB in %zu KiB messages, median of %d runs (GB/s = 1e9 bytes/s)\n", c.mib, c.msg_kib, c.runs);

  auto store = Check(OutputStore::Make(c.dir / "consumer", 4ull << 30), "consumer store");
  auto server = Check(DataServer::Start(*store, kHost, 0, kSecret), "consumer data server");
  std::vector<double> mem_write, mem_read, mem_read_nv, file_write, file_read;
  for (int r = 0; r < c.runs; ++r) {
    OutputKey mk{2, 0, static_cast<uint32_t>(r), 0}, fk{2, 1, static_cast<uint32_t>(r), 0};
    auto t0 = Clock::now();
    Write(*store, mk, StorageKind::kMemory, msgs);
    mem_write.push_back(gb / Seconds(t0));
    store->set_verify_memory_reads(true);
    t0 = Clock::now();
    auto rd = Check(store->OpenReader(mk), "open memory");
    Drain(*rd);
    mem_read.push_back(gb / Seconds(t0));
    store->set_verify_memory_reads(false);
    t0 = Clock::now();
    rd = Check(store->OpenReader(mk), "open memory");
    Drain(*rd);
    mem_read_nv.push_back(gb / Seconds(t0));
    store->Drop(mk);

    t0 = Clock::now();
    Write(*store, fk, StorageKind::kFile, msgs);
    file_write.push_back(gb / Seconds(t0));
    t0 = Clock::now();
    rd = Check(store->OpenReader(fk), "open file");
    Drain(*rd);
    file_read.push_back(gb / Seconds(t0));
    store->Drop(fk);
  }
  msgs.clear();

  ChildPorts ports;
  if (::read(reply[0], &ports, sizeof ports) != static_cast<ssize_t>(sizeof ports)) {
    std::fprintf(stderr, "channel_bench: the producer process failed\n");
    return 1;
  }
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvhwm, 64);
  pull.connect("tcp://127.0.0.1:" + std::to_string(ports.zmq));

  std::vector<double> remote_mem, remote_file, local_mem, local_file, zmq_rate, tls_mem, tls_file;
  RemoteReaderOptions tcp, local, tls;
  tcp.local_socket = false;
  local.local_socket = true;
  tls.local_socket = false;
  tls.tls = Check(copse::tls::Context::Load(c.dir / "tls"), "TLS directory");
  // A fetch timed from the request to the last message read (and released).
  auto fetch = [&](const OutputKey& key, const RemoteReaderOptions& o, std::vector<double>& rates, bool timed) {
    auto t0 = Clock::now();
    auto rd = Check(OpenRemoteReader(kHost, o.tls ? ports.tls_data : ports.data, key, kSecret, o), "open remote output");
    uint64_t bytes = Drain(*rd);
    rd.reset();
    double s = Seconds(t0);
    if (bytes != c.total_bytes()) std::exit(1);
    if (timed) rates.push_back(gb / s);
  };
  // One untimed warm-up of each (connection set-up, page faults in the producer), then
  // alternate so that noise on this shared machine hits every path alike.
  for (int r = -1; r < c.runs; ++r) {
    fetch({1, 0, 0, 0}, tcp, remote_mem, r >= 0);
    fetch({1, 1, 0, 0}, tcp, remote_file, r >= 0);
    fetch({1, 0, 0, 0}, tls, tls_mem, r >= 0);
    fetch({1, 1, 0, 0}, tls, tls_file, r >= 0);
    fetch({1, 0, 0, 0}, local, local_mem, r >= 0);
    fetch({1, 1, 0, 0}, local, local_file, r >= 0);

    auto t0 = Clock::now();
    (void)!::write(cmd[1], "z", 1);
    for (size_t i = 0; i < c.messages(); ++i) {
      zmq::message_t m;
      (void)pull.recv(m, zmq::recv_flags::none);
    }
    double s = Seconds(t0);
    if (r >= 0) zmq_rate.push_back(gb / s);
  }
  (void)!::write(cmd[1], "q", 1);
  ::waitpid(child, nullptr, 0);
  server->Stop();

  auto row = [](const char* what, const std::vector<double>& v) {
    std::printf("  %-66s %8.2f GB/s  (min %.2f, max %.2f)\n", what, Median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  };
  row("memory output: write (xxh3 per message)", mem_write);
  row("memory output: local read, zero-copy, checksums verified", mem_read);
  row("memory output: local read, zero-copy, verification off", mem_read_nv);
  row("file output: write (page cache, no fsync)", file_write);
  row("file output: local read, checksums verified", file_read);
  row("remote fetch of a memory output (other process, TCP 127.0.0.1)", remote_mem);
  row("remote fetch of a file output (other process, TCP 127.0.0.1)", remote_file);
  row("remote fetch of a memory output over TLS (other process, TCP)", tls_mem);
  row("remote fetch of a file output over TLS (other process, TCP)", tls_file);
  row("same-host fetch of a memory output (other process, local socket)", local_mem);
  row("same-host fetch of a file output (other process, its descriptor)", local_file);
  row("raw ZeroMQ PUSH/PULL (other process, TCP 127.0.0.1, zero-copy send)", zmq_rate);
  std::printf("  remote fetch (memory output) / raw ZeroMQ: %.2f\n", Median(remote_mem) / Median(zmq_rate));
  std::printf("  TLS / plaintext TCP fetch: memory output %.2f, file output %.2f\n", Median(tls_mem) / Median(remote_mem),
              Median(tls_file) / Median(remote_file));
  std::printf("  same-host / TCP fetch: memory output %.2f, file output %.2f\n", Median(local_mem) / Median(remote_mem),
              Median(local_file) / Median(remote_file));
  std::filesystem::remove_all(c.dir);
  return 0;
}
