#include "jobmanager/jm_server.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>

#include <asio.hpp>

#include "common/auth.h"
#include "common/dir_lock.h"
#include "common/framed_connection.h"
#include "common/logging.h"
#include "jobmanager/client_api.h"
#include "jobmanager/durable_copies.h"
#include "jobmanager/http_api.h"
#include "jobmanager/job_history.h"
#include "jobmanager/job_loader.h"
#include "jobmanager/journal.h"
#include "jobmanager/scheduler.h"
#include "jobmanager/trace_streamer.h"
#include "protocol/codec.h"

namespace copse::jm {
namespace {

std::shared_ptr<spdlog::logger> JmLog() {
  static auto log = Logger("jm");
  return log;
}

/// Why `host` cannot be a host name or IP address ("" when it can): shown in tables and logs,
/// and dialled by other daemons.
std::string HostProblem(const std::string& host) {
  const bool plain = !host.empty() && host.size() <= 253 && std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr(".-:_%[]", c) != nullptr;
  });
  return plain ? "" : DumpJson(Json(host.substr(0, 64))) + " is not a host name or IP address";
}

}  // namespace

class JmServer::Impl : public DaemonSink {
 public:
  explicit Impl(JmServerOptions options)
      : options_(std::move(options)),
        acceptor_(io_),
        local_acceptor_(io_),
        tick_timer_(io_),
        scheduler_(*this, clock_, options_.scheduler) {
    scheduler_.set_storage(&durable_files_);
  }

