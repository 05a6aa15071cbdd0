#include "channels/stream_hub.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/auth.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace copse::chan {

namespace {

static_assert(std::endian::native == std::endian::little, "the stream wire format is little-endian");

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x53535043;  // "CPSS"
constexpr auto kHeartbeat = milliseconds(100);
// A producer connection heard within this long is heartbeaten by the consumer hub.
constexpr auto kPeerMemory = std::chrono::seconds(10);
// A DEALER with no writers left is closed after this long (its last frames long delivered).
constexpr auto kIdleDealer = std::chrono::seconds(5);
constexpr auto kCancelPoll = milliseconds(5);
constexpr auto kIdlePoll = milliseconds(50);
constexpr size_t kMaxReason = 1024;
// Abort reasons that mean "this job is over here", not "something broke": the other end
// reports them as Cancelled, exactly as its own DropJob would, whichever arrives first.
constexpr std::string_view kConsumerDroppedJob = "consumer dropped the job";
constexpr std::string_view kProducerDroppedJob = "producer dropped the job";
// The largest flow-control window a producer may open with: the consumer buffers up to it.
constexpr uint64_t kMaxWindowBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxWindowMessages = uint64_t{1} << 20;
// Messages up to this size are copied into ZeroMQ; larger ones are sent zero-copy.
constexpr size_t kZeroCopyMin = 4096;

enum class Type : uint8_t { kOpen = 1, kData = 2, kEnd = 3, kAbort = 4, kCredit = 5, kHeartbeat = 6 };

struct Header {
  uint32_t magic = kMagic;
  uint8_t type = 0;
  uint8_t pad[3] = {0, 0, 0};
  uint64_t job = 0;
  uint32_t channel = 0;
  uint32_t version = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};
static_assert(sizeof(Header) == 40);

zmq::message_t EncodeHeader(Type t, const StreamKey& k, uint64_t a = 0, uint64_t b = 0, std::string_view extra = {}) {
  Header h;
  h.type = static_cast<uint8_t>(t);
  h.job = k.job;
  h.channel = k.channel;
  h.version = k.version;
  h.a = a;
  h.b = b;
  zmq::message_t m(sizeof h + extra.size());
  std::memcpy(m.data(), &h, sizeof h);
  if (!extra.empty()) std::memcpy(static_cast<char*>(m.data()) + sizeof h, extra.data(), extra.size());
  return m;
}

std::string OpenMac(const std::string& secret, const StreamKey& k, std::string_view nonce, uint64_t wb, uint64_t wm) {
  return auth::Mac(secret, "copse-stream-open/" + k.ToString() + "/" + std::string(nonce) + "/" + std::to_string(wb) + "/" +
                               std::to_string(wm));
}

std::string RandomHex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = kHex[rng() & 15];
  return s;
}

// What a command asks the I/O thread to do.
enum class CmdKind { kOpen, kData, kEnd, kAbortToConsumer, kCredit, kAbortToProducer };

struct Cmd {
  CmdKind kind;
  StreamKey key;
  std::string target;  // kOpen/kData/kEnd/kAbortToConsumer: the peer endpoint; else a routing id
  Buffer data;
  uint64_t a = 0, b = 0;
  std::string text;
};

// A connection to one peer hub (producer side). The socket itself lives on the I/O thread.
struct PeerConn {
  std::string endpoint;
  std::string routing_id;
  size_t writers = 0;
  bool heard = false;
  Clock::time_point last_heard = Clock::now();
  Clock::time_point idle_since = Clock::now();
};

// Producer-side state of one channel.
struct OutChan {
  StreamKey key;
  std::shared_ptr<PeerConn> peer;
  size_t window_bytes = 0, window_messages = 0;
  size_t in_flight_bytes = 0, in_flight_messages = 0;
  uint64_t seq = 0;
  bool closed = false;
  Status error;  // the consumer aborted
  bool cancelled = false;
  Clock::time_point opened = Clock::now();
  std::condition_variable cv;
};

// Consumer-side state of one channel.
struct InChan {
  StreamKey key;
  std::string producer;  // routing id of the authenticated producer connection; "" until open
  size_t window_bytes = 8 << 20, window_messages = 64;
  std::deque<zmq::message_t> queue;
  size_t bytes = 0;
  uint64_t next_seq = 0;
  bool ended = false;
  Status error;
  bool cancelled = false;
  bool has_reader = false;
  size_t pending_credit_bytes = 0, pending_credit_messages = 0;
  Clock::time_point created = Clock::now();
  std::condition_variable cv;
};

void FreeBuffer(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<const std::string>*>(hint); }

