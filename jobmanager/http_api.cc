#include "jobmanager/http_api.h"

#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/http_server.h"
#include "jobmanager/dashboard_assets.h"

namespace copse::jm {
namespace {

using http::Access;
using http::Request;
using http::Response;

/// A reply of ClientApi as the HTTP API returns it: its members without "op"; an error as
/// {"error"} with 404 when it names something that is not there, 400 otherwise.
Response FromReply(Json reply) {
  if (reply.value("op", "") == "error") {
    const std::string message = reply.value("message", "");
    const bool missing = message.rfind("no job", 0) == 0 || message.find(" has no ") != std::string::npos;
    Json body = {{"error", message}};
    if (reply.contains("errors")) body["errors"] = reply["errors"];
    return Response::Json(missing ? 404 : 400, DumpJson(body));
  }
  reply.erase("op");
  return Response::Json(200, DumpJson(reply));
}

/// A whole number from the query string, within [lo, hi]; `fallback` when absent.
Result<uint64_t> NumberParam(const Request& req, const std::string& key, uint64_t fallback, uint64_t lo, uint64_t hi) {
  const std::string text = req.Param(key);
  if (text.empty()) return fallback;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) {
      return Status::InvalidArgument(
          fmt::format("query parameter {}: expected a whole number, got \"{}\"", key, text.substr(0, 32)));
    }
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi)
    return Status::InvalidArgument(fmt::format("query parameter {}: {} is not within [{}, {}]", key, v, lo, hi));
  return v;
}

JobId JobOf(const Request& req) {
  const auto id = [&]() -> uint64_t {
    try {
      return std::stoull(req.matches.at(1));
    } catch (...) {
      return 0;
    }
  }();
  return id == 0 ? JobId::Invalid() : JobId(id);
}

/// The newest spans of a job as the timeline draws them: compact rows
/// [daemon index, start ms, end ms (-1: running), outcome, vertex name, version].
Json TimelineJson(const TraceSnapshot& snap) {
  Json daemons = Json::array();
  for (const auto& [name, registration] : snap.daemons)
    daemons.push_back(registration ? fmt::format("{}#{}", name, registration) : name);
  Json spans = Json::array();
  for (const auto& s : snap.spans) {
    std::string vertex;
    if (snap.graph && s.vertex < snap.graph->vertices().size()) {
      vertex = snap.graph->vertex(VertexId(s.vertex)).name;
    } else if (auto it = snap.names.find(s.vertex); it != snap.names.end()) {
      vertex = it->second.first;
    }
    spans.push_back({s.daemon, s.start_ms, s.end_ms, s.outcome, std::move(vertex), s.version});
  }
  return {{"job", snap.job},
          {"name", snap.name},
          {"state", snap.state},
          {"now_ms", snap.now_ms},
          {"daemons", daemons},
          {"spans", std::move(spans)},
          {"total_spans", snap.total_spans}};
}

}  // namespace

class HttpApi::Impl {
 public:
  Impl(Options options, ClientApi& api, Scheduler& scheduler, RunOnLoop run, ServerMetrics server_metrics)
      : options_(std::move(options)),
        api_(api),
        scheduler_(scheduler),
        run_(std::move(run)),
        server_metrics_(std::move(server_metrics)),
        server_(options_.secret) {
    Routes();
  }

  Status Listen() { return server_.Listen(options_.host, options_.port, "--http"); }
  uint16_t port() const { return server_.port(); }
  void Stop() { server_.Stop(); }

 private:
  /// `make` run on the loop; 503 when the loop would not take it. A request whose members have
  /// the wrong types (a chaos body's "ms": "x") or numbers out of range ("ms": 1e300) is the
  /// client's error, anything else the server's.
  Response OnLoop(const std::function<Response()>& make) {
    Response out = Response::Error(503, "the job manager is stopping");
    run_([&] {
      try {
        out = make();
      } catch (const Json::exception& e) {
        out = Response::Error(400, std::string("malformed request: ") + e.what());
      } catch (const std::invalid_argument& e) {  // a number out of its member's range (IntegerOr)
        out = Response::Error(400, std::string("malformed request: ") + e.what());
      } catch (const std::exception& e) {
        out = Response::Error(500, e.what());
      }
    });
    return out;
  }

