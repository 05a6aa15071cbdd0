#include "cli/job_watch.h"

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <thread>

#include "channels/output_store.h"
#include "channels/remote_reader.h"
#include "cli/program_catalog.h"
#include "cli/status_view.h"
#include "jobmanager/job_loader.h"

namespace copse::cli {

Result<Json> WatchJob(net::BlockingClient& client, uint64_t job, bool live, const std::atomic<bool>* interrupted,
                      std::chrono::milliseconds interval, const std::function<Status()>& can_progress) {
  if (!live && !interrupted && !can_progress) {
    // One request answered when the job ends: no polling of a large job's status.
    COPSE_ASSIGN_OR_RETURN(Json reply, client.Call({{"op", "wait"}, {"job", job}}, std::chrono::hours(24 * 365)));
    return reply["job"];
  }
  size_t drawn_lines = 0;
  while (true) {
    COPSE_ASSIGN_OR_RETURN(Json reply, client.Call({{"op", "status"}, {"job", job}}));
    Json status = reply["job"];
    bool done = status["state"] != "running";
    if (live) {
      std::string text = RenderJobStatus(status, true);
      std::string clear;
      for (size_t i = 0; i < drawn_lines; ++i) clear += "\033[1A\033[2K";
      std::cerr << clear << text << std::flush;
      drawn_lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    }
    if (done || (interrupted && interrupted->load())) return status;
    if (can_progress) COPSE_RETURN_NOT_OK(can_progress());
    std::this_thread::sleep_for(interval);
  }
}

Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir,
                          const std::string& secret) {
  COPSE_ASSIGN_OR_RETURN(Json reply, client.Call({{"op", "outputs"}, {"job", job}}));
  Json written = Json::array();
  for (const auto& o : reply["outputs"]) {
    COPSE_ASSIGN_OR_RETURN(auto key, chan::OutputKey::FromJson(o["key"]));
    auto path = dir / o["path"].get<std::string>();
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    COPSE_ASSIGN_OR_RETURN(auto reader, chan::OpenRemoteReader(o["host"].get<std::string>(), o["port"].get<uint16_t>(), key, secret));
    auto tmp = path;
    tmp += ".partial";
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::IOError("cannot write " + tmp.string());
    uint64_t bytes = 0;
    while (true) {
      COPSE_ASSIGN_OR_RETURN(auto msg, reader->Next());
      if (!msg) break;
      out.write(msg->data(), static_cast<std::streamsize>(msg->size()));
      bytes += msg->size();
    }
    out.close();
    if (!out) return Status::IOError("error writing " + tmp.string());
    std::filesystem::rename(tmp, path, ec);
    if (ec) return Status::IOError("cannot rename to " + path.string() + ": " + ec.message());
    written.push_back({{"path", path.string()}, {"bytes", bytes}, {"vertex", o["vertex"]}});
  }
  return written;
}

Result<uint64_t> SubmitJobFile(net::BlockingClient& client, const std::string& file) {
  jm::JobLoad load = jm::LoadJobFile(file, Catalog());
  if (!load.ok()) return load.status();
  auto dir = std::filesystem::absolute(file).parent_path();
  COPSE_ASSIGN_OR_RETURN(Json reply, client.Call({{"op", "submit"}, {"job", load.graph->spec().source},
                                                  {"job_dir", dir.string()}, {"source", file}}));
  return reply["job"].get<uint64_t>();
}

}  // namespace copse::cli
