#include "cli/status_view.h"

#include <cstdio>
#include <ctime>

#include <fmt/format.h>

namespace copse::cli {
namespace {

std::string OrDash(std::string s) { return s.empty() ? "-" : s; }

std::string Bar(size_t done, size_t running, size_t total, size_t width, bool color) {
  if (total == 0) return std::string(width, ' ');
  size_t d = done * width / total;
  size_t r = std::min(width - d, (running * width + total - 1) / total);
  std::string s;
  if (color) s += "\033[32m";
  s += std::string(d, '#');
  if (color) s += "\033[33m";
  s += std::string(r, '>');
  if (color) s += "\033[0m";
  s += std::string(width - d - r, '.');
  return s;
}

std::string Fmt(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, a);
  return buf;
}

}  // namespace

/// "progress: step 37/50, loss 0.6120, 9310 images/s" from whatever figures the job reported.
std::string RenderProgress(const Json& p) {
  std::string out = "progress:";
  const char* sep = " ";
  if (p.contains("step") && p["step"].is_number()) {
    out += sep + Fmt("step %.0f", p["step"].get<double>());
    if (p.contains("steps") && p["steps"].is_number()) out += Fmt("/%.0f", p["steps"].get<double>());
    sep = ", ";
  }
  if (p.contains("loss") && p["loss"].is_number()) out += sep + Fmt("loss %.4f", p["loss"].get<double>()), sep = ", ";
  if (p.contains("images_per_s") && p["images_per_s"].is_number())
    out += sep + Fmt("%.0f images/s", p["images_per_s"].get<double>()), sep = ", ";
  if (p.contains("tokens_per_s") && p["tokens_per_s"].is_number())
    out += sep + Fmt("%.0f tokens/s", p["tokens_per_s"].get<double>()), sep = ", ";
  if (p.contains("test_accuracy") && p["test_accuracy"].is_number())
    out += sep + Fmt("test accuracy %.2f %%", 100 * p["test_accuracy"].get<double>()), sep = ", ";
  if (p.contains("validation_loss") && p["validation_loss"].is_number()) {
    out += sep + Fmt("validation loss %.4f", p["validation_loss"].get<double>());
    if (p.contains("perplexity") && p["perplexity"].is_number()) out += Fmt(" (perplexity %.2f)", p["perplexity"].get<double>());
  }
  return out;
}

std::string RenderJobStatus(const Json& job, bool color) {
  std::string out = "job " + std::to_string(job["id"].get<uint64_t>()) + " \"" + job["name"].get<std::string>() +
                    "\": " + job["state"].get<std::string>() + ", " + Fmt("%.2f", job["elapsed_s"].get<double>()) + " s, " +
                    std::to_string(job["vertices"]["completed"].get<size_t>()) + "/" +
                    std::to_string(job["vertices"]["total"].get<size_t>()) + " vertices done\n";
  size_t name_width = 5;
  for (const auto& s : job["stages"]) name_width = std::max(name_width, s["name"].get<std::string>().size());
  for (const auto& s : job["stages"]) {
    std::string name = s["name"].get<std::string>();
    size_t total = s["total"], done = s["completed"], running = s["running"], failed = s["failed_attempts"];
    out += "  " + name + std::string(name_width - name.size(), ' ') + " [" + Bar(done, running, total, 30, color) + "] " +
           std::to_string(done) + "/" + std::to_string(total) + " done";
    if (running) out += ", " + std::to_string(running) + " running";
    if (const size_t ahead = s.value("sent_ahead", size_t{0})) out += ", " + std::to_string(ahead) + " sent ahead";
    if (failed) out += ", " + std::to_string(failed) + (failed == 1 ? " failed attempt" : " failed attempts");
    out += "\n";
  }
  if (job.contains("progress")) out += "  " + RenderProgress(job["progress"]) + "\n";
  if (job.contains("failure")) out += "  failure: " + job["failure"].get<std::string>() + "\n";
  if (const Json& failed = job.value("failed_attempt", Json()); failed.is_object() && failed.value("printed", true)) {
    out += fmt::format("  what it printed: copse logs {} '{}' --attempt {}\n", job["id"].get<uint64_t>(),
                       failed.value("vertex", ""), failed.value("attempt", 0));
  }
  if (job.value("forgotten", false)) {
    out += "  (from its history: it finished more than --finished-job-ttl-s ago, and its outputs were released)\n";
  }
  for (const auto& w : job["waiting"]) {
    out += "  " + w["vertex"].get<std::string>() + ": " + w["reason"].get<std::string>() + "\n";
  }
  for (const auto& f : job["faults"]) {
    out += "  fault: " + f["fault"].get<std::string>();
    if (f.contains("vertex")) out += " " + f["vertex"].get<std::string>();
    if (f.contains("daemon")) out += " on " + f["daemon"].get<std::string>();
    out += Fmt(" at %.0f ms\n", f["at_ms"].get<double>());
  }
  for (const auto& f : job.value("faults_not_fired", Json::array())) {
    out += "  fault " + f["source"].get<std::string>() + " (" + f["fault"].get<std::string>() +
           (f.contains("vertex") ? " " + f["vertex"].get<std::string>() : "") + ") never fired\n";
  }
  for (const auto& r : job["recoveries"]) {
    out += "  recovery: " + r["vertex"].get<std::string>() + " version " + std::to_string(r["failed_version"].get<uint32_t>()) +
           " " + r["reason"].get<std::string>() + " -> re-run: " + r["detail"].get<std::string>() + "\n";
  }
  return out;
}