/// The cluster's CURVE server key pair (Z85 text), derived from its secret: see stream_hub.h.
Status ClusterCurveKeys(const std::string& secret, std::string& public_key, std::string& secret_key) {
  const std::string hex = auth::Mac(secret, "copse-stream-curve/1");
  uint8_t raw[32];
  for (size_t i = 0; i < sizeof raw; ++i) raw[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  char z85_secret[41], z85_public[41];
  if (!zmq_z85_encode(z85_secret, raw, sizeof raw) || zmq_curve_public(z85_public, z85_secret) != 0)
    return Status::Internal("stream hub: cannot make CURVE keys (is ZeroMQ built with CURVE?)");
  secret_key = z85_secret;
  public_key = z85_public;
  return Status::OK();
}

}  // namespace

struct StreamHub::Impl {
  std::string secret;
  // CurveZMQ (empty: off): the cluster's server keys, and this hub's own as a client.
  std::string curve_server_public, curve_server_secret, curve_client_public, curve_client_secret;
  std::string host_label;
  std::string tcp_endpoint, ipc_endpoint;
  std::filesystem::path ipc_path;
  zmq::context_t ctx{1};
  zmq::socket_t router;
  int efd = -1;
  std::thread io;
  std::atomic<bool> stop{false};
  std::shared_ptr<spdlog::logger> log = Logger("chan");

  mutable std::mutex mu;
  bool stopped = false;
  std::vector<Cmd> cmds;
  std::map<StreamKey, std::shared_ptr<InChan>> in;
  std::set<StreamKey> in_closed;                       // keys whose reader finished or was dropped: later opens are refused
  std::set<uint64_t> dropped_jobs;                     // jobs DropJob ended here: a late open is told so (Cancelled)
  std::map<std::string, Clock::time_point> producers;  // routing id -> last heard
  size_t buffered = 0;
  std::map<StreamKey, std::shared_ptr<OutChan>> out;
  std::map<std::string, std::shared_ptr<PeerConn>> peers;  // by endpoint
  size_t in_flight = 0;
  std::atomic<uint64_t> dropped{0};

  ~Impl() {
    if (efd >= 0) ::close(efd);
  }

  // Queues a command for the I/O thread. Caller holds mu.
  void Push(Cmd c) {
    bool wake = cmds.empty();
    cmds.push_back(std::move(c));
    if (wake) {
      uint64_t one = 1;
      (void)!::write(efd, &one, sizeof one);
    }
  }

  void Drop(const char* why) {
    dropped.fetch_add(1, std::memory_order_relaxed);
    log->debug("stream hub: dropped a frame: {}", why);
  }

  void Run();
  void HandleRouter(std::vector<zmq::message_t>& parts);
  void HandleDealer(PeerConn& peer, std::vector<zmq::message_t>& parts);
  void Execute(Cmd& c, std::map<std::string, zmq::socket_t>& dealers);
  void StopAll();
};

