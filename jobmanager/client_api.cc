#include "jobmanager/client_api.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace copse::jm {

Json ErrorReply(std::string message) { return {{"op", "error"}, {"message", std::move(message)}}; }

JobId JobIdFrom(const Json& msg) {
  auto it = msg.find("job");
  if (it == msg.end() || !it->is_number_unsigned()) return JobId::Invalid();
  return JobId(it->get<uint64_t>());
}

std::optional<Json> ClientApi::Answer(const std::string& op, const Json& msg) {
  const JobId job = JobIdFrom(msg);
  if (op == "status") {
    if (!msg.contains("job")) return Json{{"op", "jobs"}, {"jobs", scheduler_.JobsTable()}};
    Json status = Status(job);
    if (status.is_null()) return ErrorReply("no job " + job.ToString());
    return Json{{"op", "job"}, {"job", std::move(status)}};
  }
  if (op == "jobs") return Json{{"op", "jobs"}, {"jobs", JobsSince(IntegerOr<int64_t>(msg, "since_unix_ms", 0))}};
  if (op == "vertex_log") return VertexLog(msg);
  if (op == "cancel") {
    const copse::Status st = scheduler_.Cancel(job);
    if (!st.ok()) return ErrorReply(st.message());
    return Json{{"op", "cancelled"}};
  }
  if (op == "daemons") return Json{{"op", "daemons"}, {"daemons", scheduler_.DaemonsTable()}};
  if (op == "logs") return EventLog(job, msg.value("vertex", std::string()));
  if (op == "chaos") {
    auto done = scheduler_.Chaos(msg);
    if (!done.ok()) return ErrorReply(done.status().message());
    return Json{{"op", "chaos"}, {"done", *done}};
  }
  if (op == "outputs") return Outputs(job);
  return std::nullopt;
}

Json ClientApi::Status(JobId job) {
  Json status = WithLogHint(scheduler_.JobStatus(job));
  if (status.is_null()) status = ForgottenSummary(job);
  return status;
}

Json ClientApi::EventLog(JobId job, const std::string& vertex) {
  Json lines = scheduler_.HistoryInMemory(job) ? scheduler_.Logs(job, vertex) : Json();
  if (lines.is_null() && !scheduler_.HistoryInMemory(job) && history_.Summary(job)) {
    lines = JobHistory::EventLog(*history_.Load(job), vertex);
    if (lines.is_null()) return ErrorReply("job " + job.ToString() + "'s history has no attempt of a vertex \"" + vertex + "\"");
  }
  if (lines.is_null()) {
    return ErrorReply(scheduler_.HasJob(job) ? "job " + job.ToString() + " has no vertex \"" + vertex + "\""
                                             : "no job " + job.ToString());
  }
  return Json{{"op", "logs"}, {"lines", std::move(lines)}};
}

Json ClientApi::Outputs(JobId job) {
  if (!scheduler_.HasJob(job) && history_.Summary(job)) {
    return ErrorReply("job " + job.ToString() +
                      " finished more than --finished-job-ttl-s ago: its outputs were released (its summary, logs and trace "
                      "are kept)");
  }
  auto locations = scheduler_.OutputLocations(job);
  if (!locations.ok()) return ErrorReply(locations.status().message());
  return Json{{"op", "outputs"}, {"outputs", std::move(*locations)}};
}

Result<TraceSnapshot> ClientApi::Trace(JobId job, size_t max_spans) const {
  // A forgotten job's, or a finished one restored without its history: from its history files.
  if (const Json* summary = scheduler_.HistoryInMemory(job) ? nullptr : history_.Summary(job)) {
    TraceSnapshot snapshot = JobHistory::Trace(job, *history_.Load(job), *summary);
    snapshot.total_spans = snapshot.spans.size();
    if (snapshot.spans.size() > max_spans) snapshot.spans.erase(snapshot.spans.begin(), snapshot.spans.end() - max_spans);
    return snapshot;
  }
  return scheduler_.Trace(job, max_spans);
}

