#include "jobmanager/job_history.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <iterator>
#include <cstring>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "jobmanager/event_log.h"
#include "jobmanager/scheduler_state.h"

namespace copse::jm {
namespace fs = std::filesystem;
namespace {

/// Appends `text` to `path` (0600, created if need be).
bool AppendFile(const fs::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = true;
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  ::close(fd);
  return ok;
}

uint64_t FileSize(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

/// Whether `name` is a job id (a directory of ours), and which.
std::optional<uint64_t> JobIdOf(const std::string& name) {
  if (name.empty() || name.size() > 16 || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoull(name);
}

}  // namespace

Result<std::unique_ptr<JobHistory>> JobHistory::Open(fs::path dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create the job history directory " + dir.string() + ": " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, ec);
  return std::unique_ptr<JobHistory>(new JobHistory(std::move(dir)));
}

JobHistory::~JobHistory() { Flush(); }

std::string* JobHistory::Room(JobId job, size_t bytes) {
  Pending& p = events_[job.value()];
  if (!p.known) {
    p.written = FileSize(JobDir(job) / "events.jsonl");
    p.known = true;
  }
  if (p.written + p.text.size() + bytes <= kMaxEventBytes) return &p.text;
  if (!p.full_noted) {
    p.full_noted = true;
    p.text += "{\"truncated\":true}\n";
  }
  return nullptr;
}

// Both formatted in place, not through a Json value: one record per ended attempt is on the
// job manager's hot path.
void JobHistory::JobLine(JobId job, VertexId vertex, const std::string& line) {
  std::string* out = Room(job, line.size() + 32);
  if (!out) return;
  *out += "{\"l\":";
  AppendJsonString(*out, line);
  if (vertex.valid()) fmt::format_to(std::back_inserter(*out), ",\"v\":{}", vertex.value());
  *out += "}\n";
}

void JobHistory::JobSpan(JobId job, const HistorySpan& s) {
  std::string* out = Room(job, 96 + s.outcome.size() + s.daemon.size() + s.vertex_name.size() + s.stage.size());
  if (!out) return;
  fmt::format_to(std::back_inserter(*out), "{{\"s\":[{},{},{},{}],\"o\":", s.vertex, s.version, s.start_ms, s.end_ms);
  AppendJsonString(*out, s.outcome);
  *out += ",\"d\":";
  AppendJsonString(*out, s.daemon);
  *out += ",\"n\":";
  AppendJsonString(*out, s.vertex_name);
  *out += ",\"st\":";
  AppendJsonString(*out, s.stage);
  fmt::format_to(std::back_inserter(*out), ",\"b\":{}}}\n", s.log_lines_before_end);
}

void JobHistory::JobFinished(JobId job, const Json& summary) {
  Flush();
  std::error_code ec;
  fs::create_directories(JobDir(job), ec);
  const fs::path tmp = JobDir(job) / "summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << DumpJson(summary) << "\n";
    if (!out) {
      SchedLog()->warn("job {}: cannot write its summary to {}", job.value(), tmp.string());
      return;
    }
  }
  fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write, ec);
  fs::rename(tmp, JobDir(job) / "summary.json", ec);
}

void JobHistory::Flush() {
  for (auto& [id, p] : events_) {
    if (p.text.empty()) continue;
    const fs::path dir = JobDir(JobId(id));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!AppendFile(dir / "events.jsonl", p.text)) {
      SchedLog()->warn("job {}: cannot append to {}: {}", id, (dir / "events.jsonl").string(), std::strerror(errno));
    }
    p.written += p.text.size();
    p.text.clear();
  }
}

fs::path JobHistory::VertexLogPath(JobId job, VertexId vertex, uint32_t version) const {
  return JobDir(job) / "logs" / fmt::format("{}.{}.jsonl", vertex.value(), version);
}