std::string RenderCopiedOutputs(const Json& outputs) {
  std::string out;
  for (const auto& o : outputs) {
    out += fmt::format("  output {} ({} bytes)\n", o.value("path", ""), o.value("bytes", uint64_t{0}));
  }
  return out;
}

std::string RenderJobsTable(const Json& jobs, bool submitted) {
  bool reasons = false;
  for (const auto& j : jobs) reasons = reasons || j.contains("reason");
  std::string out =
      std::string("  ID  ") + (submitted ? "SUBMITTED            " : "") +
      (reasons ? "STATE      DONE/TOTAL  ELAPSED  NAME                  REASON\n" : "STATE      DONE/TOTAL  ELAPSED  NAME\n");
  for (const auto& j : jobs) {
    std::string line = fmt::format("{:4}  ", j["id"].get<uint64_t>());
    if (submitted) {
      const std::time_t at = static_cast<std::time_t>(j.value("submitted_unix_ms", int64_t{0}) / 1000);
      std::tm local{};
      localtime_r(&at, &local);
      char when[32];
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &local);
      line += fmt::format("{:<19}  ", when);
    }
    line += fmt::format("{:<9}  {:5}/{:<5}  {:6.1f}s  ", j["state"].get<std::string>(), j["completed"].get<size_t>(),
                        j["total"].get<size_t>(), j["elapsed_s"].get<double>());
    line +=
        reasons ? fmt::format("{:<20}  {}", j["name"].get<std::string>(), j.value("reason", "")) : j["name"].get<std::string>();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

namespace {

/// "free/total" memory in GiB, or "-" for a daemon that declares none.
std::string MemoryColumn(const Json& d) {
  const int64_t total = d.value("memory_mb", int64_t{0});
  if (total <= 0) return "-";
  return fmt::format("{:.1f}/{:.1f}G", d.value("free_memory_mb", int64_t{0}) / 1024.0, total / 1024.0);
}

/// GPUs and, where the daemon reported it, each one's memory: "2x80G".
std::string GpusColumn(const Json& d) {
  const int gpus = d.value("gpus", 0);
  const int64_t memory = d.value("gpu_memory_mb", int64_t{0});
  if (gpus == 0 || memory <= 0) return std::to_string(gpus);
  return fmt::format("{}x{:.0f}G", gpus, memory / 1024.0);
}

}  // namespace

std::string RenderDaemonsTable(const Json& daemons, bool all) {
  std::string out =
      "NAME          STATE    CPUS  FREE     GPUS  MEMORY FREE/ALL  RUNNING  DATA                  CONTROL       LABELS\n";
  size_t hidden = 0;
  for (const auto& d : daemons) {
    if (!all && d.value("superseded", false)) {
      ++hidden;
      continue;
    }
    std::string labels;
    for (auto& [k, v] : d["labels"].items()) labels += (labels.empty() ? "" : ",") + k + "=" + v.get<std::string>();
    char line[512];
    std::snprintf(line, sizeof(line), "%-12s  %-7s  %4.0f  %4.0f  %7s  %15s  %7zu  %-20s  %-12s  %s\n",
                  d["name"].get<std::string>().c_str(), d.value("state", d["alive"].get<bool>() ? "alive" : "lost").c_str(),
                  d["cpus"].get<double>(), d["free_cpus"].get<double>(), GpusColumn(d).c_str(), MemoryColumn(d).c_str(),
                  d["running"].get<size_t>(), OrDash(d["data"].get<std::string>()).c_str(),
                  OrDash(d.value("control", "tcp")).c_str(), labels.c_str());
    out += line;
  }
  if (hidden)
    out += std::to_string(hidden) + " earlier registration" + (hidden == 1 ? "" : "s") +
           " of these names not shown (--all lists them)\n";
  return out;
}

std::string RenderChaosReply(const Json& done) {
  const std::string fault = done.value("fault", "");
  std::string text;
  if (fault == "kill_daemon") {
    text = "killed daemon " + done.value("daemon", "?");
  } else if (fault == "cut_daemon") {
    text =
        fmt::format("cut daemon {} off from the job manager for {} ms", done.value("daemon", "?"), done.value("ms", int64_t{0}));
  } else if (!fault.empty()) {
    text = fmt::format("armed {} on {} of job {}", fault, done.value("vertex", "?"), done.value("job", uint64_t{0}));
  } else if (done.value("random", false)) {
    std::string kinds;
    for (const auto& k : done.value("kinds", Json::array())) kinds += (kinds.empty() ? "" : ", ") + k.get<std::string>();
    text = "random chaos started (" + kinds + ")";
    if (done.contains("replaced")) text += ", replacing " + done.value("replaced", "the one running");
  } else if (done.contains("random")) {
    text = "random chaos stopped";
  } else {
    text = done.dump();  // an answer this client does not know: as sent
  }
  text += "\n";
  if (done.contains("note")) text += "  note: " + done.value("note", "") + "\n";
  return text;
}

}  // namespace copse::cli