  Status Listen() {
    COPSE_ASSIGN_OR_RETURN(secret_, auth::LoadOrCreateSecret(options_.state_dir));  // creates the directory
    // Before the journal is read: a second job manager here would rewrite it under the first.
    COPSE_ASSIGN_OR_RETURN(state_lock_, DirLock::Acquire(options_.state_dir, "the job manager's state directory"));
    // Resume what a previous job manager in this state directory was running.
    std::vector<std::string> warnings;
    bool records_lost = false;
    COPSE_ASSIGN_OR_RETURN(auto records, Journal::Replay(options_.state_dir, &warnings, &records_lost));
    for (const auto& w : warnings) JmLog()->warn("{}", w);
    std::vector<std::string> skipped;
    COPSE_ASSIGN_OR_RETURN(history_, JobHistory::Open(options_.state_dir / "history"));
    client_api_.emplace(scheduler_, *history_);
    // What the restore logs goes to the history too, after what is there: nothing is written
    // until the first flush, so the files read back below hold only what came before.
    scheduler_.set_history(history_.get());
    if (!records.empty()) {
      size_t jobs = scheduler_.Restore(records, options_.catalog, &skipped);
      JmLog()->warn("restored {} jobs from {} journal records", jobs, records.size());
    }
    // A lost or damaged journal must not hand out an id whose history is kept: a new job
    // would add its lines to another's.
    if (const auto kept = history_->Jobs(); !kept.empty()) scheduler_.ReserveJobIds(kept.back().value());
    // Running jobs' event lines and attempts from before the restart, so that their logs and
    // traces go on from where they were. A finished job's stay in its history files, read when
    // asked for (ClientApi), as a forgotten job's are: a restart after a million-vertex job
    // would otherwise parse every one of its attempts again.
    for (uint64_t id : scheduler_.JobIds()) {
      const bool running = scheduler_.StateOf(JobId(id)) == JobState::kRunning;
      // Finished, but the job manager stopped before its summary was written: the summary
      // takes the loss curve from the history, so that one is read back too.
      const bool unsummarized = !running && !history_->Summary(JobId(id));
      if (running || unsummarized) {
        const auto events = history_->Load(JobId(id));
        scheduler_.RestoreHistory(JobId(id), events->lines, events->spans, events->progress);
      }
      if (unsummarized) {
        if (auto summary = scheduler_.FinalSummary(JobId(id))) history_->JobFinished(JobId(id), *summary);
      }
    }
    // The rewrite below drops what was not restored: a person gets the journal as it was.
    if (records_lost || !skipped.empty()) {
      COPSE_ASSIGN_OR_RETURN(auto copy, Journal::KeepDamagedCopy(options_.state_dir));
      JmLog()->warn("{}; the journal as it was is kept as {}",
                    records_lost ? "the journal was not read to its end"
                                 : fmt::format("{} journal records were skipped (logged above)", skipped.size()),
                    copy.string());
      warnings.insert(warnings.end(), skipped.begin(), skipped.end());  // forces the rewrite
    }
    COPSE_ASSIGN_OR_RETURN(journal_, Journal::Open(options_.state_dir, options_.journal_fsync));
    scheduler_.set_journal(journal_.get());
    if (!records.empty()) journal_->Record(scheduler_.RestartRecord());  // before any new attempt's record
    // Rewritten at every start, superseded or not (the job manager does not listen yet): what
    // the replay dropped (a torn tail, jobs that no longer load) goes with the rest. A journal
    // the replay stopped short in is rewritten whatever the compaction settings say: records
    // appended after the damage would be dropped with it at the next start.
    if ((!records.empty() && options_.journal_compact_bytes > 0) || !warnings.empty()) CompactJournal();
    std::error_code ec;
    // "localhost" as clients and daemons take it; other names are not resolved.
    auto address = asio::ip::make_address(options_.host == "localhost" ? "127.0.0.1" : options_.host, ec);
    if (ec) return Status::InvalidArgument("--listen: \"" + options_.host + "\" is not an IP address (nor localhost)");
    asio::ip::tcp::endpoint ep(address, options_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return Status::Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " + ec.message());
    // Publish the address atomically so a waiting `copse run` never reads half a file.
    auto addr_file = options_.state_dir / "jm.addr";
    auto tmp = options_.state_dir / "jm.addr.tmp";
    std::ofstream(tmp) << options_.host << ":" << port() << "\n";
    std::filesystem::rename(tmp, addr_file, ec);
    if (ec) return Status::IOError("cannot write " + addr_file.string());
    JmLog()->info("listening on {}:{}", options_.host, port());
    if (options_.http_port) COPSE_RETURN_NOT_OK(ServeHttp());
    scheduler_.StartRecoveryGrace();
    ListenLocal();
    Accept(acceptor_);
    last_tick_at_ = std::chrono::steady_clock::now();
    ScheduleTick();
    return Status::OK();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  uint16_t http_port() const { return http_ ? http_->port() : 0; }
  void Run() { io_.run(); }
  void Stop() {
    // The HTTP API's requests waiting for the loop give up, and its streams end, first.
    closing_ = true;
    if (http_) http_->Stop();
    asio::post(io_, [this] {
      std::error_code ec;
      acceptor_.close(ec);
      local_acceptor_.close(ec);
      tick_timer_.cancel();
      // Closing a connection erases it from peers_ (OnClose): close a copy's.
      std::vector<std::shared_ptr<net::FramedConnection>> open;
      for (const auto& [conn, peer] : peers_) open.push_back(conn);
      for (auto& conn : open) conn->Close(Status::Cancelled("job manager stopping"));
      io_.stop();
    });
  }

  void SendToDaemon(DaemonId daemon, const protocol::JmToDaemon& message) override {
    auto it = daemon_conns_.find(daemon);
    if (it != daemon_conns_.end()) it->second->SendRaw(protocol::EncodeFrame(message));
  }

 private:
  struct Peer {
    std::string nonce;
    bool authenticated = false;
    std::string role;
    DaemonId daemon;
    std::chrono::steady_clock::time_point last_seen;
  };

  /// The same service on a local socket (net::ControlLocalSocketName), for daemons on this host:
  /// their reports and run messages skip the TCP/IP stack. Without it (another process holds
  /// the name) they use TCP.
  void ListenLocal() {
    std::error_code ec;
    const auto tcp = acceptor_.local_endpoint();
    const auto ep = net::AbstractEndpoint(net::ControlLocalSocketName(tcp.address().to_string(), tcp.port()));
    local_acceptor_.open(ep.protocol(), ec);
    if (!ec) local_acceptor_.bind(ep, ec);
    if (!ec) local_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      JmLog()->warn("no local socket for daemons on this host (they use TCP): {}", ec.message());
      local_acceptor_.close(ec);
      return;
    }
    Accept(local_acceptor_);
  }

  /// Accepts on `acceptor` (TCP or the local socket) until it closes. A failed accept (out of
  /// file descriptors: the pending connection stays queued, so accepting again at once would
  /// fail again at once) rests 100 ms first, saying so at most once a second.
  template <class Acceptor>
  void Accept(Acceptor& acceptor) {
    acceptor.async_accept([this, &acceptor](std::error_code ec, auto socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        const auto now = std::chrono::steady_clock::now();
        if (now - accept_error_logged_at_ >= std::chrono::seconds(1)) {
          JmLog()->warn("cannot accept a connection ({}); resting 100 ms", ec.message());
          accept_error_logged_at_ = now;
        }
        auto rest = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
        rest->async_wait([this, &acceptor, rest](std::error_code waited) {
          if (!waited) Accept(acceptor);
        });
        return;
      }
      auto conn = std::make_shared<net::FramedConnection>(std::move(socket), wire::kMaxHandshakeBytes);
      if (options_.tls && !conn->local())
        conn->UseTls(std::make_unique<tls::Session>(*options_.tls, tls::Session::Role::kServer, conn->peer()));
      Greet(std::move(conn));
      Accept(acceptor);
    });
  }