Json ClientApi::Vertices(JobId job, const Scheduler::VertexFilter& filter) const {
  if (scheduler_.HasJob(job)) return scheduler_.VertexPage(job, filter);
  if (!history_.Summary(job)) return nullptr;
  // A forgotten job: each vertex's newest attempt as its history recorded it.
  const auto events = history_.Load(job);
  std::map<uint32_t, const HistorySpan*> newest;
  for (const auto& s : events->spans) {
    const HistorySpan*& n = newest[s.vertex];
    if (!n || s.version >= n->version) n = &s;
  }
  Json rows = Json::array();
  size_t matched = 0;
  for (const auto& [id, names] : events->names) {
    if (!filter.stage.empty() && names.second != filter.stage) continue;
    const auto it = newest.find(id);
    // A finished job's vertex is completed or, when its job failed or was cancelled, not.
    const std::string outcome = it == newest.end() ? "" : it->second->outcome;
    const std::string state = outcome == "completed" ? "completed" : "waiting";
    if (!filter.state.empty() && state != filter.state) continue;
    if (matched++ < filter.offset || rows.size() >= filter.limit) continue;
    Json row = {{"name", names.first}, {"stage", names.second}, {"state", state}, {"outcome", outcome}};
    if (it != newest.end()) row["version"] = it->second->version, row["daemon"] = it->second->daemon;
    rows.push_back(std::move(row));
  }
  return {{"total", matched}, {"offset", filter.offset}, {"vertices", std::move(rows)}};
}

Json ClientApi::ProgressSeries(JobId job) const {
  if (scheduler_.HistoryInMemory(job)) return scheduler_.ProgressSeries(job);
  if (history_.Summary(job)) return history_.ProgressSeries(job);
  return nullptr;
}

Json ClientApi::VertexLog(const Json& msg) {
  constexpr size_t kMaxReplyBytes = 1 << 20;
  const JobId job = JobIdFrom(msg);
  const std::string name = msg.value("vertex", std::string());
  const Json attempt_json = msg.value("attempt", Json(uint64_t{0}));
  const Json from_json = msg.value("from", Json(uint64_t{0}));
  if (!attempt_json.is_number_unsigned() || !from_json.is_number_unsigned() || attempt_json.get<uint64_t>() > UINT32_MAX) {
    return ErrorReply("\"attempt\" and \"from\" must be whole numbers");
  }
  uint32_t attempt = attempt_json.get<uint32_t>();
  Json reply = {{"op", "vertex_log"}, {"vertex", name}};
  VertexId v;
  if (scheduler_.HistoryInMemory(job)) {
    auto found = scheduler_.Attempt(job, name, attempt);
    if (!found.ok() && attempt != 0) {
      // Not in the trace, but it may have printed: an attempt running when the job manager
      // restarted, whose span was lost with it.
      if (auto newest = scheduler_.Attempt(job, name, 0); newest.ok()) {
        const auto logged = history_.LoggedVersions(job, VertexId((*newest)["vertex"].get<uint32_t>()));
        if (std::find(logged.begin(), logged.end(), attempt) != logged.end()) {
          found = Json{{"vertex", (*newest)["vertex"]},
                       {"attempt", attempt},
                       {"newest", (*newest)["newest"]},
                       {"running", false},
                       {"outcome", "running when the job manager restarted"}};
        }
      }
    }
    if (!found.ok()) return ErrorReply(found.status().message());
    v = VertexId((*found)["vertex"].get<uint32_t>());
    attempt = (*found)["attempt"].get<uint32_t>();
    reply["running"] = (*found)["running"];
    reply["newest"] = (*found)["newest"];
    if (found->contains("waiting")) reply["waiting"] = true;
    if (found->contains("daemon")) reply["daemon"] = (*found)["daemon"];
    if (found->contains("outcome")) reply["outcome"] = (*found)["outcome"];
  } else if (history_.Summary(job)) {
    const auto loaded = history_.Load(job);
    const JobHistory::Events& events = *loaded;
    for (const auto& [id, names] : events.names) {
      if (names.first == name) v = VertexId(id);
    }
    if (!v.valid()) return ErrorReply("job " + job.ToString() + "'s history has no attempt of a vertex \"" + name + "\"");
    uint32_t newest = 0;
    for (const auto& s : events.spans) {
      if (s.vertex == v.value()) newest = std::max(newest, s.version);
    }
    reply["newest"] = newest;
    for (const auto& s : events.spans) {
      if (s.vertex != v.value() || (attempt != 0 && s.version != attempt)) continue;
      if (attempt == 0 && s.version < reply.value("attempt", 0u)) continue;
      reply["attempt"] = s.version;
      reply["daemon"] = s.daemon;
      reply["outcome"] = s.outcome;
    }
    if (!reply.contains("attempt"))
      return ErrorReply(fmt::format("job {}'s history has no attempt {} of {}", job.value(), attempt, name));
    attempt = reply["attempt"].get<uint32_t>();
    reply["running"] = false;
  } else {
    return ErrorReply("no job " + job.ToString());
  }
  JobHistory::LogRead read = history_.ReadVertexLog(job, v, attempt, from_json.get<uint64_t>(), kMaxReplyBytes);
  reply["attempt"] = attempt;
  reply["records"] = std::move(read.records);
  reply["next"] = read.next;
  reply["attempts"] = history_.LoggedVersions(job, v);
  return reply;
}

