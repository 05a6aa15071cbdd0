// Throughput and latency of the live channels (issue 4): `stream` between two processes next to
// raw ZeroMQ PUSH/PULL, `shm` inside one process, and 64-byte message latency.
//
//   stream_bench [--mib N] [--runs R] [--pings P] [--window-mib W]
//
// A forked child process plays the producer daemon: it runs its own StreamHub and serves
// commands from this process (the consumer daemon, with its own hub) over a pipe:
//   * stream, tcp: N MiB in 1 MiB messages (default 1024) over tcp://127.0.0.1, default window
//     (8 MiB / 64 messages, or W MiB); the producer sends pre-built Buffers (zero-copy), the consumer's
//     reader turns each message into a Buffer (one copy) — what a vertex sees;
//   * stream, ipc: the same over ipc:// (what same-host daemons use);
//   * stream, tcp, CurveZMQ: the same between encrypting hubs (a cluster with TLS on), and the
//     latency below over them too;
//   * raw ZeroMQ PUSH/PULL, 1 MiB messages, zero-copy sends, over tcp:// and ipc://;
//   * latency: P (default 20000) 64-byte ping-pongs child<->parent over two streams, reported as
//     half the round trip (p50/p99), over tcp:// and ipc://; and over shm between two threads.
// shm throughput: N MiB of pre-built 1 MiB Buffers between two threads of this process.
// Each figure is the median of R runs (default 5); GB/s means 1e9 bytes per second.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "channels/shm_registry.h"
#include "channels/stream_hub.h"

using namespace copse;
using namespace copse::chan;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "stream-bench-secret-0123456789abcdef";
constexpr size_t kMsg = 1 << 20;
constexpr size_t kSmall = 64;

// Length-prefixed JSON over a pipe.
void Send(int fd, const Json& j) {
  std::string t = j.dump();
  uint32_t n = static_cast<uint32_t>(t.size());
  (void)!::write(fd, &n, sizeof n);
  (void)!::write(fd, t.data(), t.size());
}
Json Recv(int fd) {
  uint32_t n = 0;
  if (::read(fd, &n, sizeof n) != sizeof n) return Json{{"op", "exit"}};
  std::string t(n, '\0');
  size_t got = 0;
  while (got < n) {
    auto r = ::read(fd, t.data() + got, n - got);
    if (r <= 0) return Json{{"op", "exit"}};
    got += static_cast<size_t>(r);
  }
  return Json::parse(t);
}

std::vector<Buffer> Pool(size_t size) {
  std::vector<Buffer> pool;
  for (int i = 0; i < 8; ++i) pool.emplace_back(std::string(size, static_cast<char>('a' + i)));
  return pool;
}

