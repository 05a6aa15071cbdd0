#include "jobmanager/job_history.h"

#include <fcntl.h>
#include <sys/statvfs.h>
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

/// Whether `path` ends in a newline (or is empty): what is appended then starts a record of its
/// own, after a crash that tore the last one.
bool EndsALine(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() <= 0) return true;
  in.seekg(-1, std::ios::end);
  return in.get() == '\n';
}

int64_t Int64Of(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
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
  std::unique_ptr<JobHistory> history(new JobHistory(std::move(dir)));
  for (JobId job : history->Jobs()) {
    std::ifstream in(history->JobDir(job) / "summary.json");
    if (!in) continue;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Json summary = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!summary.is_object()) continue;
    summary.erase("progress_series");  // kept in progress.json
    history->summaries_[job.value()] = std::move(summary);
  }
  return history;
}

bool JobHistory::DiskHasRoom() {
  const auto now = std::chrono::steady_clock::now();
  if (now - disk_checked_ < std::chrono::seconds(1)) return disk_has_room_;
  disk_checked_ = now;
  struct statvfs fs {};
  if (::statvfs(dir_.c_str(), &fs) != 0) return disk_has_room_;
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  const bool room = free_bytes >= kMinFreeBytes && free_bytes * 100 >= total;
  if (room != disk_has_room_) {
    SchedLog()->warn("job history: {} {} ({} MB free)",
                     room ? "writing again to" : "the file system is nearly full: not writing to", dir_.string(),
                     free_bytes >> 20);
  }
  return disk_has_room_ = room;
}

JobHistory::~JobHistory() { Flush(); }

std::string* JobHistory::Room(JobId job, size_t bytes) {
  Pending& p = events_[job.value()];
  if (!p.known) {
    const fs::path path = JobDir(job) / "events.jsonl";
    p.written = FileSize(path);
    p.known = true;
    if (!EndsALine(path)) p.text += "\n";
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

void JobHistory::JobProgress(JobId job, const Json& point) {
  const std::string text = DumpJson(point);
  std::string* out = Room(job, text.size() + 8);
  if (!out) return;
  *out += "{\"p\":" + text + "}\n";
}

void JobHistory::JobFinished(JobId job, const Json& summary) {
  // Written at the next Flush, off the path of the reply that the job ended.
  Json& kept = summaries_[job.value()] = summary;
  if (auto series = kept.find("progress_series"); series != kept.end()) {
    unwritten_progress_[job.value()] = std::move(*series);
    kept.erase(series);
  }
  unwritten_summaries_.insert(job.value());
}

void JobHistory::WriteSummary(JobId job) {
  auto it = summaries_.find(job.value());
  if (it == summaries_.end() || !DiskHasRoom()) return;
  std::error_code ec;
  fs::create_directories(JobDir(job), ec);
  const fs::path tmp = JobDir(job) / "summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << DumpJson(it->second) << "\n";
    if (!out) {
      SchedLog()->warn("job {}: cannot write its summary to {}", job.value(), tmp.string());
      return;
    }
  }
  fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write, ec);
  fs::rename(tmp, JobDir(job) / "summary.json", ec);
  if (auto series = unwritten_progress_.find(job.value()); series != unwritten_progress_.end()) {
    std::ofstream(JobDir(job) / "progress.json", std::ios::trunc) << DumpJson(series->second) << "\n";
    fs::permissions(JobDir(job) / "progress.json", fs::perms::owner_read | fs::perms::owner_write, ec);
    unwritten_progress_.erase(series);
  }
}

Json JobHistory::ProgressSeries(JobId job) const {
  if (auto series = unwritten_progress_.find(job.value()); series != unwritten_progress_.end()) return series->second;
  std::ifstream in(JobDir(job) / "progress.json");
  if (!in) return Json::array();
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json series = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return series.is_array() ? series : Json::array();
}