  /// A new peer: it must authenticate before anything else, within the handshake timeout. At
  /// most kMaxHandshakes wait to authenticate at once: beyond that the oldest is closed, so a
  /// flood of connections that never authenticate neither runs the job manager out of file
  /// descriptors nor keeps a real daemon or client out for long.
  void Greet(std::shared_ptr<net::FramedConnection> conn) {
    size_t waiting = 0;
    std::shared_ptr<net::FramedConnection> oldest;
    const auto now = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point oldest_seen = now;
    for (const auto& [c, p] : peers_) {
      if (p.authenticated) continue;
      ++waiting;
      if (p.last_seen < oldest_seen) oldest = c, oldest_seen = p.last_seen;
    }
    if (waiting >= kMaxHandshakes) {
      // A handshake takes a round trip: one waiting for a second is a stranger's, and goes;
      // when all are young (a restarted job manager's daemons all reconnecting), the newcomer
      // does, and retries.
      const bool stale = oldest && now - oldest_seen > std::chrono::seconds(1);
      (stale ? oldest : conn)->Close(Status::Unavailable("too many connections in their handshake"));
      if (!stale) return;
    }
    Peer& peer = peers_[conn];
    peer.nonce = auth::NewNonce();
    peer.last_seen = std::chrono::steady_clock::now();
    std::weak_ptr<net::FramedConnection> weak = conn;
    conn->set_proto_handler([this, weak](std::string body) {
      if (auto c = weak.lock()) OnProto(c, std::move(body));
    });
    conn->Start(
        [this, weak](Json msg) {
          if (auto c = weak.lock()) OnMessage(c, std::move(msg));
        },
        [this, weak](const Status& why) {
          if (auto c = weak.lock()) OnClose(c, why);
        });
    Json hello = {{"op", "hello"}, {"nonce", peer.nonce}, {"version", wire::kProtocolVersion}};
    if (options_.tls) hello["tls"] = true;  // on the local socket too: a daemon without TLS stops there
    conn->Send(hello);
  }

  void OnClose(const std::shared_ptr<net::FramedConnection>& conn, const Status& why) {
    auto it = peers_.find(conn);
    if (it == peers_.end()) return;
    if (it->second.daemon.valid()) {
      daemon_conns_.erase(it->second.daemon);
      // A job manager that stops closes its daemons' connections itself: they are not lost.
      // Declaring them so would journal their outputs lost and fail their running attempts,
      // which the next job manager would then re-run instead of finding them where they are.
      if (!closing_) {
        scheduler_.DaemonLost(it->second.daemon, "connection closed: " + why.message());
        RequestFlush();
      }
    }
    peers_.erase(it);
  }