// The producer daemon.
[[noreturn]] void Child(int in, int out, std::filesystem::path dir) {
  auto hub = StreamHub::Start("127.0.0.1", 0, dir / "child-ipc", kSecret);
  auto curve_hub = StreamHub::Start("127.0.0.1", 0, dir / "child-ipc-curve", kSecret, /*encrypt=*/true);
  if (!hub.ok() || !curve_hub.ok()) ::_exit(3);
  Send(out, Json{{"plain", (*hub)->endpoints().ToJson()}, {"curve", (*curve_hub)->endpoints().ToJson()}});
  auto pool = Pool(kMsg);
  zmq::context_t ctx(1);
  for (;;) {
    Json cmd = Recv(in);
    std::string op = cmd["op"];
    if (op == "exit") break;
    StreamHub& h = cmd.value("curve", false) ? **curve_hub : **hub;
    if (op == "stream") {
      auto key = StreamKey::FromJson(cmd["key"]).value();
      StreamOptions o;
      o.window_bytes = cmd["window"];
      auto w = h.OpenWriter(*StreamPeer::FromJson(cmd["peer"]), key, o);
      if (!w.ok()) ::_exit(4);
      uint64_t n = cmd["messages"];
      for (uint64_t i = 0; i < n; ++i)
        if (!(*w)->Write(pool[i % pool.size()]).ok()) ::_exit(5);
      if (!(*w)->Close().ok()) ::_exit(5);
    } else if (op == "zmq") {
      zmq::socket_t push(ctx, zmq::socket_type::push);
      push.set(zmq::sockopt::sndhwm, 64);
      push.connect(cmd["endpoint"].get<std::string>());
      uint64_t n = cmd["messages"];
      for (uint64_t i = 0; i < n; ++i) {
        const Buffer& b = pool[i % pool.size()];
        zmq::message_t m(const_cast<char*>(b.data()), b.size(), nullptr, nullptr);  // zero-copy
        push.send(m, zmq::send_flags::none);
      }
      push.set(zmq::sockopt::linger, -1);
    } else if (op == "pong") {
      auto key = StreamKey::FromJson(cmd["key"]).value();
      auto r = h.OpenReader(key, {});
      StreamKey back = key;
      back.channel += 1;
      auto w = h.OpenWriter(*StreamPeer::FromJson(cmd["peer"]), back, {});
      if (!r.ok() || !w.ok()) ::_exit(6);
      for (;;) {
        auto m = (*r)->Next();
        if (!m.ok()) ::_exit(7);
        if (!*m) break;
        if (!(*w)->Write(std::move(**m)).ok()) ::_exit(7);
      }
      (void)(*w)->Close();
    }
    Send(out, Json{{"op", "done"}});
  }
  hub->reset();
  curve_hub->reset();
  ::_exit(0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Row {
  std::string name;
  std::vector<double> v;
};

void Print(const Row& r, const char* unit) {
  auto mm = std::minmax_element(r.v.begin(), r.v.end());
  std::printf("  %-62s %9.2f %s  (min %.2f, max %.2f)\n", r.name.c_str(), Median(r.v), unit, *mm.first, *mm.second);
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 1024;
  int runs = 5;
  int pings = 20000;
  size_t window = StreamOptions{}.window_bytes;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib")
      mib = std::stoull(argv[i + 1]);
    else if (a == "--runs")
      runs = std::stoi(argv[i + 1]);
    else if (a == "--pings")
      pings = std::stoi(argv[i + 1]);
    else if (a == "--window-mib")
      window = std::stoull(argv[i + 1]) << 20;
    else {
      std::fprintf(stderr, "usage: stream_bench [--mib N] [--runs R] [--pings P] [--window-mib W]\n");
      return 2;
    }
  }
  auto dir = std::filesystem::temp_directory_path() / ("copse-stream-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

  // Fork the producer daemon before this process starts any thread.
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return 1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    Child(to_child[0], from_child[1], dir);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  int cin = from_child[0], cout = to_child[1];
  Json child_eps = Recv(cin);
  Json child_ep = child_eps["plain"];
  Json child_curve_tcp = child_eps["curve"];
  child_curve_tcp.erase("ipc");

  auto hub_r = StreamHub::Start("127.0.0.1", 0, dir / "parent-ipc", kSecret);
  auto curve_hub_r = StreamHub::Start("127.0.0.1", 0, dir / "parent-ipc-curve", kSecret, /*encrypt=*/true);
  if (!hub_r.ok() || !curve_hub_r.ok()) {
    std::fprintf(stderr, "%s\n", (hub_r.ok() ? curve_hub_r.status() : hub_r.status()).ToString().c_str());
    return 1;
  }
  auto& hub = *hub_r;
  auto& curve_hub = *curve_hub_r;
  Json curve_tcp_ep = curve_hub->endpoints().ToJson();
  curve_tcp_ep.erase("ipc");
  Json tcp_ep = hub->endpoints().ToJson();
  tcp_ep.erase("ipc");
  Json ipc_ep = hub->endpoints().ToJson();
  Json child_tcp = child_ep;
  child_tcp.erase("ipc");

  const uint64_t n = mib;  // 1 MiB messages
  const double gb = n * double(kMsg) / 1e9;
  uint64_t job = 1;

  auto stream_run = [&](const Json& peer, bool curve = false) -> double {
    StreamKey key{job++, 1, 0};
    auto r = (curve ? curve_hub : hub)->OpenReader(key, {});
    auto start = Clock::now();
    Send(cout,
         Json{{"op", "stream"}, {"key", key.ToJson()}, {"peer", peer}, {"messages", n}, {"window", window}, {"curve", curve}});
    uint64_t got = 0;
    for (;;) {
      auto m = (*r)->Next();
      if (!m.ok()) {
        std::fprintf(stderr, "stream: %s\n", m.status().ToString().c_str());
        return 0;
      }
      if (!*m) break;
      ++got;
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    Recv(cin);
    return got == n ? gb / s : 0;
  };

  zmq::context_t ctx(1);
  auto zmq_run = [&](const std::string& bind) -> double {
    zmq::socket_t pull(ctx, zmq::socket_type::pull);
    pull.set(zmq::sockopt::rcvhwm, 64);
    pull.bind(bind);
    std::string ep = pull.get(zmq::sockopt::last_endpoint);
    auto start = Clock::now();
    Send(cout, Json{{"op", "zmq"}, {"endpoint", ep}, {"messages", n}});
    for (uint64_t i = 0; i < n; ++i) {
      zmq::message_t m;
      (void)pull.recv(m, zmq::recv_flags::none);
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    Recv(cin);
    return gb / s;
  };

  auto shm_run = [&]() -> double {
    ShmRegistry reg;
    StreamKey key{job++, 1, 0};
    auto w = reg.OpenWriter(key, {});
    auto r = reg.OpenReader(key, {});
    auto pool = Pool(kMsg);
    auto start = Clock::now();
    std::thread producer([&] {
      for (uint64_t i = 0; i < n; ++i) (void)(*w)->Write(pool[i % pool.size()]);
      (void)(*w)->Close();
    });
    uint64_t got = 0;
    while (true) {
      auto m = (*r)->Next();
      if (!m.ok() || !*m) break;
      ++got;
    }
    producer.join();
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    return got == n ? gb / s : 0;
  };

  // Half round trips, in microseconds.
  auto stream_latency = [&](const Json& child_peer, const Json& my_peer, bool curve = false) {
    StreamKey key{job++, 1, 0};
    StreamKey back{key.job, 2, 0};
    auto& h = curve ? curve_hub : hub;
    auto r = h->OpenReader(back, {});
    auto w = h->OpenWriter(*StreamPeer::FromJson(child_peer), key, {});
    Send(cout, Json{{"op", "pong"}, {"key", key.ToJson()}, {"peer", my_peer}, {"curve", curve}});
    Buffer ping(std::string(kSmall, 'p'));
    std::vector<double> us;
    for (int i = 0; i < pings + 100; ++i) {
      auto t = Clock::now();
      (void)(*w)->Write(ping);
      auto m = (*r)->Next();
      if (!m.ok() || !*m) break;
      if (i >= 100) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / 2);
    }
    (void)(*w)->Close();
    (void)(*r)->Next();
    Recv(cin);
    return us;
  };
  auto shm_latency = [&]() {
    ShmRegistry reg;
    StreamKey a{job++, 1, 0}, b{a.job, 2, 0};
    auto wa = reg.OpenWriter(a, {});
    auto ra = reg.OpenReader(a, {});
    auto wb = reg.OpenWriter(b, {});
    auto rb = reg.OpenReader(b, {});
    std::thread echo([&] {
      for (;;) {
        auto m = (*ra)->Next();
        if (!m.ok() || !*m) break;
        (void)(*wb)->Write(std::move(**m));
      }
      (void)(*wb)->Close();
    });
    Buffer ping(std::string(kSmall, 'p'));
    std::vector<double> us;
    for (int i = 0; i < pings + 100; ++i) {
      auto t = Clock::now();
      (void)(*wa)->Write(ping);
      auto m = (*rb)->Next();
      if (!m.ok() || !*m) break;
      if (i >= 100) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / 2);
    }
    (void)(*wa)->Close();
    echo.join();
    return us;
  };

  Row stcp{"stream, tcp:// (other process, 127.0.0.1)", {}};
  Row sipc{"stream, ipc:// (other process, same host)", {}};
  Row scurve{"stream, tcp:// CurveZMQ (cluster with TLS on)", {}};
  Row ztcp{"raw ZeroMQ PUSH/PULL, tcp:// (other process, zero-copy send)", {}};
  Row zipc{"raw ZeroMQ PUSH/PULL, ipc:// (other process, zero-copy send)", {}};
  Row shm{"shm (two threads, one process, Buffers passed without copy)", {}};
  for (int i = 0; i < runs; ++i) {
    ztcp.v.push_back(zmq_run("tcp://127.0.0.1:*"));
    stcp.v.push_back(stream_run(tcp_ep));
    scurve.v.push_back(stream_run(curve_tcp_ep, /*curve=*/true));
    zipc.v.push_back(zmq_run("ipc://" + (dir / ("zmq-" + std::to_string(i) + ".sock")).string()));
    sipc.v.push_back(stream_run(ipc_ep));
    shm.v.push_back(shm_run());
  }
  std::vector<double> lat_tcp = stream_latency(child_tcp, tcp_ep);
  std::vector<double> lat_curve = stream_latency(child_curve_tcp, curve_tcp_ep, /*curve=*/true);
  std::vector<double> lat_ipc = stream_latency(child_ep, ipc_ep);
  std::vector<double> lat_shm = shm_latency();

  std::printf("stream_bench: %llu MiB in 1024 KiB messages, stream window %zu MiB, median of %d runs (GB/s = 1e9 bytes/s)\n",
              static_cast<unsigned long long>(mib), window >> 20, runs);
  Print(stcp, "GB/s");
  Print(scurve, "GB/s");
  Print(ztcp, "GB/s");
  Print(sipc, "GB/s");
  Print(zipc, "GB/s");
  Print(shm, "GB/s");
  std::printf("  stream tcp / raw ZeroMQ tcp: %.2f   stream ipc / raw ZeroMQ tcp: %.2f   stream ipc / raw ZeroMQ ipc: %.2f\n",
              Median(stcp.v) / Median(ztcp.v), Median(sipc.v) / Median(ztcp.v), Median(sipc.v) / Median(zipc.v));
  std::printf("  encryption: stream tcp CurveZMQ / plaintext: %.2f (medians of runs interleaved with the plaintext ones)\n",
              Median(scurve.v) / Median(stcp.v));
  std::printf("64-byte message latency, half a ping-pong round trip, %d pings (microseconds):\n", pings);
  auto lat = [](const char* name, const std::vector<double>& v) {
    if (v.empty()) return std::printf("  %-40s failed\n", name), void();
    std::printf("  %-40s p50 %8.1f   p99 %8.1f\n", name, Percentile(v, 0.5), Percentile(v, 0.99));
  };
  lat("stream, tcp:// (other process)", lat_tcp);
  lat("stream, tcp:// CurveZMQ (other process)", lat_curve);
  lat("stream, ipc:// (other process)", lat_ipc);
  lat("shm (two threads)", lat_shm);

  Send(cout, Json{{"op", "exit"}});
  ::waitpid(pid, nullptr, 0);
  hub.reset();
  curve_hub.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