void StreamHub::Impl::Run() {
  SetThreadName("copse-streams");
  std::map<std::string, zmq::socket_t> dealers;  // by endpoint
  auto next_beat = Clock::now();
  std::vector<Cmd> batch;
  std::vector<zmq::message_t> parts;
  std::vector<zmq_pollitem_t> items;
  std::vector<std::string> item_endpoints;

  auto recv_all = [&](zmq::socket_t& s) -> bool {
    parts.clear();
    for (;;) {
      zmq::message_t m;
      auto r = s.recv(m, parts.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
      if (!r) return false;
      bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) return true;
    }
  };

  while (!stop.load()) {
    try {
      items.clear();
      item_endpoints.clear();
      items.push_back({router.handle(), 0, ZMQ_POLLIN, 0});
      items.push_back({nullptr, efd, ZMQ_POLLIN, 0});
      for (auto& [ep, s] : dealers) {
        items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
        item_endpoints.push_back(ep);
      }
      auto wait = std::chrono::duration_cast<milliseconds>(next_beat - Clock::now()).count();
      zmq::poll(items.data(), items.size(), milliseconds(std::max<long>(0, wait)));

      // Inbound data first (a bounded batch per socket, so commands and heartbeats keep flowing).
      if (items[0].revents & ZMQ_POLLIN) {
        for (int i = 0; i < 256 && recv_all(router); ++i) HandleRouter(parts);
      }
      for (size_t i = 0; i < item_endpoints.size(); ++i) {
        if (!(items[2 + i].revents & ZMQ_POLLIN)) continue;
        auto& s = dealers.at(item_endpoints[i]);
        std::shared_ptr<PeerConn> peer;
        {
          std::lock_guard lock(mu);
          auto it = peers.find(item_endpoints[i]);
          if (it != peers.end()) peer = it->second;
        }
        for (int k = 0; k < 256 && recv_all(s); ++k) {
          if (peer) HandleDealer(*peer, parts);
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        uint64_t v;
        (void)!::read(efd, &v, sizeof v);
      }
      batch.clear();
      {
        std::lock_guard lock(mu);
        batch.swap(cmds);
      }
      for (auto& c : batch) Execute(c, dealers);

      auto now = Clock::now();
      if (now >= next_beat) {
        next_beat = now + kHeartbeat;
        std::vector<std::string> beat_dealers, close_dealers, beat_producers;
        {
          std::lock_guard lock(mu);
          for (auto& [ep, s] : dealers) {
            auto it = peers.find(ep);
            if (it == peers.end()) {
              close_dealers.push_back(ep);
            } else if (it->second->writers > 0) {
              beat_dealers.push_back(ep);
            } else if (now - it->second->idle_since > kIdleDealer) {
              close_dealers.push_back(ep);
              peers.erase(it);
            }
          }
          for (auto it = producers.begin(); it != producers.end();) {
            if (now - it->second > 6 * kPeerMemory) {
              it = producers.erase(it);
              continue;
            }
            if (now - it->second < kPeerMemory) beat_producers.push_back(it->first);
            ++it;
          }
        }
        for (auto& ep : beat_dealers) (void)dealers.at(ep).send(EncodeHeader(Type::kHeartbeat, {}), zmq::send_flags::dontwait);
        for (auto& ep : close_dealers) {
          dealers.at(ep).set(zmq::sockopt::linger, 0);
          dealers.erase(ep);
        }
        for (auto& rid : beat_producers) {
          (void)router.send(zmq::buffer(rid), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          (void)router.send(EncodeHeader(Type::kHeartbeat, {}), zmq::send_flags::dontwait);
        }
      }
    } catch (const std::exception& e) {
      if (stop.load()) break;
      log->warn("stream hub: I/O error: {}", e.what());
      std::this_thread::sleep_for(milliseconds(1));
    }
  }
  // Commands queued just before the stop (a writer's last messages and end-of-stream, when its
  // process closes the hub right after Close) are still handed to the dealers, which keep their
  // linger (1 s) so the frames reach their consumers.
  batch.clear();
  {
    std::lock_guard lock(mu);
    batch.swap(cmds);
  }
  for (auto& c : batch) {
    try {
      Execute(c, dealers);
    } catch (const std::exception& e) {
      log->warn("stream hub: I/O error while stopping: {}", e.what());
    }
  }
  dealers.clear();
  router.close();
}

void StreamHub::Impl::Execute(Cmd& c, std::map<std::string, zmq::socket_t>& dealers) {
  if (c.kind == CmdKind::kCredit || c.kind == CmdKind::kAbortToProducer) {
    (void)router.send(zmq::buffer(c.target), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (c.kind == CmdKind::kCredit) {
      (void)router.send(EncodeHeader(Type::kCredit, c.key, c.a, c.b), zmq::send_flags::dontwait);
    } else {
      (void)router.send(EncodeHeader(Type::kAbort, c.key, 0, 0, c.text), zmq::send_flags::dontwait);
    }
    return;
  }
  auto it = dealers.find(c.target);
  if (it == dealers.end()) {
    if (c.kind != CmdKind::kOpen) return;  // the connection was closed meanwhile
    std::string rid;
    {
      std::lock_guard lock(mu);
      auto p = peers.find(c.target);
      if (p == peers.end()) return;
      rid = p->second->routing_id;
    }
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    if (!curve_server_public.empty()) {
      s.set(zmq::sockopt::curve_serverkey, curve_server_public);
      s.set(zmq::sockopt::curve_publickey, curve_client_public);
      s.set(zmq::sockopt::curve_secretkey, curve_client_secret);
    }
    s.set(zmq::sockopt::routing_id, rid);
    s.set(zmq::sockopt::sndhwm, 0);  // the credit window bounds what is queued
    s.set(zmq::sockopt::rcvhwm, 0);
    s.set(zmq::sockopt::maxmsgsize, int64_t{1} << 20);  // only credits, heartbeats and aborts come back
    s.set(zmq::sockopt::linger, 1000);
    s.set(zmq::sockopt::reconnect_ivl, 100);
    s.set(zmq::sockopt::sndbuf, 4 << 20);
    s.set(zmq::sockopt::rcvbuf, 4 << 20);
    s.connect(c.target);
    it = dealers.emplace(c.target, std::move(s)).first;
  }
  auto& s = it->second;
  switch (c.kind) {
    case CmdKind::kOpen: {
      std::string nonce = RandomHex(32);
      std::string extra = nonce + OpenMac(secret, c.key, nonce, c.a, c.b);
      (void)s.send(EncodeHeader(Type::kOpen, c.key, c.a, c.b, extra), zmq::send_flags::dontwait);
      break;
    }
    case CmdKind::kData: {
      (void)s.send(EncodeHeader(Type::kData, c.key, c.a), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      if (c.data.size() >= kZeroCopyMin) {
        auto* hint = new std::shared_ptr<const std::string>(c.data.storage());
        zmq::message_t m(const_cast<char*>(c.data.data()), c.data.size(), &FreeBuffer, hint);
        (void)s.send(m, zmq::send_flags::dontwait);
      } else {
        (void)s.send(zmq::message_t(c.data.data(), c.data.size()), zmq::send_flags::dontwait);
      }
      break;
    }
    case CmdKind::kEnd: (void)s.send(EncodeHeader(Type::kEnd, c.key, c.a), zmq::send_flags::dontwait); break;
    case CmdKind::kAbortToConsumer:
      (void)s.send(EncodeHeader(Type::kAbort, c.key, 0, 0, c.text), zmq::send_flags::dontwait);
      break;
    default: break;
  }
}

namespace {
bool ParseHeader(const zmq::message_t& m, Header& h) {
  if (m.size() < sizeof h) return false;
  std::memcpy(&h, m.data(), sizeof h);
  return h.magic == kMagic && h.type >= 1 && h.type <= 6;
}
std::string_view Extra(const zmq::message_t& m) {
  return std::string_view(static_cast<const char*>(m.data()) + sizeof(Header), m.size() - sizeof(Header));
}
}  // namespace

// Frames from producers: [routing id][header](+[payload] for data).
void StreamHub::Impl::HandleRouter(std::vector<zmq::message_t>& parts) {
  Header h;
  if (parts.size() < 2 || !ParseHeader(parts[1], h)) return Drop("malformed frame on the router");
  auto type = static_cast<Type>(h.type);
  if ((type == Type::kData) != (parts.size() == 3) || parts.size() > 3) return Drop("wrong number of parts");
  std::string rid = parts[0].to_string();
  StreamKey key{h.job, h.channel, h.version};
  auto now = Clock::now();
  std::string abort_reason;
  std::lock_guard lock(mu);
  producers[rid] = now;
  switch (type) {
    case Type::kHeartbeat: return;
    case Type::kOpen: {
      auto extra = Extra(parts[1]);
      if (extra.size() != 32 + 64 || h.a == 0 || h.b == 0) return Drop("malformed open");
      auto nonce = extra.substr(0, 32);
      if (!auth::ConstantTimeEquals(extra.substr(32), OpenMac(secret, key, nonce, h.a, h.b))) {
        log->warn("stream hub: refused an open of {} with a bad MAC", key.ToString());
        return Drop("bad MAC");
      }
      if (h.a > kMaxWindowBytes || h.b > kMaxWindowMessages) {
        // Authenticated, so told why rather than left to time out: a producer of another
        // build whose window is above this hub's caps.
        abort_reason = "stream " + key.ToString() + " opened with a window of " + std::to_string(h.a) + " bytes and " +
                       std::to_string(h.b) + " messages, above the consumer's caps of " + std::to_string(kMaxWindowBytes) +
                       " and " + std::to_string(kMaxWindowMessages);
        log->warn("stream hub: refused an open: {}", abort_reason);
        break;
      }
      if (dropped_jobs.count(key.job)) {
        abort_reason = kConsumerDroppedJob;
        break;
      }
      if (in_closed.count(key)) {
        abort_reason = "the consumer of stream " + key.ToString() + " is gone";
        break;
      }
      auto& c = in[key];
      if (!c) {
        c = std::make_shared<InChan>();
        c->key = key;
      }
      if (!c->producer.empty() && c->producer != rid) {
        abort_reason = "stream " + key.ToString() + " already has a producer";
        break;
      }
      c->producer = rid;
      c->window_bytes = h.a;
      c->window_messages = h.b;
      c->cv.notify_all();
      log->debug("stream hub: producer opened {}", key.ToString());
      return;
    }
    default: break;
  }
  if (!abort_reason.empty()) {
    Push(Cmd{CmdKind::kAbortToProducer, key, rid, {}, 0, 0, abort_reason});
    return;
  }
  auto it = in.find(key);
  if (it == in.end() || it->second->producer != rid) return Drop("frame for a channel this connection did not open");
  auto& c = *it->second;
  if (c.ended || !c.error.ok()) return Drop("frame after the end of a channel");
  switch (type) {
    case Type::kData:
      if (h.a != c.next_seq) {
        c.error = Status::Unavailable("stream " + key.ToString() + " lost messages (expected #" + std::to_string(c.next_seq) +
                                      ", got #" + std::to_string(h.a) + ")");
        break;
      }
      // Beyond the window it opened with (one message of any size fits an empty queue, as the
      // writer allows): an authenticated producer still may not make this hub buffer without end.
      if (!c.queue.empty() && (c.queue.size() >= c.window_messages || c.bytes + parts[2].size() > c.window_bytes)) {
        c.error =
            Status::DataLoss("the producer of stream " + key.ToString() + " sent beyond its window of " +
                             std::to_string(c.window_messages) + " messages and " + std::to_string(c.window_bytes) + " bytes");
        Push(Cmd{CmdKind::kAbortToProducer, key, rid, {}, 0, 0, "sent beyond its flow-control window"});
        break;
      }
      ++c.next_seq;
      c.bytes += parts[2].size();
      buffered += parts[2].size();
      c.queue.push_back(std::move(parts[2]));
      break;
    case Type::kEnd:
      if (h.a != c.next_seq) {
        c.error = Status::Unavailable("stream " + key.ToString() + " lost messages before its end");
      } else {
        c.ended = true;
      }
      break;
    case Type::kAbort:
      if (Extra(parts[1]) == kProducerDroppedJob) {
        c.cancelled = true;
      } else {
        c.error = Status::Unavailable("the producer of stream " + key.ToString() +
                                      " failed: " + std::string(Extra(parts[1]).substr(0, kMaxReason)));
      }
      break;
    default: return Drop("unexpected frame type from a producer");
  }
  c.cv.notify_all();
}

// Frames from a consumer hub, on our DEALER to it: [header].
void StreamHub::Impl::HandleDealer(PeerConn& peer, std::vector<zmq::message_t>& parts) {
  Header h;
  std::lock_guard lock(mu);
  peer.heard = true;
  peer.last_heard = Clock::now();
  if (parts.size() != 1 || !ParseHeader(parts[0], h)) return Drop("malformed frame on a dealer");
  auto type = static_cast<Type>(h.type);
  if (type == Type::kHeartbeat) return;
  StreamKey key{h.job, h.channel, h.version};
  auto it = out.find(key);
  if (it == out.end() || it->second->peer.get() != &peer) return;  // a writer that is gone
  auto& c = *it->second;
  if (type == Type::kCredit) {
    size_t bytes = std::min<uint64_t>(h.a, c.in_flight_bytes);
    size_t msgs = std::min<uint64_t>(h.b, c.in_flight_messages);
    c.in_flight_bytes -= bytes;
    c.in_flight_messages -= msgs;
    in_flight -= bytes;
  } else if (type == Type::kAbort) {
    if (Extra(parts[0]) == kConsumerDroppedJob) {
      c.cancelled = true;
    } else if (c.error.ok()) {
      c.error = Status::Unavailable("the consumer of stream " + key.ToString() +
                                    " ended it: " + std::string(Extra(parts[0]).substr(0, kMaxReason)));
    }
  } else {
    return Drop("unexpected frame type from a consumer");
  }
  c.cv.notify_all();
}

void StreamHub::Impl::StopAll() {
  stop.store(true);
  uint64_t one = 1;
  (void)!::write(efd, &one, sizeof one);
  if (io.joinable()) io.join();
  std::lock_guard lock(mu);
  stopped = true;
  for (auto& [k, c] : in) {
    c->cancelled = true;
    c->queue.clear();
    c->cv.notify_all();
  }
  for (auto& [k, c] : out) {
    c->cancelled = true;
    c->cv.notify_all();
  }
  in.clear();
  out.clear();
  buffered = 0;
  if (!ipc_path.empty()) {
    std::error_code ec;
    std::filesystem::remove(ipc_path, ec);
  }
}

namespace {

using Impl = StreamHub::Impl;

class StreamWriter final : public ChannelWriter {
 public:
  StreamWriter(std::shared_ptr<Impl> hub, std::shared_ptr<OutChan> c, StreamOptions o)
      : hub_(std::move(hub)), c_(std::move(c)), o_(o) {}

  ~StreamWriter() override {
    std::lock_guard lock(hub_->mu);
    if (!c_->closed && !c_->cancelled && !hub_->stopped)
      hub_->Push(Cmd{CmdKind::kAbortToConsumer, c_->key, c_->peer->endpoint, {}, 0, 0, "writer destroyed before Close"});
    hub_->in_flight -= c_->in_flight_bytes;
    c_->in_flight_bytes = 0;
    auto it = hub_->out.find(c_->key);
    if (it != hub_->out.end() && it->second == c_) hub_->out.erase(it);
    if (--c_->peer->writers == 0) c_->peer->idle_since = Clock::now();
  }

  Status Write(Buffer message) override {
    if (message.size() > kMaxWindowBytes) {  // the consumer's hub drops a larger frame with its connection
      return Status::InvalidArgument("stream " + c_->key.ToString() + ": a message of " + std::to_string(message.size()) +
                                     " bytes exceeds a live channel's limit of " + std::to_string(kMaxWindowBytes));
    }
    std::unique_lock lock(hub_->mu);
    for (;;) {
      COPSE_RETURN_NOT_OK(Check());
      if (c_->closed) return Status::FailedPrecondition("write after close on stream " + c_->key.ToString());
      bool fits = c_->in_flight_messages == 0 ||
                  (c_->in_flight_messages < c_->window_messages && c_->in_flight_bytes + message.size() <= c_->window_bytes);
      if (fits) break;
      COPSE_RETURN_NOT_OK(CheckPeer());
      c_->cv.wait_for(lock, o_.cancel ? kCancelPoll : kIdlePoll);
    }
    c_->in_flight_bytes += message.size();
    c_->in_flight_messages += 1;
    hub_->in_flight += message.size();
    hub_->Push(Cmd{CmdKind::kData, c_->key, c_->peer->endpoint, std::move(message), c_->seq++, 0, {}});
    return Status::OK();
  }

  Status Close() override {
    std::lock_guard lock(hub_->mu);
    if (c_->closed) return Status::OK();
    COPSE_RETURN_NOT_OK(Check());
    c_->closed = true;
    hub_->Push(Cmd{CmdKind::kEnd, c_->key, c_->peer->endpoint, {}, c_->seq, 0, {}});
    return Status::OK();
  }

 private:
  // Caller holds mu.
  Status Check() {
    if (c_->cancelled || hub_->stopped || (o_.cancel && o_.cancel->load()))
      return Status::Cancelled("stream " + c_->key.ToString() + " cancelled");
    return c_->error;
  }
  Status CheckPeer() {
    auto now = Clock::now();
    const auto& p = *c_->peer;
    if (p.heard && now - p.last_heard > o_.peer_timeout)
      return Status::Unavailable("no word from the consumer hub of stream " + c_->key.ToString() + " at " + p.endpoint + " for " +
                                 std::to_string(std::chrono::duration_cast<milliseconds>(now - p.last_heard).count()) + " ms");
    if (!p.heard && now - c_->opened > o_.open_timeout)
      return Status::Unavailable("the consumer hub of stream " + c_->key.ToString() + " at " + p.endpoint + " never answered");
    return Status::OK();
  }

  std::shared_ptr<Impl> hub_;
  std::shared_ptr<OutChan> c_;
  StreamOptions o_;
};

class StreamReader final : public ChannelReader {
 public:
  StreamReader(std::shared_ptr<Impl> hub, std::shared_ptr<InChan> c, StreamOptions o)
      : hub_(std::move(hub)), c_(std::move(c)), o_(o) {}

  ~StreamReader() override {
    std::lock_guard lock(hub_->mu);
    if (hub_->stopped) return;
    if (!eos_ && c_->error.ok() && !c_->cancelled && !c_->producer.empty())
      hub_->Push(Cmd{CmdKind::kAbortToProducer, c_->key, c_->producer, {}, 0, 0, "reader destroyed before end-of-stream"});
    hub_->buffered -= c_->bytes;
    c_->bytes = 0;
    c_->queue.clear();
    auto it = hub_->in.find(c_->key);
    if (it != hub_->in.end() && it->second == c_) hub_->in.erase(it);
    hub_->in_closed.insert(c_->key);
  }

  Result<std::optional<Buffer>> Next() override {
    zmq::message_t m;
    {
      std::unique_lock lock(hub_->mu);
      for (;;) {
        if (c_->cancelled || hub_->stopped || (o_.cancel && o_.cancel->load()))
          return Status::Cancelled("stream " + c_->key.ToString() + " cancelled");
        if (!c_->queue.empty()) break;
        if (c_->ended) {
          eos_ = true;
          return std::optional<Buffer>();
        }
        if (!c_->error.ok()) return c_->error;
        auto now = Clock::now();
        if (c_->producer.empty()) {
          if (now - c_->created > o_.open_timeout)
            return Status::Unavailable("no producer opened stream " + c_->key.ToString() + " in time");
        } else {
          auto p = hub_->producers.find(c_->producer);
          if (p == hub_->producers.end() || now - p->second > o_.peer_timeout)
            return Status::Unavailable("no word from the producer of stream " + c_->key.ToString() + " for " +
                                       std::to_string(p == hub_->producers.end()
                                                          ? -1
                                                          : std::chrono::duration_cast<milliseconds>(now - p->second).count()) +
                                       " ms");
        }
        c_->cv.wait_for(lock, o_.cancel ? kCancelPoll : kIdlePoll);
      }
      m = std::move(c_->queue.front());
      c_->queue.pop_front();
      c_->bytes -= m.size();
      hub_->buffered -= m.size();
      c_->pending_credit_bytes += m.size();
      c_->pending_credit_messages += 1;
      if (c_->queue.empty() || c_->pending_credit_bytes >= c_->window_bytes / 4 ||
          c_->pending_credit_messages >= std::max<size_t>(1, c_->window_messages / 4)) {
        hub_->Push(Cmd{CmdKind::kCredit, c_->key, c_->producer, {}, c_->pending_credit_bytes, c_->pending_credit_messages, {}});
        c_->pending_credit_bytes = c_->pending_credit_messages = 0;
      }
    }
    // The one copy on the consumer side, outside the hub's lock: ZeroMQ owns the received
    // bytes, a Buffer owns a std::string.
    return std::optional<Buffer>(Buffer(std::string(static_cast<const char*>(m.data()), m.size())));
  }

 private:
  std::shared_ptr<Impl> hub_;
  std::shared_ptr<InChan> c_;
  StreamOptions o_;
  bool eos_ = false;
};

}  // namespace

StreamHub::StreamHub(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

StreamHub::~StreamHub() { impl_->StopAll(); }

Result<std::unique_ptr<StreamHub>> StreamHub::Start(const std::string& host, uint16_t port, std::filesystem::path ipc_dir,
                                                    std::string secret, bool encrypt) {
  auto impl = std::make_shared<Impl>();
  impl->secret = std::move(secret);
  if (encrypt) {
    if (!zmq_has("curve")) return Status::FailedPrecondition("stream hub: this ZeroMQ has no CURVE, which encryption needs");
    COPSE_RETURN_NOT_OK(ClusterCurveKeys(impl->secret, impl->curve_server_public, impl->curve_server_secret));
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0) return Status::Internal("stream hub: cannot make a CURVE key pair");
    impl->curve_client_public = pub;
    impl->curve_client_secret = sec;
  }
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) == 0) impl->host_label = name;
  impl->efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->efd < 0) return Status::IOError("stream hub: eventfd failed");
  try {
    impl->router = zmq::socket_t(impl->ctx, zmq::socket_type::router);
    impl->router.set(zmq::sockopt::sndhwm, 0);
    impl->router.set(zmq::sockopt::rcvhwm, 0);
    impl->router.set(zmq::sockopt::linger, 0);
    impl->router.set(zmq::sockopt::sndbuf, 4 << 20);
    impl->router.set(zmq::sockopt::rcvbuf, 4 << 20);
    // Frames are authenticated only once they are read (HandleRouter): without a cap an
    // unauthenticated peer could make ZeroMQ buffer a frame of any size it announces. No
    // message exceeds the largest window a channel may open.
    impl->router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxWindowBytes + 4096));
    if (encrypt) {
      impl->router.set(zmq::sockopt::curve_server, true);
      impl->router.set(zmq::sockopt::curve_secretkey, impl->curve_server_secret);
    }
    std::string tcp = "tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
    try {
      impl->router.bind(tcp);
    } catch (const zmq::error_t& e) {
      return Status::Unavailable("stream hub: cannot bind " + tcp + ": " + e.what());
    }
    impl->tcp_endpoint = impl->router.get(zmq::sockopt::last_endpoint);
    if (!ipc_dir.empty()) {
      static std::atomic<int> n{0};
      std::error_code ec;
      std::filesystem::create_directories(ipc_dir, ec);
      impl->ipc_path = ipc_dir / ("stream-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock");
      if (impl->ipc_path.string().size() > 100) {
        // A socket file's path must fit sockaddr_un (108 bytes): a deep work dir only costs
        // same-host peers the ipc:// shortcut, not the daemon its start.
        impl->log->warn("stream hub: {} is too long for a unix socket's path; same-host peers use tcp:// instead",
                        impl->ipc_path.string());
        impl->ipc_path.clear();
      } else {
        std::filesystem::remove(impl->ipc_path, ec);
        try {
          impl->router.bind("ipc://" + impl->ipc_path.string());
        } catch (const zmq::error_t& e) {
          return Status::Unavailable("stream hub: cannot bind ipc://" + impl->ipc_path.string() + ": " + e.what());
        }
        impl->ipc_endpoint = "ipc://" + impl->ipc_path.string();
      }
    }
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("stream hub: ") + e.what());
  }
  Impl* raw = impl.get();
  impl->io = std::thread([raw] { raw->Run(); });
  impl->log->info("stream hub listening on {}{}{}", impl->tcp_endpoint,
                  impl->ipc_endpoint.empty() ? "" : " and " + impl->ipc_endpoint, encrypt ? " (CurveZMQ)" : "");
  return std::unique_ptr<StreamHub>(new StreamHub(std::move(impl)));
}