  void OnMessage(const std::shared_ptr<net::FramedConnection>& conn, Json msg) {
    auto it = peers_.find(conn);
    if (it == peers_.end()) return;
    Peer& peer = it->second;
    peer.last_seen = std::chrono::steady_clock::now();
    const std::string op = msg["op"].get<std::string>();
    if (!peer.authenticated) {
      const std::string role = StringMember(msg, "role");
      bool ok = op == "auth" && msg.contains("mac") && msg["mac"].is_string() && (role == "daemon" || role == "client") &&
                auth::ConstantTimeEquals(msg["mac"].get<std::string>(), auth::Mac(secret_, peer.nonce));
      if (!ok) {
        // At most a line a second, however many are refused: a flood must not fill the disk.
        const auto now = std::chrono::steady_clock::now();
        if (now - refusal_logged_at_ >= std::chrono::seconds(1)) {
          JmLog()->warn("refused unauthenticated peer {}{}", conn->peer(),
                        refusals_unlogged_ ? fmt::format(" (and {} more since the last such line)", refusals_unlogged_) : "");
          refusal_logged_at_ = now;
          refusals_unlogged_ = 0;
        } else {
          ++refusals_unlogged_;
        }
        return conn->SendErrorAndClose("authentication failed: answer the hello nonce with the job manager's secret");
      }
      peer.authenticated = true;
      peer.role = role;
      conn->set_max_frame_bytes(wire::kMaxControlBytes);
      conn->Send(auth::Welcome(msg, secret_, peer.nonce));
      return;
    }
    try {
      if (peer.role == "daemon") {
        // A daemon speaks JSON only to say why it hangs up (a message of ours it refused).
        if (op == "error")
          return conn->Close(Status::InvalidArgument("the daemon refused a message: " + StringMember(msg, "message")));
        return conn->SendErrorAndClose("a daemon speaks in protocol frames, not JSON");
      }
      HandleClient(conn, op, msg);
    } catch (const Json::exception& e) {
      // A well-framed message with members of the wrong type: the peer is broken, not us.
      conn->SendErrorAndClose("malformed \"" + op + "\" message: " + e.what());
    } catch (const std::invalid_argument& e) {
      // A number out of its member's range (IntegerOr and its kin name the member).
      conn->SendErrorAndClose("malformed \"" + op + "\" message: " + e.what());
    } catch (const std::bad_alloc&) {
      // One request too large for this machine's memory must not take the running jobs down.
      JmLog()->error("out of memory handling \"{}\" from {}", op, conn->peer());
      conn->SendErrorAndClose("the job manager ran out of memory handling \"" + op + "\"");
    }
    RequestFlush();
  }

  /// A daemon's message (protocol/daemon.proto), decoded and checked by the codec; one that
  /// breaks the schema drops that daemon, naming the message and the field.
  void OnProto(const std::shared_ptr<net::FramedConnection>& conn, std::string body) {
    auto it = peers_.find(conn);
    if (it == peers_.end()) return;
    Peer& peer = it->second;
    peer.last_seen = std::chrono::steady_clock::now();
    if (!peer.authenticated || peer.role != "daemon") return conn->SendErrorAndClose("only a daemon sends protocol frames");
    auto msg = protocol::DecodeDaemonToJm(body);
    if (!msg.ok()) return conn->SendErrorAndClose("malformed message: " + msg.status().message());
    try {
      HandleDaemon(conn, peer, *msg);
    } catch (const std::bad_alloc&) {
      JmLog()->error("out of memory handling \"{}\" from {}", protocol::BodyName(*msg), conn->peer());
      conn->SendErrorAndClose("the job manager ran out of memory handling \"" + std::string(protocol::BodyName(*msg)) + "\"");
    } catch (const std::exception& e) {
      // What a daemon relays from a program (its progress figures) must never take the job
      // manager down: that daemon is dropped, the jobs go on.
      JmLog()->error("handling \"{}\" from {}: {}", protocol::BodyName(*msg), conn->peer(), e.what());
      conn->SendErrorAndClose("the job manager could not handle \"" + std::string(protocol::BodyName(*msg)) + "\": " + e.what());
    }
    RequestFlush();
  }