  void Routes() {
    for (const DashboardAsset& asset : DashboardAssets()) {
      server_.Public(std::string(asset.path), [asset](const Request&) {
        Response r;
        r.content_type = std::string(asset.content_type);
        r.body = std::string(asset.body);
        return r;
      });
    }
    server_.Get("/api/v1/whoami", Access::kViewer, [](const Request& req) {
      return Response::Json(200, DumpJson(Json{{"access", req.access == Access::kAdmin ? "admin" : "viewer"}}));
    });
    server_.Get("/api/v1/jobs", Access::kViewer, [this](const Request& req) {
      auto since = NumberParam(req, "since_unix_ms", 0, 0, INT64_MAX);
      if (!since.ok()) return Response::Error(400, since.status().message());
      return OnLoop([&] { return FromReply(*api_.Answer("jobs", {{"since_unix_ms", static_cast<int64_t>(*since)}})); });
    });
    server_.Get(R"(/api/v1/jobs/(\d+))", Access::kViewer, [this](const Request& req) { return Job(JobOf(req)); });
    server_.Get(R"(/api/v1/jobs/(\d+)/vertices)", Access::kViewer, [this](const Request& req) {
      Scheduler::VertexFilter filter;
      filter.stage = req.Param("stage");
      filter.state = req.Param("state");
      auto offset = NumberParam(req, "offset", 0, 0, UINT32_MAX);
      auto limit = NumberParam(req, "limit", 100, 1, 1000);
      if (!offset.ok()) return Response::Error(400, offset.status().message());
      if (!limit.ok()) return Response::Error(400, limit.status().message());
      filter.offset = *offset, filter.limit = *limit;
      return OnLoop([&] {
        Json page = api_.Vertices(JobOf(req), filter);
        if (page.is_null()) return Response::Error(404, "no job " + JobOf(req).ToString());
        return Response::Json(200, DumpJson(page));
      });
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/timeline)", Access::kViewer, [this](const Request& req) {
      auto limit = NumberParam(req, "limit", 5000, 1, 100000);
      if (!limit.ok()) return Response::Error(400, limit.status().message());
      std::optional<TraceSnapshot> snapshot;
      Status missing;
      const bool ran = run_([&] {
        auto taken = api_.Trace(JobOf(req), *limit);
        if (taken.ok())
          snapshot = std::move(*taken);
        else
          missing = taken.status();
      });
      if (!ran) return Response::Error(503, "the job manager is stopping");
      if (!snapshot) return Response::Error(404, missing.message());
      // Formatted here, off the job manager's thread.
      return Response::Json(200, DumpJson(TimelineJson(*snapshot)));
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/logs)", Access::kViewer, [this](const Request& req) {
      return OnLoop([&] {
        return FromReply(*api_.Answer("logs", {{"job", JobOf(req).value()}, {"vertex", req.Param("vertex")}}));
      });
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/vertex_log)", Access::kViewer, [this](const Request& req) {
      auto attempt = NumberParam(req, "attempt", 0, 0, UINT32_MAX);
      auto from = NumberParam(req, "from", 0, 0, INT64_MAX);
      if (!attempt.ok()) return Response::Error(400, attempt.status().message());
      if (!from.ok()) return Response::Error(400, from.status().message());
      if (req.Param("vertex").empty())
        return Response::Error(400, "query parameter vertex: required (a vertex name, e.g. train[0])");
      const Json msg = {{"job", JobOf(req).value()}, {"vertex", req.Param("vertex")}, {"attempt", *attempt}, {"from", *from}};
      return OnLoop([&] { return FromReply(*api_.Answer("vertex_log", msg)); });
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/progress)", Access::kViewer, [this](const Request& req) {
      return OnLoop([&] {
        Json series = api_.ProgressSeries(JobOf(req));
        if (series.is_null()) return Response::Error(404, "no job " + JobOf(req).ToString());
        return Response::Json(200, DumpJson(Json{{"points", std::move(series)}}));
      });
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/outputs)", Access::kViewer, [this](const Request& req) {
      return OnLoop([&] { return FromReply(*api_.Answer("outputs", {{"job", JobOf(req).value()}})); });
    });
    server_.Get(R"(/api/v1/jobs/(\d+)/trace)", Access::kViewer, [this](const Request& req) { return Trace(JobOf(req)); });
    server_.Get("/api/v1/daemons", Access::kViewer,
                [this](const Request&) { return OnLoop([&] { return FromReply(*api_.Answer("daemons", Json::object())); }); });
    server_.Post(R"(/api/v1/jobs/(\d+)/cancel)", Access::kAdmin, [this](const Request& req) {
      return OnLoop([&] { return FromReply(*api_.Answer("cancel", {{"job", JobOf(req).value()}})); });
    });
    server_.Post("/api/v1/chaos", Access::kAdmin, [this](const Request& req) {
      auto body = ParseJson(req.body, "the request body");
      if (!body.ok() || !body->is_object()) {
        return Response::Error(
            400, body.ok() ? "the request body: expected a JSON object (copse chaos's request)" : body.status().message());
      }
      return OnLoop([&] { return FromReply(*api_.Answer("chaos", *body)); });
    });
    server_.Get("/api/v1/events", Access::kViewer, [this](const Request& req) { return Events(req); });
    server_.Get("/metrics", Access::kViewer, [this](const Request&) {
      Response r = OnLoop([&] {
        metrics::MetricsWriter out;
        scheduler_.WriteMetrics(out);
        server_metrics_(out);
        Response m;
        m.body = out.Take();
        return m;
      });
      if (r.status == 200) r.content_type = metrics::MetricsWriter::kContentType;
      return r;
    });
  }

  Response Job(JobId job) {
    return OnLoop([&] {
      Json status = api_.Status(job);
      if (status.is_null()) return Response::Error(404, "no job " + job.ToString());
      return Response::Json(200, DumpJson(status));
    });
  }

  /// The whole trace (as `copse trace` writes it), formatted and sent in parts off the loop. One
  /// at a time: each costs the loop a copy of the job's spans (100 MB for a million).
  Response Trace(JobId job) {
    if (traces_.fetch_add(1) > 0) {
      traces_.fetch_sub(1);
      return Response::Error(503, "a trace is being sent; ask again when it is done");
    }
    struct Release {
      std::atomic<int>& n;
      ~Release() { n.fetch_sub(1); }
    };
    auto held = std::make_shared<Release>(Release{traces_});  // until the stream ends
    std::optional<TraceSnapshot> snapshot;
    Status missing;
    if (!run_([&] {
          auto taken = api_.Trace(job);
          if (taken.ok())
            snapshot = std::move(*taken);
          else
            missing = taken.status();
        })) {
      return Response::Error(503, "the job manager is stopping");
    }
    if (!snapshot) return Response::Error(404, missing.message());
    Response r;
    r.headers.emplace_back("Content-Disposition", fmt::format("attachment; filename=\"copse-job-{}-trace.json\"", job.value()));
    r.stream = [held, snap = std::make_shared<TraceSnapshot>(std::move(*snapshot))](const http::StreamWrite& write) {
      if (!write("{\"traceEvents\":[")) return;
      bool first = true, ok = true;
      FormatTraceEvents(*snap, 10000, [&](std::string_view events) {
        ok = (first || write(",")) && write(events);
        first = false;
        return ok;
      });
      if (!ok) return;
      std::string trailer = DumpJson(TraceTrailer(*snap));  // {"displayTimeUnit":…}
      trailer[0] = ',';
      write("]" + trailer);
    };
    return r;
  }

  /// Server-Sent Events: `jobs` (the jobs table), `daemons` and, with ?job=N, `job` (its
  /// status), each when it changed, looked at every interval.
  Response Events(const Request& req) {
    auto id = NumberParam(req, "job", 0, 1, UINT64_MAX);  // 0: no job asked for
    if (!id.ok()) return Response::Error(400, id.status().message());
    const JobId job = *id ? JobId(*id) : JobId::Invalid();
    Response r;
    r.content_type = "text/event-stream";
    r.stream = [this, job](const http::StreamWrite& write) {
      std::string last_jobs, last_job, last_daemons;
      auto last_write = std::chrono::steady_clock::now();
      while (!server_.stopping()) {
        const Shared now = Snapshot(job);
        if (!now.ok) return;
        bool wrote = false;
        auto send = [&](const char* event, const std::string& data, std::string& last) {
          if (data.empty() || data == last) return true;
          last = data;
          wrote = true;
          return write(fmt::format("event: {}\ndata: {}\n\n", event, data));
        };
        if (!send("jobs", now.jobs, last_jobs) || !send("daemons", now.daemons, last_daemons) || !send("job", now.job, last_job))
          return;
        const auto t = std::chrono::steady_clock::now();
        if (wrote) last_write = t;
        // A comment line each second nothing else went: a client that left is noticed (the write
        // after its close fails) within seconds, and its stream's slot freed.
        if (!wrote && t - last_write >= std::chrono::seconds(1)) {
          if (!write(": keep-alive\n\n")) return;
          last_write = t;
        }
        for (auto slept = std::chrono::milliseconds(0); slept < options_.event_interval && !server_.stopping();
             slept += std::chrono::milliseconds(50)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    };
    return r;
  }

  /// What the event streams send, taken on the loop at most once per interval for all of them.
  struct Shared {
    bool ok = false;
    std::string jobs, daemons, job;
  };
  Shared Snapshot(JobId job) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(shared_mu_);
    auto fresh = [&](const Cached& c) {
      return c.at.time_since_epoch().count() != 0 && now - c.at < options_.event_interval * 4 / 5;
    };
    Cached& table = shared_[0];
    Cached* one = job.valid() ? &shared_[job.value()] : nullptr;
    if (!fresh(table) || (one && !fresh(*one))) {
      const bool ran = run_([&] {
        Json jobs = {{"jobs", api_.JobsSince(0, kStreamedJobs)}}, daemons = *api_.Answer("daemons", Json::object());
        daemons.erase("op");
        table.text = DumpJson(jobs);
        table.daemons = DumpJson(daemons);
        table.at = now;
        if (one) {
          Json status = api_.Status(job);
          one->text = status.is_null() ? DumpJson(Json{{"error", "no job " + job.ToString()}}) : DumpJson(status);
          one->at = now;
        }
      });
      if (!ran) return {};
      // Streams of jobs nobody asked about lately are forgotten.
      for (auto it = shared_.begin(); it != shared_.end();) {
        it = it->first != 0 && now - it->second.at > std::chrono::seconds(10) ? shared_.erase(it) : std::next(it);
      }
      one = job.valid() ? &shared_[job.value()] : nullptr;
    }
    return {true, table.text, table.daemons, one ? one->text : ""};
  }

  struct Cached {
    std::chrono::steady_clock::time_point at{};
    std::string text, daemons;
  };

  Options options_;
  ClientApi& api_;
  Scheduler& scheduler_;
  RunOnLoop run_;
  ServerMetrics server_metrics_;
  std::atomic<int> traces_{0};  // being copied or sent
  /// The event streams' jobs table: the newest this many (GET /api/v1/jobs has them all).
  static constexpr size_t kStreamedJobs = 500;
  std::mutex shared_mu_;
  std::map<uint64_t, Cached> shared_;  // 0: the jobs table and daemons; else a job's status
  http::HttpServer server_;            // last: stopped (its handlers ended) before the rest goes
};

HttpApi::HttpApi(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpApi::~HttpApi() { Stop(); }

Result<std::unique_ptr<HttpApi>> HttpApi::Start(Options options, ClientApi& api, Scheduler& scheduler, RunOnLoop run,
                                                ServerMetrics server_metrics) {
  auto impl = std::make_unique<Impl>(std::move(options), api, scheduler, std::move(run), std::move(server_metrics));
  COPSE_RETURN_NOT_OK(impl->Listen());
  return std::unique_ptr<HttpApi>(new HttpApi(std::move(impl)));
}

uint16_t HttpApi::port() const { return impl_->port(); }
void HttpApi::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace copse::jm
