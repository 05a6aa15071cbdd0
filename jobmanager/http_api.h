#pragma once
// HttpApi: the job manager's HTTP face (`copse jm --http HOST:PORT`): a JSON API over what
// `copse status`, `jobs`, `daemons`, `logs`, `trace` and `chaos` show, live updates as
// Server-Sent Events, Prometheus metrics at /metrics, and the web dashboard (jobmanager/dashboard/)
// that reads them. docs/http-api.md is the reference.
//
// Every answer is made by ClientApi on the job manager's io thread (the scheduler has no
// locks): a request waits for its turn there, as a control-port client's does. The cost a
// watcher adds is bounded: the dashboard asks for aggregates (stages, not vertices), pages of
// vertices and the newest spans of a timeline, and the event streams share one status per job
// per interval, however many browsers watch.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/status.h"
#include "jobmanager/client_api.h"

namespace copse::jm {

class HttpApi {
 public:
  /// Runs `fn` on the job manager's io thread and waits for it; false when the job manager is
  /// stopping (or too busy to take it within a while): the request then fails with 503.
  using RunOnLoop = std::function<bool(const std::function<void()>& fn)>;
  /// Adds the job manager's own metrics (journal commits, peers) to the scheduler's; on the loop.
  using ServerMetrics = std::function<void(metrics::MetricsWriter& out)>;

  struct Options {
    std::string host = "127.0.0.1";
    uint16_t port = 0;
    std::string secret;  // the cluster's (common/http_server.h: who may read, who may act)
    /// How often an event stream sends the job's status.
    std::chrono::milliseconds event_interval{500};
  };

  static Result<std::unique_ptr<HttpApi>> Start(Options options, ClientApi& api, Scheduler& scheduler, RunOnLoop run,
                                                ServerMetrics server_metrics);
  ~HttpApi();
  uint16_t port() const;
  /// Ends the streams and waits for requests in flight (they stop waiting for the loop).
  void Stop();

 private:
  class Impl;
  explicit HttpApi(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace copse::jm