  void HandleDaemon(const std::shared_ptr<net::FramedConnection>& conn, Peer& peer, protocol::DaemonToJm& msg) {
    using M = protocol::DaemonToJm;
    if (msg.body_case() == M::kHeartbeat) return;
    if (msg.body_case() == M::kRegister) {
      if (peer.daemon.valid()) return conn->SendErrorAndClose("already registered");
      protocol::Register& reg = *msg.mutable_register_();
      DaemonSpec spec;
      spec.name = reg.name();
      spec.cpus = reg.has_cpus() ? reg.cpus() : 1.0;
      spec.gpus = static_cast<int>(reg.gpus());  // checked: 0 to 1,000,000
      spec.memory_mb = reg.memory_mb();
      spec.gpu_memory_mb = reg.gpu_memory_mb();
      spec.data_host = reg.data_host();
      spec.data_port = static_cast<uint16_t>(reg.data_port());  // checked: 1 to 65535
      if (std::string why = DaemonNameProblem(spec.name); !why.empty()) return conn->SendErrorAndClose("register: " + why);
      if (std::string why = HostProblem(spec.data_host); !why.empty())
        return conn->SendErrorAndClose("register: data_host " + why);
      spec.stream_endpoints = std::move(*reg.mutable_stream());
      spec.control = conn->local() ? "local socket" : "tcp";
      spec.labels.insert(reg.labels().begin(), reg.labels().end());
      OutputInventory inventory;
      for (const protocol::OutputKey& k : reg.outputs()) inventory.insert({k.job(), k.vertex(), k.version(), k.port()});
      auto id = scheduler_.AddDaemon(std::move(spec), inventory);
      if (!id.ok()) return conn->SendErrorAndClose(id.status().message());
      peer.daemon = *id;
      daemon_conns_[*id] = conn;
      // Reply before the first tasks (AddDaemon may already have placed some in the outbox).
      // The daemon heartbeats at the pace this job manager's timeout needs: five per timeout.
      protocol::JmToDaemon registered;
      registered.mutable_registered()->set_daemon(id->value());
      registered.mutable_registered()->set_heartbeat_ms(static_cast<uint32_t>(HeartbeatIntervalMs()));
      conn->SendRaw(protocol::EncodeFrame(registered));
      return;
    }
    if (!peer.daemon.valid()) return conn->SendErrorAndClose("register first");
    switch (msg.body_case()) {
      case M::kNcclId: return scheduler_.RelayNcclId(msg.nccl_id().group(), msg.nccl_id().id(), peer.daemon);
      case M::kVertexLog: return StoreVertexLog(msg.vertex_log());
      case M::kMirrored: return scheduler_.OnMirrored(msg.mirrored(), peer.daemon);
      case M::kReport:
        for (const protocol::AttemptReport& a : msg.report().attempts()) scheduler_.OnAttemptFinished(AttemptReport::From(a));
        return;
      case M::BODY_NOT_SET:  // a kind of message a newer daemon has (checked: it has fields we do not know)
        JmLog()->warn("ignoring a message of a kind this job manager does not know from {}", conn->peer());
        return;
      default: conn->SendErrorAndClose("unexpected daemon message \"" + std::string(protocol::BodyName(msg)) + "\"");
    }
  }

  void HandleClient(const std::shared_ptr<net::FramedConnection>& conn, const std::string& op, const Json& msg) {
    // Every request but submit (whose "job" is the document) names a job by its id.
    if (op != "submit" && msg.contains("job") && !JobIdFrom(msg).valid()) {
      return conn->Send({{"op", "error"}, {"message", "\"job\": expected a job id (a whole number), got " + msg["job"].dump()}});
    }
    if (op == "submit") {
      const Json& doc = msg.at("job");
      std::string source = msg.value("source", std::string("<submitted>"));
      JobLoad load = LoadJobJson(doc, source, options_.catalog);
      if (!load.ok()) {
        return conn->Send({{"op", "error"}, {"message", load.status().message()}, {"errors", load.diags.ToJson()}});
      }
      if (std::string why = scheduler_.WhyItCannotFit(*load.graph); !why.empty()) {
        return conn->Send({{"op", "error"}, {"message", source + ": " + why}});
      }
      if (!scheduler_.JobIdsLeft()) {
        return conn->Send({{"op", "error"}, {"message", "job ids are used up (the journal names ids up to 2^53)"}});
      }
      JobId id = scheduler_.Submit(load.graph, msg.value("job_dir", std::string()));
      FlushJournal();  // the job is durable before the client hears its id
      return conn->Send({{"op", "submitted"}, {"job", id.value()}});
    }
    if (op == "wait") {
      // Answered with the job's final status once it is no longer running (see AnswerWaiters).
      JobId job = JobIdFrom(msg);
      if (!scheduler_.HasJob(job)) {
        if (Json summary = client_api_->ForgottenSummary(job); !summary.is_null()) {
          return conn->Send({{"op", "job"}, {"job", summary}});
        }
        return conn->Send({{"op", "error"}, {"message", "no job " + job.ToString()}});
      }
      waiters_.emplace_back(job, conn);
      return;
    }
    if (op == "trace") {
      // Copied here, formatted and sent in parts by the streamer's thread (trace_streamer.h).
      if (!trace_streamer_.Accepts(conn)) {
        return conn->Send({{"op", "error"}, {"message", "too many traces are being sent; ask again later"}});
      }
      auto snapshot = client_api_->Trace(JobIdFrom(msg));
      if (!snapshot.ok()) return conn->Send({{"op", "error"}, {"message", snapshot.status().message()}});
      return trace_streamer_.Send(conn, std::move(*snapshot));
    }
    if (auto reply = client_api_->Answer(op, msg)) return conn->Send(*reply);
    conn->SendErrorAndClose("unknown client message \"" + op + "\"");
  }