Status JobHistory::AppendVertexLog(JobId job, VertexId vertex, uint32_t version, const Json& chunks) {
  if (!chunks.is_array()) return Status::InvalidArgument("\"chunks\": expected an array, got " + DumpJson(chunks));
  std::string text;
  for (const Json& c : chunks) {
    if (!c.is_object() || !c.contains("stream") || !c["stream"].is_string() || !c.contains("text") || !c["text"].is_string()) {
      return Status::InvalidArgument("a log chunk must be {\"stream\": string, \"text\": string}, got " + DumpJson(c));
    }
    text += DumpJson(Json{{"stream", c["stream"]}, {"text", c["text"]}}) + "\n";
  }
  if (text.empty()) return Status::OK();
  auto [it, fresh] = vertex_log_bytes_.try_emplace(job.value(), 0);
  if (fresh) {
    std::error_code ec;
    for (fs::directory_iterator d(JobDir(job) / "logs", ec), end; !ec && d != end; d.increment(ec)) it->second += FileSize(d->path());
  }
  const fs::path path = VertexLogPath(job, vertex, version);
  if (it->second + text.size() > kMaxVertexLogBytes) {
    if (it->second <= kMaxVertexLogBytes) {
      it->second = kMaxVertexLogBytes + 1;  // noted once
      text = DumpJson(Json{{"stream", "copse"},
                           {"text", fmt::format("[copse: this job's vertex logs reached {} MiB; the job manager keeps no more of them]\n",
                                                kMaxVertexLogBytes >> 20)}}) +
             "\n";
    } else {
      return Status::OK();
    }
  }
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (!AppendFile(path, text)) return Status::IOError("cannot append to " + path.string() + ": " + std::strerror(errno));
  it->second += text.size();
  return Status::OK();
}

JobHistory::LogRead JobHistory::ReadVertexLog(JobId job, VertexId vertex, uint32_t version, uint64_t from, size_t max_bytes) const {
  LogRead read;
  read.next = from;
  std::ifstream in(VertexLogPath(job, vertex, version), std::ios::binary);
  if (!in) return read;
  in.seekg(static_cast<std::streamoff>(from));
  std::string line;
  size_t taken = 0;
  while (taken < max_bytes && std::getline(in, line)) {
    if (in.eof()) break;  // a record still being written: next time
    read.next += line.size() + 1;
    taken += line.size();
    Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object()) read.records.push_back(std::move(record));
  }
  return read;
}

