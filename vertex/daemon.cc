#include "vertex/daemon.h"

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <asio.hpp>

#include "channels/data_server.h"
#include "channels/output_store.h"
#include "channels/remote_reader.h"
#include "channels/shm_registry.h"
#include "channels/stream_hub.h"
#ifdef COPSE_HAVE_NCCL
#include "channels/nccl/nccl_channel.h"
#include "channels/nccl/nccl_group.h"
#endif
#include "common/dir_lock.h"
#include "common/http_server.h"
#include "common/framed_connection.h"
#include "common/json_util.h"
#include "common/logging.h"
#include "common/machine_memory.h"
#include "common/thread_name.h"
#include "protocol/codec.h"
#include "vertex/attempt_executor.h"
#include "vertex/attempt_log.h"
#include "vertex/daemon_metrics.h"
#include "vertex/gpu_pool.h"
#include "vertex/input_prefetcher.h"
#include "vertex/output_mirror.h"
#include "vertex/jm_session.h"
#include "vertex/protocol_types.h"
#include "vertex/task_queue.h"

namespace copse::vertex {
namespace {

/// Vertex programs run as batch work (SCHED_BATCH, nice 5; threads they start inherit both), so
/// the control threads — this daemon's network loop, the job manager — get a core the moment
/// they wake instead of waiting out a compute thread's time slice: a dispatch or completion
/// report on a busy machine then costs tens of microseconds, not a millisecond. Unprivileged
/// (lowering one's own priority is always allowed); failure only costs latency.
void YieldToControlThreads() {
  sched_param none{};
  (void)sched_setscheduler(0, SCHED_BATCH, &none);  // 0: the calling thread
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 5);
}

std::shared_ptr<spdlog::logger> DaemonLog() {
  static auto log = Logger("daemon");
  return log;
}

#ifdef COPSE_HAVE_NCCL
/// The gang's NCCL group as the vertex API's Collective.
class NcclCollective final : public Collective {
 public:
  NcclCollective(chan::nccl::NcclGroup& group, int device) : group_(group), device_(device) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.nranks(); }
  Status AllReduceSum(float* data, size_t count) override { return chan::nccl::AllReduceHost(group_, data, count, device_); }

 private:
  chan::nccl::NcclGroup& group_;
  int device_;
};
#endif

}  // namespace

class Daemon::Impl {
 public:
  explicit Impl(DaemonOptions options)
      : options_(std::move(options)),
        session_(options_,
                 JmSession::Handlers{[this] { return Registration(); }, [this](std::string body) { OnMessage(std::move(body)); },
                                     [this](const Status&) { CancelEverything(); }}),
        log_flush_(session_.io()),
        gpus_(options_.gpus),
        tasks_([this](const Task& t, std::optional<InputPrefetcher::After> remote) {
          if (!remote) return prefetcher_->Start(t.spec.inputs(), std::nullopt, t.cancel, nullptr);
          const uint64_t job = t.spec.job();
          const uint32_t vertex = t.spec.vertex(), version = t.spec.version();
          return prefetcher_->Start(t.spec.inputs(), remote, t.cancel, [this, job, vertex, version](const Status& st) {
            OnRemoteAfter({job, vertex, version}, st);
          });
        }) {}