Json ClientApi::WithLogHint(Json status) {
  if (!status.is_object() || !status.contains("failed_attempt") || !status.contains("id")) return status;
  Json& failed = status["failed_attempt"];
  // Attempt 0: the vertex whatever attempts the job manager still knows of it. A job restored
  // after a restart keeps no spans, and its failed attempt is not one it dispatched.
  auto found = scheduler_.Attempt(JobId(status["id"].get<uint64_t>()), failed.value("vertex", ""), 0);
  if (!found.ok()) return status;
  const auto versions =
      history_.LoggedVersions(JobId(status["id"].get<uint64_t>()), VertexId((*found)["vertex"].get<uint32_t>()));
  failed["printed"] = std::find(versions.begin(), versions.end(), failed.value("attempt", 0u)) != versions.end();
  return status;
}

Json ClientApi::ForgottenSummary(JobId job) const {
  if (scheduler_.HasJob(job)) return nullptr;
  const Json* summary = history_.Summary(job);
  if (!summary) return nullptr;
  Json status = *summary;
  status["forgotten"] = true;  // its outputs released
  return status;
}

Json ClientApi::JobsSince(int64_t since_unix_ms, size_t max_jobs) const {
  max_jobs = std::min(max_jobs, kMaxJobRows);
  std::map<uint64_t, Json> rows;
  for (Json& row : scheduler_.JobsTable()) {
    const uint64_t id = row["id"].get<uint64_t>();  // read before the row is moved from
    if (row.value("submitted_unix_ms", int64_t{0}) >= since_unix_ms) rows[id] = std::move(row);
  }
  // Only the newest are read: a history of many thousand jobs costs a watcher nothing per look.
  for (const Json* kept : history_.Summaries(since_unix_ms, max_jobs)) {
    const Json& summary = *kept;
    const uint64_t id = summary.value("id", uint64_t{0});
    if (rows.count(id)) continue;
    const Json& vertices = summary.value("vertices", Json::object());
    rows[id] = {{"id", id},
                {"name", summary.value("name", "")},
                {"state", summary.value("state", "")},
                {"completed", vertices.value("completed", 0)},
                {"total", vertices.value("total", 0)},
                {"elapsed_s", summary.value("elapsed_s", 0.0)},
                {"submitted_unix_ms", summary.value("submitted_unix_ms", int64_t{0})},
                {"finished_unix_ms", summary.value("finished_unix_ms", int64_t{0})},
                {"forgotten", true}};
    if (summary.contains("failure")) rows[id]["failure"] = summary["failure"];
  }
  // The newest: a reply must stay well within one control message.
  while (rows.size() > max_jobs) rows.erase(rows.begin());
  Json out = Json::array();
  for (auto& [id, row] : rows) out.push_back(std::move(row));
  return out;
}

}  // namespace copse::jm