StreamPeer StreamHub::endpoints() const { return {impl_->tcp_endpoint, impl_->ipc_endpoint, impl_->host_label}; }

Result<std::unique_ptr<ChannelWriter>> StreamHub::OpenWriter(const StreamPeer& peer, const StreamKey& key,
                                                             StreamOptions options) {
  std::string endpoint = peer.tcp;
  if (!peer.ipc.empty() && !impl_->host_label.empty() && peer.host == impl_->host_label) endpoint = peer.ipc;
  if (endpoint.rfind("tcp://", 0) != 0 && endpoint.rfind("ipc://", 0) != 0)
    return Status::InvalidArgument("stream peer: unsupported endpoint \"" + endpoint + "\"");
  options.window_bytes = std::clamp<size_t>(options.window_bytes, 1, kMaxWindowBytes);
  options.window_messages = std::clamp<size_t>(options.window_messages, 1, kMaxWindowMessages);
  std::lock_guard lock(impl_->mu);
  if (impl_->stopped) return Status::Cancelled("stream hub stopped");
  if (impl_->out.count(key)) return Status::AlreadyExists("stream " + key.ToString() + " already has a writer here");
  auto& p = impl_->peers[endpoint];
  if (!p) {
    p = std::make_shared<PeerConn>();
    p->endpoint = endpoint;
    p->routing_id = "w" + RandomHex(15);
  }
  ++p->writers;
  auto c = std::make_shared<OutChan>();
  c->key = key;
  c->peer = p;
  c->window_bytes = options.window_bytes;
  c->window_messages = options.window_messages;
  impl_->out[key] = c;
  impl_->Push(Cmd{CmdKind::kOpen, key, endpoint, {}, options.window_bytes, options.window_messages, {}});
  impl_->log->debug("stream {}: writer to {}", key.ToString(), endpoint);
  return std::unique_ptr<ChannelWriter>(new StreamWriter(impl_, std::move(c), options));
}