void JobHistory::Flush() {
  for (auto& [id, p] : events_) {
    if (p.text.empty()) continue;
    const fs::path dir = JobDir(JobId(id));
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::erase_if(loaded_, [id = id](const auto& l) { return l.first == id; });  // no longer what the file holds
    if (!DiskHasRoom()) {
      // Dropped, not held: the history gives way to the journal.
    } else if (AppendFile(dir / "events.jsonl", p.text)) {
      p.written += p.text.size();
    } else {
      SchedLog()->warn("job {}: cannot append to {}: {}", id, (dir / "events.jsonl").string(), std::strerror(errno));
    }
    if (p.text.capacity() > (1u << 20)) {
      std::string().swap(p.text);  // a burst's buffer is not kept for the job's life
    } else {
      p.text.clear();
    }
  }
  for (uint64_t id : unwritten_summaries_) {
    WriteSummary(JobId(id));
    events_.erase(id);  // its events are written; lines after its end start a new entry
  }
  unwritten_summaries_.clear();
}

JobHistory::VertexLogs& JobHistory::VertexLogsOf(JobId job) {
  auto [it, fresh] = vertex_logs_.try_emplace(job.value());
  if (fresh) {
    std::error_code ec;
    for (fs::directory_iterator d(JobDir(job) / "logs", ec), end; !ec && d != end; d.increment(ec)) {
      const std::string name = d->path().filename().string();
      const size_t dot = name.find('.');
      if (dot == std::string::npos || name.size() < 7 || name.compare(name.size() - 6, 6, ".jsonl") != 0) continue;
      const auto vertex = JobIdOf(name.substr(0, dot));
      const auto version = JobIdOf(name.substr(dot + 1, name.size() - 6 - dot - 1));
      if (!vertex || !version || *vertex > UINT32_MAX || *version > UINT32_MAX) continue;
      it->second.versions[static_cast<uint32_t>(*vertex)].insert(static_cast<uint32_t>(*version));
      it->second.bytes += FileSize(d->path());
    }
  }
  return it->second;
}

fs::path JobHistory::VertexLogPath(JobId job, VertexId vertex, uint32_t version) const {
  return JobDir(job) / "logs" / fmt::format("{}.{}.jsonl", vertex.value(), version);
}

Status JobHistory::AppendVertexLog(JobId job, VertexId vertex, uint32_t version,
                                   const google::protobuf::RepeatedPtrField<protocol::LogChunk>& chunks) {
  std::string text;
  for (const protocol::LogChunk& c : chunks) {
    text += "{\"stream\":";
    AppendJsonString(text, c.stream());
    text += ",\"text\":";
    AppendJsonString(text, c.text());  // what a program printed: not always UTF-8 (U+FFFD then)
    text += "}\n";
  }
  if (text.empty() || !DiskHasRoom()) return Status::OK();
  VertexLogs& logs = VertexLogsOf(job);
  if (logs.bytes + text.size() > kMaxVertexLogBytes) {
    if (logs.full_noted) return Status::OK();
    logs.full_noted = true;
    text = fmt::format(
        "{{\"stream\":\"copse\",\"text\":\"[copse: this job's vertex logs reached {} MiB; the job manager keeps no "
        "more of them]\\n\"}}\n",
        kMaxVertexLogBytes >> 20);
  }
  const fs::path path = VertexLogPath(job, vertex, version);
  auto& versions = logs.versions[vertex.value()];
  if (!versions.count(version)) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (!EndsALine(path)) text.insert(0, "\n");  // a record torn by a crash before a restart
    versions.insert(version);
  }
  if (!AppendFile(path, text)) return Status::IOError("cannot append to " + path.string() + ": " + std::strerror(errno));
  logs.bytes += text.size();
  return Status::OK();
}