std::vector<uint32_t> JobHistory::LoggedVersions(JobId job, VertexId vertex) const {
  std::vector<uint32_t> versions;
  const std::string prefix = std::to_string(vertex.value()) + ".";
  std::error_code ec;
  for (fs::directory_iterator d(JobDir(job) / "logs", ec), end; !ec && d != end; d.increment(ec)) {
    const std::string name = d->path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + 6) continue;
    const std::string version = name.substr(prefix.size(), name.size() - prefix.size() - 6);  // less ".jsonl"
    if (auto v = JobIdOf(version); v && *v <= UINT32_MAX) versions.push_back(static_cast<uint32_t>(*v));
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

JobHistory::Events JobHistory::Load(JobId job) const {
  Events events;
  std::ifstream in(JobDir(job) / "events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    Json r = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object()) continue;
    if (auto l = r.find("l"); l != r.end() && l->is_string()) {
      const Json& v = r.value("v", Json());
      events.lines.emplace_back(v.is_number_unsigned() ? VertexId(v.get<uint32_t>()) : VertexId::Invalid(), l->get<std::string>());
    } else if (auto s = r.find("s"); s != r.end() && s->is_array() && s->size() == 4 &&
               std::all_of(s->begin(), s->end(), [](const Json& x) { return x.is_number(); })) {
      HistorySpan span;
      span.vertex = (*s)[0].get<uint32_t>();
      span.version = (*s)[1].get<uint32_t>();
      span.start_ms = (*s)[2].get<double>();
      span.end_ms = (*s)[3].get<double>();
      span.outcome = r.value("o", "");
      span.daemon = r.value("d", "");
      span.vertex_name = r.value("n", "");
      span.stage = r.value("st", "");
      span.log_lines_before_end = r.value("b", size_t{0});
      events.names.try_emplace(span.vertex, span.vertex_name, span.stage);
      events.spans.push_back(std::move(span));
    } else if (r.value("truncated", false)) {
      events.truncated = true;
    }
  }
  return events;
}

Json JobHistory::EventLog(const Events& events, const std::string& vertex) {
  std::optional<uint32_t> only;
  if (!vertex.empty()) {
    for (const auto& [id, names] : events.names) {
      if (names.first == vertex) only = id;
    }
    if (!only) return nullptr;
  }
  std::vector<EventLine> lines;
  for (size_t i = 0; i < events.lines.size(); ++i) {
    const auto& [v, text] = events.lines[i];
    if (!only || (v.valid() && v.value() == *only)) lines.push_back({i, true, 0, text});
  }
  for (const auto& s : events.spans) {
    if (s.outcome != "completed" || (only && s.vertex != *only)) continue;
    lines.push_back({s.log_lines_before_end, false, s.end_ms,
                     CompletedLine(s.end_ms, s.vertex_name, s.version, s.daemon, s.end_ms - s.start_ms)});
  }
  if (events.truncated) lines.push_back({SIZE_MAX, true, 0, "[copse: this job's history reached its size limit here]"});
  return MergeEventLog(std::move(lines), kMaxLogLines);
}

TraceSnapshot JobHistory::Trace(JobId job, const Events& events, const Json& summary) {
  TraceSnapshot snap;
  snap.job = job.value();
  snap.name = summary.value("name", "");
  snap.state = summary.value("state", "");
  snap.names = events.names;
  std::map<std::string, uint32_t> daemons;
  for (const auto& s : events.spans) {
    auto [it, fresh] = daemons.try_emplace(s.daemon, static_cast<uint32_t>(snap.daemons.size()));
    if (fresh) snap.daemons.push_back({s.daemon, 0});
    snap.spans.push_back({s.vertex, s.version, it->second, s.start_ms, s.end_ms, s.outcome});
    snap.now_ms = std::max(snap.now_ms, s.end_ms);
  }
  return snap;
}

std::optional<Json> JobHistory::Summary(JobId job) const {
  std::ifstream in(JobDir(job) / "summary.json");
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json summary = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!summary.is_object()) return std::nullopt;
  return summary;
}

std::vector<JobId> JobHistory::Jobs() const {
  std::vector<JobId> jobs;
  std::error_code ec;
  for (fs::directory_iterator d(dir_, ec), end; !ec && d != end; d.increment(ec)) {
    if (auto id = JobIdOf(d->path().filename().string()); id && d->is_directory()) jobs.push_back(JobId(*id));
  }
  std::sort(jobs.begin(), jobs.end(), [](JobId a, JobId b) { return a.value() < b.value(); });
  return jobs;
}

std::vector<Json> JobHistory::Summaries(int64_t since_unix_ms) const {
  std::vector<Json> out;
  for (JobId job : Jobs()) {
    auto summary = Summary(job);
    if (!summary || summary->value("submitted_unix_ms", int64_t{0}) < since_unix_ms) continue;
    out.push_back(std::move(*summary));
  }
  return out;
}

size_t JobHistory::Prune(int64_t before_unix_ms, const std::set<uint64_t>& keep) {
  size_t removed = 0;
  for (JobId job : Jobs()) {
    if (keep.count(job.value())) continue;
    auto summary = Summary(job);
    if (!summary || summary->value("finished_unix_ms", int64_t{0}) >= before_unix_ms) continue;
    std::error_code ec;
    fs::remove_all(JobDir(job), ec);
    events_.erase(job.value());
    vertex_log_bytes_.erase(job.value());
    if (!ec) ++removed;
  }
  return removed;
}

}  // namespace copse::jm