Result<std::unique_ptr<ChannelReader>> StreamHub::OpenReader(const StreamKey& key, StreamOptions options) {
  std::lock_guard lock(impl_->mu);
  if (impl_->stopped) return Status::Cancelled("stream hub stopped");
  if (impl_->in_closed.count(key)) return Status::AlreadyExists("stream " + key.ToString() + " was already read here");
  auto& c = impl_->in[key];
  if (!c) {
    c = std::make_shared<InChan>();
    c->key = key;
  }
  if (c->has_reader) return Status::AlreadyExists("stream " + key.ToString() + " already has a reader");
  c->has_reader = true;
  c->created = Clock::now();  // open_timeout runs from the reader's open
  return std::unique_ptr<ChannelReader>(new StreamReader(impl_, c, options));
}

void StreamHub::DropJob(uint64_t job) {
  auto& h = *impl_;
  std::lock_guard lock(h.mu);
  h.dropped_jobs.insert(job);
  for (auto it = h.in.lower_bound(StreamKey{job, 0, 0}); it != h.in.end() && it->first.job == job;) {
    auto& c = it->second;
    c->cancelled = true;
    h.buffered -= c->bytes;
    c->bytes = 0;
    c->queue.clear();
    if (!c->producer.empty() && !c->ended)
      h.Push(Cmd{CmdKind::kAbortToProducer, c->key, c->producer, {}, 0, 0, std::string(kConsumerDroppedJob)});
    c->cv.notify_all();
    h.in_closed.insert(it->first);
    it = h.in.erase(it);
  }
  for (auto it = h.out.lower_bound(StreamKey{job, 0, 0}); it != h.out.end() && it->first.job == job; ++it) {
    auto& c = it->second;
    if (!c->cancelled && !c->closed)
      h.Push(Cmd{CmdKind::kAbortToConsumer, c->key, c->peer->endpoint, {}, 0, 0, std::string(kProducerDroppedJob)});
    c->cancelled = true;
    c->cv.notify_all();
  }
}

size_t StreamHub::buffered_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->buffered;
}

size_t StreamHub::in_flight_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->in_flight;
}

uint64_t StreamHub::dropped_frames() const { return impl_->dropped.load(); }

}  // namespace copse::chan