JobHistory::LogRead JobHistory::ReadVertexLog(JobId job, VertexId vertex, uint32_t version, uint64_t from,
                                              size_t max_bytes) const {
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

std::vector<uint32_t> JobHistory::LoggedVersions(JobId job, VertexId vertex) {
  const auto& versions = VertexLogsOf(job).versions;
  auto it = versions.find(vertex.value());
  return it == versions.end() ? std::vector<uint32_t>() : std::vector<uint32_t>(it->second.begin(), it->second.end());
}

std::shared_ptr<const JobHistory::Events> JobHistory::Load(JobId job) const {
  for (const auto& [id, events] : loaded_) {
    if (id == job.value()) return events;
  }
  auto events = std::make_shared<Events>();
  std::ifstream in(JobDir(job) / "events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    Json r = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object()) continue;
    auto string_of = [&](const char* key) {
      auto it = r.find(key);
      return it != r.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (auto l = r.find("l"); l != r.end() && l->is_string()) {
      auto v = r.find("v");
      const bool has_vertex = v != r.end() && v->is_number_unsigned() && v->get<uint64_t>() <= UINT32_MAX;
      events->lines.emplace_back(has_vertex ? VertexId(v->get<uint32_t>()) : VertexId::Invalid(), l->get<std::string>());
    } else if (auto s = r.find("s"); s != r.end() && s->is_array() && s->size() == 4 && (*s)[0].is_number_unsigned() &&
                                     (*s)[1].is_number_unsigned() && (*s)[0].get<uint64_t>() <= UINT32_MAX &&
                                     (*s)[1].get<uint64_t>() <= UINT32_MAX && (*s)[2].is_number() && (*s)[3].is_number()) {
      HistorySpan span;
      span.vertex = (*s)[0].get<uint32_t>();
      span.version = (*s)[1].get<uint32_t>();
      span.start_ms = (*s)[2].get<double>();
      span.end_ms = (*s)[3].get<double>();
      span.outcome = string_of("o");
      span.daemon = string_of("d");
      span.vertex_name = string_of("n");
      span.stage = string_of("st");
      const auto b = r.find("b");
      span.log_lines_before_end = b != r.end() && b->is_number_unsigned() ? b->get<size_t>() : 0;
      events->names.try_emplace(span.vertex, span.vertex_name, span.stage);
      events->spans.push_back(std::move(span));
    } else if (auto p = r.find("p"); p != r.end() && p->is_object()) {
      events->progress.push_back(std::move(*p));
    } else if (auto t = r.find("truncated"); t != r.end() && t->is_boolean() && t->get<bool>()) {
      events->truncated = true;
    }
  }
  if (loaded_.size() >= kLoadedJobs) loaded_.erase(loaded_.begin());
  loaded_.emplace_back(job.value(), events);
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

const Json* JobHistory::Summary(JobId job) const {
  auto it = summaries_.find(job.value());
  return it == summaries_.end() ? nullptr : &it->second;
}

std::vector<JobId> JobHistory::Jobs() const {
  std::vector<JobId> jobs;
  std::error_code ec;
  for (fs::directory_iterator d(dir_, ec), end; !ec && d != end; d.increment(ec)) {
    std::error_code dir_ec;
    if (auto id = JobIdOf(d->path().filename().string()); id && d->is_directory(dir_ec)) jobs.push_back(JobId(*id));
  }
  std::sort(jobs.begin(), jobs.end(), [](JobId a, JobId b) { return a.value() < b.value(); });
  return jobs;
}

std::vector<const Json*> JobHistory::Summaries(int64_t since_unix_ms, size_t max_jobs) const {
  std::vector<const Json*> out;
  for (auto it = summaries_.rbegin(); it != summaries_.rend() && out.size() < max_jobs; ++it) {
    if (Int64Of(it->second, "submitted_unix_ms") >= since_unix_ms) out.push_back(&it->second);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

size_t JobHistory::Prune(int64_t before_unix_ms, const std::set<uint64_t>& keep) {
  size_t removed = 0;
  const auto before = std::chrono::system_clock::time_point(std::chrono::milliseconds(before_unix_ms));
  for (JobId job : Jobs()) {
    if (keep.count(job.value())) continue;
    auto summary = summaries_.find(job.value());
    if (summary != summaries_.end()) {
      if (Int64Of(summary->second, "finished_unix_ms") >= before_unix_ms) continue;
    } else {
      // Never finished here (its journal record was skipped at a restart, or it was lost with
      // a journal): removed once it has not been written to for as long.
      std::error_code ec;
      const auto written = fs::last_write_time(JobDir(job), ec);
      if (ec || std::chrono::file_clock::to_sys(written) >= before) continue;
    }
    std::error_code ec;
    fs::remove_all(JobDir(job), ec);
    events_.erase(job.value());
    vertex_logs_.erase(job.value());
    summaries_.erase(job.value());
    unwritten_progress_.erase(job.value());
    std::erase_if(loaded_, [&](const auto& l) { return l.first == job.value(); });
    if (!ec) ++removed;
  }
  return removed;
}

}  // namespace copse::jm
