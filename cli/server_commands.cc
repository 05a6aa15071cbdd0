// `copse jm` and `copse daemon`: the long-running processes.
#include <iostream>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/jm_client.h"
#include "cli/process_util.h"
#include "cli/program_catalog.h"
#include "common/auth.h"
#include "common/machine_memory.h"
#include "common/framed_connection.h"
#include "jobmanager/jm_server.h"
#include "ml/device.h"
#include "vertex/daemon.h"

namespace copse::cli {
namespace {

/// A HOST:PORT flag a server listens on (--http, --metrics): checked as the flags are read, so
/// a malformed one is a usage error naming it (exit 2).
CLI::Validator ListenAddress(const std::string& flag) {
  return CLI::Validator(
      [flag](std::string& text) {
        auto parsed = net::ParseHostPort(text, flag);
        if (parsed.ok()) return std::string();
        std::string why = parsed.status().message();  // CLI11 names the flag itself
        return why.rfind(flag + ": ", 0) == 0 ? why.substr(flag.size() + 2) : why;
      },
      "HOST:PORT");
}

/// Splits a flag ListenAddress checked (when given) into `host` and `port`.
void SetListenAddress(const std::string& text, std::string& host, std::optional<uint16_t>& port) {
  if (text.empty()) return;
  auto parsed = net::ParseHostPort(text, "");
  host = parsed->first;
  port = parsed->second;
}

/// The job manager's TLS: --tls-dir's, else STATE_DIR/tls (made with --tls, and used whenever
/// it is there, so that a restart without the flag does not fall back to plaintext), else none.
Result<std::shared_ptr<const tls::Context>> JmTls(const std::filesystem::path& state_dir, bool on, const std::string& dir) {
  if (!dir.empty()) return tls::Context::Load(dir);
  const auto own = state_dir / tls::kStateSubdir;
  if (!on && !tls::HasCertificate(own)) return std::shared_ptr<const tls::Context>();
  COPSE_RETURN_NOT_OK(tls::CreateClusterCertificateIfAbsent(own));
  return tls::Context::Load(own);
}

}  // namespace

void AddJmCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("jm", "Run a job manager");
  struct Opts {
    std::string listen = "127.0.0.1:7077";
    std::string state_dir;
    int heartbeat_timeout_ms = 1000;
    std::string placement = "locality";
    int locality_wait_ms = 100;
    double straggler_factor = 4.0;
    int straggler_min_ms = 2000;
    bool chain_dispatch = true;
    uint64_t journal_compact_bytes = 64ull << 20;
    int64_t finished_job_ttl_s = 3600;
    int64_t history_retention_s = 7 * 86400;
    int daemon_return_grace_ms = 1000;
    std::string http;
    bool tls = false;
    std::string tls_dir;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--listen", opts->listen, "HOST:PORT to listen on (port 0: any; the address goes to STATE_DIR/jm.addr)");
  cmd->add_option("--state-dir", opts->state_dir, "where the secret and the address file live")
      ->default_str(DefaultStateDir().string());
  cmd->add_option("--heartbeat-timeout-ms", opts->heartbeat_timeout_ms, "a daemon silent this long is lost")
      ->check(CLI::Range(50, 600000));
  cmd->add_option("--placement", opts->placement, "placement policy: locality or load (locality-blind)")
      ->check(CLI::IsMember({"locality", "load"}));
  cmd->add_option("--locality-wait-ms", opts->locality_wait_ms, "how long a ready vertex waits for a slot where its inputs are")
      ->check(CLI::Range(0, 600000));
  cmd->add_option("--straggler-factor", opts->straggler_factor,
                  "duplicate an attempt running this many times its stage's median (0: never)")
      ->check(Finite())
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--straggler-min-ms", opts->straggler_min_ms, "never duplicate an attempt younger than this")
      ->check(CLI::Range(0, 86400000));
  cmd->add_flag("!--no-chain-dispatch", opts->chain_dispatch,
                "do not send a vertex ahead to the daemon where its last unfinished predecessor runs");
  cmd->add_option("--journal-compact-size", opts->journal_compact_bytes,
                  "rewrite STATE_DIR/journal.bin as a snapshot once it reaches this size with half of it "
                  "superseded (0: never), e.g. 64MiB")
      ->check(CLI::Validator([](std::string& v) { return v.find('-') == std::string::npos ? "" : "expected a size, got " + v; },
                             ""))  // the transform would wrap a negative size round
      ->transform(CLI::AsSizeValue(false))
      ->default_str("64MiB");
  cmd->add_option("--finished-job-ttl-s", opts->finished_job_ttl_s,
                  "how long a finished job stays queryable (with its kept outputs) before it is forgotten")
      ->check(CLI::Range(int64_t{0}, int64_t{10} * 365 * 86400))
      ->capture_default_str();
  cmd->add_option("--history-retention-s", opts->history_retention_s,
                  "how long a finished job's history (summary, event log, trace, vertex logs, under STATE_DIR/history) "
                  "is kept (0: for ever)")
      ->check(CLI::Range(int64_t{0}, int64_t{100} * 365 * 86400))
      ->capture_default_str();
  cmd->add_option("--daemon-return-grace-ms", opts->daemon_return_grace_ms,
                  "how long a lost daemon's file outputs wait for it to come back under its name, on its work dir, "
                  "before their vertices run again (0: at once)")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  cmd->add_option("--http", opts->http,
                  "serve the HTTP API, the dashboard and /metrics on HOST:PORT (port 0: any; the address goes to "
                  "STATE_DIR/http.addr); loopback unless you say otherwise")
      ->check(ListenAddress("--http"));
  cmd->add_flag("--tls", opts->tls,
                "TLS on every TCP connection, with a cluster certificate made in STATE_DIR/tls at first start (kept on "
                "once there); give daemons and clients elsewhere a copy of that directory (--tls-dir)");
  cmd->add_option("--tls-dir", opts->tls_dir, "TLS with the certificate and key in DIR (cluster.crt, cluster.key[, ca.crt])");
  cmd->callback([opts] {
    auto hp = net::ParseHostPort(opts->listen, "--listen");
    if (!hp.ok()) {
      std::cerr << hp.status().message() << "\n";
      ExitCode() = 2;
      return;
    }
    jm::JmServerOptions o;
    o.host = hp->first;
    o.port = hp->second;
    o.state_dir = opts->state_dir.empty() ? DefaultStateDir() : std::filesystem::path(opts->state_dir);
    o.catalog = Catalog();
    o.heartbeat_timeout = std::chrono::milliseconds(opts->heartbeat_timeout_ms);
    o.scheduler.placement = opts->placement;
    o.scheduler.locality_wait = std::chrono::milliseconds(opts->locality_wait_ms);
    o.scheduler.straggler_factor = opts->straggler_factor;
    o.scheduler.straggler_min = std::chrono::milliseconds(opts->straggler_min_ms);
    o.scheduler.chain_dispatch = opts->chain_dispatch;
    o.journal_compact_bytes = opts->journal_compact_bytes;
    o.scheduler.finished_job_ttl = std::chrono::seconds(opts->finished_job_ttl_s);
    o.history_retention = std::chrono::seconds(opts->history_retention_s);
    o.scheduler.daemon_return_grace = std::chrono::milliseconds(opts->daemon_return_grace_ms);
    SetListenAddress(opts->http, o.http_host, o.http_port);
    const std::string http_host = o.http_host;
    auto tls = JmTls(o.state_dir, opts->tls, opts->tls_dir);
    if (!tls.ok()) {
      std::cerr << "copse jm: " << tls.status().message() << "\n";
      ExitCode() = 1;
      return;
    }
    o.tls = std::move(*tls);
    const std::string tls_note = o.tls ? ", TLS with " + o.tls->dir().string() : "";
    // Blocked before any thread starts (the HTTP server's workers, the trace streamer), so
    // that their system calls are not interrupted; StopOnSignals' handler takes a signal the
    // kernel hands to a thread that had it unblocked (one a library started before main).
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    auto server = jm::JmServer::Start(std::move(o));
    if (!server.ok()) {
      std::cerr << "copse jm: " << server.status().message() << "\n";
      ExitCode() = 1;
      return;
    }
    jm::JmServer* s = server->get();
    // Said once it listens, on stdout, for a person or a service manager's journal.
    std::cout << "copse jm: listening on " << hp->first << ":" << s->port() << ", state in "
              << (opts->state_dir.empty() ? DefaultStateDir().string() : opts->state_dir) << tls_note << std::endl;
    if (s->http_port()) {
      std::cout << "copse jm: dashboard on http://" << http_host << ":" << s->http_port()
                << "/ (`copse dashboard` prints a link that logs you in)" << std::endl;
    }
    StopOnSignals([s] { s->Stop(); });
    s->Run();
  });
}

void AddDaemonCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("daemon", "Run a daemon that executes vertices");
  struct Opts {
    JmAddressOptions jm;
    std::string name;
    int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int gpus = 0;
    int64_t memory_mb = 0;
    int64_t gpu_memory_mb = 0;
    std::vector<std::string> labels;
    std::string work_dir;
    std::string data_host = "127.0.0.1";
    int64_t memory_budget_mb = 2048;  // signed: CLI11 wraps "-5" into an unsigned one
    bool local_socket = true;
    int64_t reconnect_timeout_s = 0;
    std::string metrics;
  };
  auto opts = std::make_shared<Opts>();
  AddJmAddressFlags(cmd, opts->jm);
  cmd->add_option("--name", opts->name, "unique daemon name: letters, digits and . _ - : @ + = (at most 128)")
      ->required()
      ->check([](const std::string& name) { return jm::DaemonNameProblem(name); });
  cmd->add_option("--cpus", opts->cpus, "vertex slots")->check(CLI::Range(1, 4096));
  cmd->add_option("--gpus", opts->gpus, "GPUs this daemon offers")->check(CLI::Range(0, 1024));
  cmd->add_option("--memory-mb", opts->memory_mb,
                  "memory in MB this daemon offers vertices (resources.memory_mb); default or 0: the machine's")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--gpu-memory-mb", opts->gpu_memory_mb,
                  "memory in MB of each GPU, for placing vertices by resources.gpu_memory_mb; default or 0: measured "
                  "(the smallest of its GPUs), or not reported where it cannot be")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  cmd->add_option("--label", opts->labels, "KEY=VALUE, e.g. host=a1 or rack=r3 (repeatable)");
  cmd->add_option("--work-dir", opts->work_dir, "where outputs and scratch space live")->required();
  cmd->add_option("--data-host", opts->data_host, "address other daemons reach this one's outputs at");
  cmd->add_option("--memory-budget-mb", opts->memory_budget_mb, "memory outputs beyond this spill to disk")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_flag("!--no-local-socket", opts->local_socket,
                "reach the job manager and serve daemons on this host over TCP, not through local sockets");
  cmd->add_option("--reconnect-timeout-s", opts->reconnect_timeout_s,
                  "exit once the job manager has been unreachable this long (0: keep trying)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400 * 365}))
      ->capture_default_str();
  cmd->add_option("--metrics", opts->metrics,
                  "serve Prometheus metrics on HOST:PORT/metrics (port 0: any; the address goes to WORK_DIR/metrics.addr)")
      ->check(ListenAddress("--metrics"));
  cmd->callback([opts] {
    vertex::DaemonOptions o;
    o.name = opts->name;
    o.cpus = opts->cpus;
    o.gpus = opts->gpus;
    o.memory_mb = opts->memory_mb > 0 ? opts->memory_mb : MachineMemoryMb();
    o.gpu_memory_mb = opts->gpu_memory_mb > 0 ? opts->gpu_memory_mb : ml::SmallestCudaMemoryMb(o.gpus);
    o.work_dir = opts->work_dir;
    o.data_host = opts->data_host;
    o.memory_budget_bytes = static_cast<uint64_t>(opts->memory_budget_mb) << 20;
    o.local_socket = opts->local_socket;
    o.reconnect_timeout = std::chrono::seconds(opts->reconnect_timeout_s);
    o.programs = &Programs();
    SetListenAddress(opts->metrics, o.metrics_host, o.metrics_port);
    for (const auto& l : opts->labels) {
      auto eq = l.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "--label: expected KEY=VALUE, got \"" << l << "\"\n";
        ExitCode() = 2;
        return;
      }
      o.labels[l.substr(0, eq)] = l.substr(eq + 1);
    }
    // Found like a client finds it; with no address anywhere, `copse jm`'s default one.
    const auto found = FindJmAddress(opts->jm);
    auto hp = found.ok() ? net::ParseHostPort(found->address, found->source) : net::ParseHostPort("127.0.0.1:7077", "--jm");
    auto secret = LoadClientSecret(opts->jm);
    if (!hp.ok() || !secret.ok()) {
      std::cerr << "copse daemon: " << (hp.ok() ? secret.status() : hp.status()).message() << "\n";
      ExitCode() = hp.ok() ? 1 : 2;
      return;
    }
    o.jm_host = hp->first;
    o.jm_port = hp->second;
    // Not named on the command line: follow jm.addr to a job manager started again elsewhere.
    if (!found.ok() || found->from_state_dir) o.locate_jm = [jm = opts->jm] { return JmEndpoint(jm); };
    o.secret = *secret;
    auto tls = LoadClientTls(opts->jm);
    if (!tls.ok()) {
      std::cerr << "copse daemon: " << tls.status().message() << "\n";
      ExitCode() = 1;
      return;
    }
    o.tls = std::move(*tls);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // workers inherit the mask; the signal thread stops us
    const std::string jm_address = o.jm_host + ":" + std::to_string(o.jm_port);
    auto daemon = vertex::Daemon::Start(std::move(o));
    if (!daemon.ok()) {
      std::cerr << "copse daemon: " << daemon.status().message() << "\n";
      ExitCode() = 1;
      return;
    }
    std::cout << "copse daemon " << opts->name << ": registered with the job manager at " << jm_address << ", " << opts->cpus
              << " cpus, work dir " << opts->work_dir << std::endl;
    vertex::Daemon* d = daemon->get();
    StopOnSignals([d] { d->Stop(); });
    Status st = d->Run();
    if (!st.ok()) {
      std::cerr << "copse daemon " << opts->name << ": " << st.message() << "\n";
      ExitCode() = 1;
    }
  });
}

}  // namespace copse::cli