  ~Impl() {
    if (metrics_http_) metrics_http_->Stop();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& [key, flag] : cancel_flags_) flag->store(true);
      tasks_.Clear();  // stops held tasks' prefetches
    }
    prefetcher_.reset();  // joins the fetch threads; their callbacks take mu_, so not under it
    mirror_.reset();      // joins its thread, before the store it writes to goes
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (data_server_) data_server_->Stop();
  }

  Status Init() {
    std::error_code ec;
    std::filesystem::create_directories(options_.work_dir / "scratch", ec);
    if (ec) return Status::IOError("cannot create work dir " + options_.work_dir.string() + ": " + ec.message());
    // Before the output store lists (and prunes) what is there: a second daemon here would
    // delete the outputs the first one serves.
    COPSE_ASSIGN_OR_RETURN(work_dir_lock_, DirLock::Acquire(options_.work_dir, "work dir"));
    COPSE_ASSIGN_OR_RETURN(store_, chan::OutputStore::Make(options_.work_dir / "outputs", options_.memory_budget_bytes));
    chan::DataServerOptions data_options;
    data_options.local_socket = options_.local_socket;
    data_options.tls = options_.tls;
    COPSE_ASSIGN_OR_RETURN(data_server_, chan::DataServer::Start(*store_, options_.data_host, 0, options_.secret, data_options));
    COPSE_ASSIGN_OR_RETURN(hub_, chan::StreamHub::Start(options_.data_host, 0, options_.work_dir / "ipc", options_.secret,
                                                        /*encrypt=*/options_.tls != nullptr));
    prefetcher_ = std::make_unique<InputPrefetcher>(options_.secret, options_.tls);
    mirror_ = std::make_unique<OutputMirror>(*store_, options_.secret, options_.tls, [this](const protocol::DaemonToJm& done) {
      session_.Send(protocol::EncodeFrame(done));
    });
    ExecutorEnv env;
    env.programs = options_.programs;
    env.store = store_.get();
    env.hub = hub_.get();
    env.shm = &shm_;
    env.gpus = &gpus_;
    env.work_dir = options_.work_dir;
    env.cpus = options_.cpus;
    env.memory_mb = OfferedMemoryMb();
    env.secret = options_.secret;
    env.tls = options_.tls;
    env.live_peer_timeout = std::max(std::chrono::milliseconds(300), 2 * options_.heartbeat_interval);
    env.join_nccl = [this](const protocol::NcclMember& nccl, int device, AttemptTask& task) {
      return JoinNcclGroup(nccl, device, task);
    };
    executor_ = std::make_unique<AttemptExecutor>(std::move(env));
    COPSE_RETURN_NOT_OK(session_.Register());
    for (int i = 0; i < std::max(1, options_.cpus); ++i) workers_.emplace_back([this] { WorkerLoop(); });
    if (options_.metrics_port) COPSE_RETURN_NOT_OK(ServeMetrics());
    return Status::OK();
  }

  /// `--metrics`: /metrics over HTTP; the address goes to work_dir/metrics.addr.
  Status ServeMetrics() {
    metrics_http_ = std::make_unique<http::HttpServer>(options_.secret);
    metrics_http_->Get("/metrics", http::Access::kViewer, [this](const http::Request&) {
      DaemonMetrics::Gauges g;
      g.slots = options_.cpus;
      {
        std::lock_guard<std::mutex> lock(mu_);
        g.running = busy_workers_, g.queued = tasks_.queued(), g.held = tasks_.held();
      }
      g.store_memory_bytes = store_->memory_bytes(), g.store_budget_bytes = store_->memory_budget_bytes();
      g.outputs = store_->List().size(), g.spills = store_->spills(), g.spilled_bytes = store_->spilled_bytes();
      g.fetches_served = data_server_->fetches(), g.data_connections = data_server_->connections_accepted();
      const chan::RemotePoolStats pool = chan::GetRemotePoolStats();
      g.remote_connections_opened = pool.connections_opened, g.remote_connections_reused = pool.connections_reused;
      metrics::MetricsWriter out;
      metrics_.Write(out, g);
      http::Response r;
      r.content_type = metrics::MetricsWriter::kContentType;
      r.body = out.Take();
      return r;
    });
    COPSE_RETURN_NOT_OK(metrics_http_->Listen(options_.metrics_host, *options_.metrics_port, "--metrics"));
    std::error_code ec;
    const auto file = options_.work_dir / "metrics.addr", tmp = options_.work_dir / "metrics.addr.tmp";
    std::ofstream(tmp) << options_.metrics_host << ":" << metrics_http_->port() << "\n";
    std::filesystem::rename(tmp, file, ec);
    if (ec) return Status::IOError("cannot write " + file.string());
    DaemonLog()->info("daemon {}: metrics on http://{}:{}/metrics", options_.name, options_.metrics_host, metrics_http_->port());
    return Status::OK();
  }

  /// What this daemon registers with, asked before every registration: the outputs it holds
  /// (after a job manager restart it keeps the ones still there), its data server and streams.
  protocol::Register Registration() const {
    protocol::Register reg;
    reg.set_name(options_.name);
    reg.set_cpus(options_.cpus);
    reg.set_gpus(options_.gpus);
    reg.set_memory_mb(options_.memory_mb);
    reg.set_gpu_memory_mb(options_.gpu_memory_mb);
    reg.mutable_labels()->insert(options_.labels.begin(), options_.labels.end());
    reg.set_data_host(options_.data_host);
    reg.set_data_port(data_server_->port());
    *reg.mutable_stream() = ToProtocol(hub_->endpoints());
    for (const auto& key : store_->List()) *reg.add_outputs() = ToProtocol(key);
    return reg;
  }

  /// Serves the job manager (vertex/jm_session.h); when the connection ends, cancels what was
  /// running (the job manager re-runs it), keeps every stored output, and reconnects.
  Status Run() {
    FlushLogsEvery();
    return session_.Run();
  }

  void CancelEverything() {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.Clear();
    for (auto& [key, flag] : cancel_flags_) flag->store(true);
    reports_.clear();
  }

  void Stop() { session_.Stop(); }

 private:
  using Task = TaskQueue::Task;

  /// Sends what the running attempts' logs hold beyond what was sent, every
  /// AttemptLog::kFlushInterval, so `copse logs -f` follows them. Under report_send_mu_: a
  /// chunk taken here goes out before the attempt's report, which carries the rest.
  void FlushLogsEvery() {
    log_flush_.expires_after(AttemptLog::kFlushInterval);
    log_flush_.async_wait([this](std::error_code ec) {
      if (ec) return;
      std::vector<std::pair<AttemptKey, std::shared_ptr<AttemptLog>>> logs;
      {
        std::lock_guard<std::mutex> lock(mu_);
        logs.assign(live_logs_.begin(), live_logs_.end());
      }
      for (const auto& [key, log] : logs) SendLog(key, *log);
      FlushLogsEvery();
    });
  }

  /// Sends what `log` holds beyond what was sent, under report_send_mu_, so that it goes out
  /// before any report taken after it (the attempt's own, sent once its log is finished and
  /// sent here). Each send is one attempt's: at most about 512 KiB (AttemptLog's bounds), where
  /// batching them into a report could pass a frame's limit.
  void SendLog(const AttemptKey& key, AttemptLog& log) {
    // Most attempts print nothing: no lock to take. (Chunks another thread took earlier are
    // sent under report_send_mu_, which any report taken after this waits for.)
    if (!log.HasPending()) return;
    std::lock_guard<std::mutex> in_order(report_send_mu_);
    std::vector<AttemptLog::Chunk> taken = log.Take();
    if (taken.empty()) return;
    protocol::DaemonToJm msg;
    protocol::VertexLog& vertex_log = *msg.mutable_vertex_log();
    vertex_log.set_job(std::get<0>(key));
    vertex_log.set_vertex(std::get<1>(key));
    vertex_log.set_version(std::get<2>(key));
    for (auto& c : taken) {
      protocol::LogChunk& chunk = *vertex_log.add_chunks();
      chunk.set_stream(std::move(c.stream));
      chunk.set_text(std::move(c.text));
    }
    session_.Send(protocol::EncodeFrame(msg));
  }

  /// A message from the job manager (protocol/daemon.proto), decoded and checked by the codec:
  /// one that breaks the schema drops the connection (and this daemon reconnects), naming the
  /// message and the field.
  void OnMessage(std::string body) {
    auto decoded = protocol::DecodeJmToDaemon(body);
    if (!decoded.ok()) {
      DaemonLog()->error("daemon {}: malformed message from the job manager: {}", options_.name, decoded.status().message());
      return session_.SendErrorAndClose("malformed message: " + decoded.status().message());
    }
    protocol::JmToDaemon& msg = *decoded;
    using M = protocol::JmToDaemon;
    switch (msg.body_case()) {
      case M::kRun: {
        std::lock_guard<std::mutex> lock(mu_);
        const size_t queued_before = tasks_.queued();
        for (protocol::Task& spec : *msg.mutable_run()->mutable_tasks()) {
          Task t;
          t.spec = std::move(spec);
          tasks_.Add(std::move(t), reports_);
        }
        // A worker per task queued now; a chained task that is only held wakes nobody (most
        // tasks of a pipeline arrive so).
        AddWorkersForQueue();
        for (size_t i = queued_before; i < tasks_.queued(); ++i) cv_.notify_one();
        if (!reports_.empty()) PostReports();
        return;
      }
      case M::kCancel:
        return CancelMatching(msg.cancel().job(), msg.cancel().has_vertex() ? int64_t{msg.cancel().vertex()} : int64_t{-1});
      case M::kGc: {
        std::set<chan::OutputKey> keep;
        for (const auto& k : msg.gc().keep()) keep.insert(FromProtocol(k));
        const uint64_t job = msg.gc().job();
        for (const auto& key : store_->List(job)) {
          if (!keep.count(key)) store_->Drop(key);
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          tasks_.ForgetJob(job);
        }
        hub_->DropJob(job);
        shm_.DropJob(job);
        return;
      }
      case M::kRelease:
        for (const auto& k : msg.release().keys()) store_->Drop(FromProtocol(k));
        return;
      case M::kMirror: return mirror_->Add(std::move(*msg.mutable_mirror()));
      case M::kPeerLost: {
        // The job manager declared that daemon lost: fetches from it would wait out their read
        // timeout (a stopped or cut-off daemon accepts and then says nothing). Their consumers
        // fail at once with the input unreachable, and the job manager re-runs or holds it.
        const auto& lost = msg.peer_lost();
        const size_t ended = chan::AbortFetchesFrom(lost.host(), static_cast<uint16_t>(lost.port()));
        if (ended)
          DaemonLog()->info("daemon {}: ended {} fetches from lost daemon at {}:{}", options_.name, ended, lost.host(),
                            lost.port());
        return;
      }
      case M::kNcclId: {
        std::lock_guard<std::mutex> lock(mu_);
        nccl_ids_[msg.nccl_id().group()] = msg.nccl_id().id();
        nccl_cv_.notify_all();
        return;
      }
      case M::kCut: {
        // Injected network partition from the job manager: drop the connection and stay away
        // (at most a day, checked).
        return session_.CutFor(std::chrono::milliseconds(msg.cut().ms()));
      }
      case M::kKill:
        DaemonLog()->warn("daemon {}: killed by an injected fault", options_.name);
        ::kill(::getpid(), SIGKILL);
        return;
      case M::kDamage: {
        const bool corrupt = msg.damage().damage() == protocol::DamageOutputs::CORRUPT;
        for (const auto& k : msg.damage().keys()) {
          const chan::OutputKey key = FromProtocol(k);
          Status st = corrupt ? store_->Corrupt(key) : store_->Remove(key);
          DaemonLog()->warn("daemon {}: injected {} of {}: {}", options_.name, corrupt ? "corruption" : "drop", key.ToString(),
                            st.ToString());
        }
        return;
      }
      default:
        DaemonLog()->warn("daemon {}: ignoring an unexpected \"{}\" from the job manager", options_.name,
                          protocol::BodyName(msg));
    }
  }

  /// The memory this daemon offers vertices, in MB: what it was told, else the machine's.
  int64_t OfferedMemoryMb() const { return options_.memory_mb > 0 ? options_.memory_mb : MachineMemoryMb(); }

  /// Cancels the job's (or one vertex's) tasks: those not started yet, and the running ones.
  void CancelMatching(uint64_t job, int64_t vertex) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.Cancel(job, vertex, reports_);
    for (auto& [key, flag] : cancel_flags_) {
      if (key.first == job && (vertex < 0 || key.second == static_cast<uint32_t>(vertex))) flag->store(true);
    }
    if (!reports_.empty()) PostReports();
  }

  /// The job manager decides what runs here at once (it places vertices by their cpus, which
  /// may be fractions): every task queued gets a worker now, not after the tasks ahead of it,
  /// so that it starts when it was placed (its timeout counts from there). Workers that are
  /// started stay, so a steady load starts no threads. Requires mu_.
  void AddWorkersForQueue() {
    static constexpr size_t kMaxWorkers = 1024;  // tasks asking for no cpus beyond this wait their turn
    while (!stopping_ && workers_.size() - busy_workers_ < tasks_.queued() && workers_.size() < kMaxWorkers) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }

  void WorkerLoop() {
    SetThreadName("copse-vertex");
    YieldToControlThreads();
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || tasks_.queued() > 0; });
        if (stopping_) return;
        task = *tasks_.Next();
        ++busy_workers_;
        cancel_flags_[{task.spec.job(), task.spec.vertex()}] = task.cancel;
        task.log = std::make_shared<AttemptLog>();
        live_logs_[KeyOf(task)] = task.log;
      }
      const auto began = std::chrono::steady_clock::now();
      protocol::AttemptReport report = executor_->Execute(task);
      metrics_.AttemptEnded(report, std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
      // The rest of its log goes before its report: stored before the job manager acts on it.
      task.log->Finish();
      SendLog(KeyOf(task), *task.log);
      {
        std::lock_guard<std::mutex> lock(mu_);
        const uint64_t job = task.spec.job();
        const uint32_t vertex = task.spec.vertex(), version = task.spec.version();
        cancel_flags_.erase({job, vertex});
        live_logs_.erase({job, vertex, version});
        const bool ok = report.ok();
        reports_.push_back(std::move(report));  // before any chained successor's report
        --busy_workers_;                        // this worker takes the next queued task itself
        // It looks at the queue next and so runs the first task released here itself: only the
        // others wake a worker.
        const size_t released = tasks_.Ended({job, vertex, version}, ok, reports_);
        for (size_t i = 1; i < released; ++i) cv_.notify_one();
        AddWorkersForQueue();
      }
      SendReports();  // from this thread: waking the io thread would cost this worker its core
    }
  }

  static AttemptKey KeyOf(const Task& t) { return {t.spec.job(), t.spec.vertex(), t.spec.version()}; }

  /// A held task chained after an attempt on another daemon: that attempt's outputs have
  /// arrived here (it succeeded), or cannot be had (`st`). Called from a fetch thread.
  void OnRemoteAfter(const AttemptKey& task, const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (tasks_.RemoteAfterEnded(task, st, reports_)) {
      AddWorkersForQueue();
      cv_.notify_one();
    }
    if (!reports_.empty()) PostReports();
  }

  /// Has the io thread send what reports_ holds (once per batch), for callers holding mu_.
  void PostReports() {
    if (report_posted_) return;
    report_posted_ = true;
    asio::post(session_.io(), [this] { SendReports(); });
  }

  /// Sends what reports_ holds, from any thread not holding mu_. Batches go out in the order
  /// they were taken, so a chained task's report never overtakes its predecessor's.
  void SendReports() {
    std::lock_guard<std::mutex> in_order(report_send_mu_);
    protocol::DaemonToJm msg;
    auto& attempts = *msg.mutable_report()->mutable_attempts();
    std::shared_ptr<net::FramedConnection> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      report_posted_ = false;
      attempts.Reserve(static_cast<int>(reports_.size()));
      for (auto& r : reports_) *attempts.Add() = std::move(r);
      reports_.clear();
      // Taken with the reports: reports of a connection whose work was abandoned (reports_
      // cleared by CancelEverything, under mu_) never reach the next one.
      conn = session_.Connection();
    }
    if (!attempts.empty() && conn && conn->open()) conn->SendRaw(protocol::EncodeFrame(msg));
  }

  /// Joins this attempt's NCCL group: rank 0 creates the unique id and hands it to the job
  /// manager, which relays it to the other members' daemons.
  Status JoinNcclGroup(const protocol::NcclMember& nccl, int device, AttemptTask& task) {
#ifdef COPSE_HAVE_NCCL
    if (device < 0) return Status::FailedPrecondition("an nccl vertex needs resources.gpus >= 1");
    const std::string group = nccl.group();
    const int rank = nccl.rank(), nranks = nccl.nranks();
    std::string id;
    if (rank == 0) {
      COPSE_ASSIGN_OR_RETURN(id, chan::nccl::NcclUniqueId());
      protocol::DaemonToJm msg;
      msg.mutable_nccl_id()->set_group(group);
      msg.mutable_nccl_id()->set_id(id);
      session_.Send(protocol::EncodeFrame(msg));
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      bool got = nccl_cv_.wait_for(lock, std::chrono::seconds(60), [&] { return nccl_ids_.count(group) || task.cancel->load(); });
      if (!got || !nccl_ids_.count(group)) return Status::Unavailable("no NCCL id for " + group + " from rank 0");
      id = nccl_ids_[group];
      nccl_ids_.erase(group);
    }
    chan::nccl::NcclOptions options;
    options.cancel = task.cancel.get();
    COPSE_ASSIGN_OR_RETURN(task.nccl, chan::nccl::NcclGroup::Create(id, rank, nranks, device, options));
    task.device = device;
    task.collective = std::make_unique<NcclCollective>(*task.nccl, device);
    return Status::OK();
#else
    (void)nccl, (void)device, (void)task;
    return Status::FailedPrecondition("this daemon was built without NCCL; nccl channels need a CUDA build");
#endif
  }

  DaemonOptions options_;
  JmSession session_;                     // registration, heartbeats, reconnects; its io thread is Run()'s
  asio::steady_timer log_flush_;          // on the session's io loop
  std::mutex report_send_mu_;             // held from taking reports_ until they are sent
  std::optional<DirLock> work_dir_lock_;  // held while this daemon runs; released after everything below
  std::unique_ptr<chan::OutputStore> store_;
  std::unique_ptr<chan::DataServer> data_server_;
  std::unique_ptr<chan::StreamHub> hub_;
  std::unique_ptr<InputPrefetcher> prefetcher_;  // remote inputs of held (chained) tasks
  std::unique_ptr<OutputMirror> mirror_;         // copies of other daemons' outputs (mirrored channels)
  GpuPool gpus_;                                 // which GPUs running attempts hold
  std::unique_ptr<AttemptExecutor> executor_;    // made once the stores and channels exist
  std::map<std::string, std::string> nccl_ids_;  // group -> unique id, guarded by mu_
  std::condition_variable nccl_cv_;
  chan::ShmRegistry shm_;
  std::vector<std::thread> workers_;  // grows under mu_ (AddWorkersForQueue) until stopping_
  size_t busy_workers_ = 0;           // running a task; guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  TaskQueue tasks_;  // not started yet: queued, or held after the attempts they are chained after; guarded by mu_
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<std::atomic<bool>>> cancel_flags_;
  std::map<AttemptKey, std::shared_ptr<AttemptLog>> live_logs_;  // of the attempts running; guarded by mu_
  std::vector<protocol::AttemptReport> reports_;
  bool report_posted_ = false;
  bool stopping_ = false;
  DaemonMetrics metrics_;
  std::unique_ptr<http::HttpServer> metrics_http_;  // last: stopped before what it reads goes
};

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;

Result<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  COPSE_RETURN_NOT_OK(impl->Init());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::Run() { return impl_->Run(); }
void Daemon::Stop() { impl_->Stop(); }

}  // namespace copse::vertex