  /// A daemon's chunks of an attempt's log (`msg` names the attempt), kept in the job's history.
  /// Malformed ones are logged and dropped: they cost the log, never the job manager.
  void StoreVertexLog(const protocol::VertexLog& log) {
    const JobId job(log.job());
    if (!scheduler_.HasAttempt(job, VertexId(log.vertex()), log.version())) {
      JmLog()->warn("dropping a vertex log naming no attempt sent of a known job: job {}, vertex {}, version {}", log.job(),
                    log.vertex(), log.version());
      return;
    }
    if (Status st = history_->AppendVertexLog(job, VertexId(log.vertex()), log.version(), log.chunks()); !st.ok()) {
      JmLog()->warn("job {}: dropping a vertex log: {}", job.value(), st.message());
    }
  }

  /// `copse jm --http`: the HTTP API and dashboard; its address goes to state_dir/http.addr.
  Status ServeHttp() {
    HttpApi::Options o;
    o.host = options_.http_host;
    o.port = *options_.http_port;
    o.secret = secret_;
    o.event_interval = options_.http_event_interval;
    auto run = [this](const std::function<void()>& fn) { return RunOnLoop(fn); };
    auto server_metrics = [this](metrics::MetricsWriter& out) { WriteServerMetrics(out); };
    COPSE_ASSIGN_OR_RETURN(http_, HttpApi::Start(std::move(o), *client_api_, scheduler_, run, server_metrics));
    std::error_code ec;
    const auto file = options_.state_dir / "http.addr", tmp = options_.state_dir / "http.addr.tmp";
    std::ofstream(tmp) << options_.http_host << ":" << http_->port() << "\n";
    std::filesystem::rename(tmp, file, ec);
    if (ec) return Status::IOError("cannot write " + file.string());
    JmLog()->info("HTTP API and dashboard on http://{}:{}/", options_.http_host, http_->port());
    return Status::OK();
  }

  /// Runs `fn` on the io thread and waits for it. Gives up (false) once the job manager is
  /// closing, or after 10 s of a loop too busy to start it; `fn` then never runs.
  bool RunOnLoop(const std::function<void()>& fn) {
    struct Turn {
      std::mutex mu;
      bool started = false, abandoned = false;
      std::promise<void> done;
    };
    auto turn = std::make_shared<Turn>();
    auto done = turn->done.get_future();
    asio::post(io_, [turn, &fn] {
      {
        std::lock_guard lock(turn->mu);
        if (turn->abandoned) return;  // the caller and `fn` are gone
        turn->started = true;
      }
      try {
        fn();
      } catch (const std::exception& e) {
        JmLog()->error("HTTP API: {}", e.what());
      }
      turn->done.set_value();
    });
    const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (!closing_ && std::chrono::steady_clock::now() < give_up_at) continue;
      std::lock_guard lock(turn->mu);
      if (turn->started) continue;  // running now: it ends soon
      turn->abandoned = true;
      return false;
    }
    return true;
  }

  /// /metrics: what the job manager itself adds to the scheduler's figures.
  void WriteServerMetrics(metrics::MetricsWriter& out) const {
    out.Family("copse_journal_commit_seconds", "histogram", "Group commits of the job manager's journal.");
    out.HistogramSamples("copse_journal_commit_seconds", journal_commit_s_);
    out.Gauge("copse_journal_bytes", "Size of the job manager's journal.", static_cast<double>(journal_->bytes()));
    size_t clients = 0;
    for (const auto& [conn, peer] : peers_) clients += peer.authenticated && peer.role == "client";
    out.Gauge("copse_client_connections", "Clients connected to the control port.", static_cast<double>(clients));
  }

  /// Coalesces the scheduler's outgoing batches: one flush after every message that is
  /// already waiting has been handled.
  void RequestFlush() {
    if (flush_pending_) return;
    flush_pending_ = true;
    asio::post(io_, [this] {
      flush_pending_ = false;
      FlushJournal();
      scheduler_.Flush();
      AnswerWaiters();
    });
  }

  /// Group commit, then compaction when due.
  void FlushJournal() {
    const auto started = std::chrono::steady_clock::now();
    const uint64_t bytes_before = journal_->bytes();
    if (Status st = journal_->Flush(); !st.ok()) JmLog()->error("{}", st.message());
    if (journal_->bytes() != bytes_before) {  // a commit (an empty flush is not one)
      journal_commit_s_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    if (journal_->bytes() >= std::max(options_.journal_compact_bytes, retry_compaction_at_) && CompactionDue()) {
      CompactJournal();
    }
  }

  /// Due when at least half the journal's records are superseded (forgotten jobs, completions
  /// run again): each rewrite then at least halves the file, so its cost stays proportional to
  /// what was appended since the last one, and a long job whose every record still counts never
  /// pays for a rewrite that would drop nothing.
  bool CompactionDue() const {
    return options_.journal_compact_bytes > 0 && journal_->records() >= 2 * scheduler_.SnapshotRecords();
  }

  void CompactJournal() {
    const uint64_t before = journal_->bytes();
    const auto snapshot = scheduler_.Snapshot();
    if (Status st = journal_->Rewrite(snapshot); !st.ok()) {
      JmLog()->error("journal compaction: {}", st.message());
      retry_compaction_at_ = 2 * before;  // not on every commit
      return;
    }
    retry_compaction_at_ = 0;
    JmLog()->info("journal compacted from {} to {} bytes ({} records)", before, journal_->bytes(), snapshot.size());
  }

  void AnswerWaiters() {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto conn = it->second.lock();
      auto state = scheduler_.StateOf(it->first);
      if (conn && state && *state == JobState::kRunning) {
        ++it;
        continue;
      }
      if (conn) conn->Send({{"op", "job"}, {"job", client_api_->WithLogHint(scheduler_.JobStatus(it->first))}});
      it = waiters_.erase(it);
    }
  }

  /// After this io thread was busy for a while (a huge job's submission, a long compaction),
  /// the heartbeats that arrived meanwhile are still unread in the sockets, and the tick timer
  /// that expired meanwhile may run before they are read: the time the tick ran late is the
  /// job manager's silence, not the daemons', and is added to every peer's credit. (Moving the
  /// clocks forward by the lateness, rather than resetting them, keeps a job manager that is
  /// always a little late still able to declare a silent daemon lost.)
  void ForgiveOwnStall(std::chrono::steady_clock::time_point now) {
    // Since the previous tick began: its own work (a slow Tick) counts as well as the wait.
    const auto late = now - last_tick_at_ - options_.tick;
    last_tick_at_ = now;
    if (late <= decltype(late)::zero()) return;
    for (auto& [conn, peer] : peers_) peer.last_seen = std::min(now, peer.last_seen + late);
    if (late < options_.heartbeat_timeout / 2) return;
    JmLog()->warn(
        "job manager: busy for {} ms without reading; that time is not counted against the daemons' "
        "heartbeats",
        std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
  }

  /// Once a minute: finished jobs past the history retention, and not still held, are removed.
  void PruneHistory(std::chrono::steady_clock::time_point now) {
    if (options_.history_retention <= std::chrono::seconds::zero() || now < next_prune_) return;
    next_prune_ = now + std::chrono::minutes(1);
    const auto ids = scheduler_.JobIds();
    const auto cutoff = std::chrono::system_clock::now() - options_.history_retention;
    const int64_t before = std::chrono::duration_cast<std::chrono::milliseconds>(cutoff.time_since_epoch()).count();
    if (size_t removed = history_->Prune(before, std::set<uint64_t>(ids.begin(), ids.end())); removed > 0) {
      JmLog()->info("removed the history of {} jobs finished more than {} s ago", removed, options_.history_retention.count());
    }
  }

  /// Five heartbeats per timeout, within what a daemon accepts (1 ms to 60 s).
  int64_t HeartbeatIntervalMs() const { return std::clamp<int64_t>(options_.heartbeat_timeout.count() / 5, 10, 60'000); }

  void ScheduleTick() {
    tick_timer_.expires_after(options_.tick);
    tick_timer_.async_wait([this](std::error_code ec) {
      if (ec) return;
      auto now = std::chrono::steady_clock::now();
      ForgiveOwnStall(now);
      std::vector<std::shared_ptr<net::FramedConnection>> silent;
      for (auto& [conn, peer] : peers_) {
        const bool daemon_silent = peer.daemon.valid() && now - peer.last_seen > options_.heartbeat_timeout;
        const bool handshake_over = !peer.authenticated && now - peer.last_seen > options_.handshake_timeout;
        if (daemon_silent || handshake_over) silent.push_back(conn);
      }
      for (auto& conn : silent) conn->Close(Status::Timeout("no heartbeat"));
      scheduler_.Tick();
      history_->Flush();  // once a tick: its appends are kept off every reply's path
      PruneHistory(now);
      RequestFlush();
      ScheduleTick();
    });
  }

  JmServerOptions options_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  asio::local::stream_protocol::acceptor local_acceptor_;
  asio::steady_timer tick_timer_;
  std::chrono::steady_clock::time_point accept_error_logged_at_{};
  SteadyClock clock_;
  // Held while this job manager runs; declared before the journal so that it is released
  // only after the journal's last flush (members are destroyed in reverse order).
  std::optional<DirLock> state_lock_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<JobHistory> history_;  // before the scheduler, which writes to it: destroyed after it
  DurableCopyFiles durable_files_;
  std::chrono::steady_clock::time_point next_prune_{};
  Scheduler scheduler_;
  std::string secret_;
  std::map<std::shared_ptr<net::FramedConnection>, Peer> peers_;
  std::map<DaemonId, std::shared_ptr<net::FramedConnection>> daemon_conns_;
  static constexpr size_t kMaxHandshakes = 128;
  std::chrono::steady_clock::time_point refusal_logged_at_{};
  uint64_t refusals_unlogged_ = 0;
  std::vector<std::pair<JobId, std::weak_ptr<net::FramedConnection>>> waiters_;
  TraceStreamer trace_streamer_;         // before the connections it sends on are gone: destroyed first
  std::optional<ClientApi> client_api_;  // once the history is open
  metrics::Histogram journal_commit_s_{metrics::Histogram::Exponential(1e-5, 4, 10)};
  std::atomic<bool> closing_{false};
  std::unique_ptr<HttpApi> http_;  // last: its requests end before what they read goes
  bool flush_pending_ = false;
  std::chrono::steady_clock::time_point last_tick_at_;  // when the last tick began (or Listen)
  uint64_t retry_compaction_at_ = 0;                    // journal size at which to try again after a failed rewrite
};

JmServer::JmServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JmServer::~JmServer() = default;

Result<std::unique_ptr<JmServer>> JmServer::Start(JmServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  COPSE_RETURN_NOT_OK(impl->Listen());
  return std::unique_ptr<JmServer>(new JmServer(std::move(impl)));
}

uint16_t JmServer::port() const { return impl_->port(); }
uint16_t JmServer::http_port() const { return impl_->http_port(); }
void JmServer::Run() { impl_->Run(); }
void JmServer::Stop() { impl_->Stop(); }

}  // namespace copse::jm
