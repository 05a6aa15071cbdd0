#include "cli/job_watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "channels/output_store.h"
#include "channels/remote_reader.h"
#include "cli/status_view.h"
#include "jobmanager/job_loader.h"

namespace copse::cli {

namespace {

/// Sends a request and returns the reply.
using Caller = std::function<Result<Json>(const Json& request, std::chrono::milliseconds timeout)>;

Result<Json> Watch(const Caller& call, uint64_t job, const WatchOptions& o) {
  if (!o.live && !o.interrupted && !o.can_progress && !o.on_change) {
    // One request answered when the job ends: no polling of a large job's status.
    COPSE_ASSIGN_OR_RETURN(Json reply, call({{"op", "wait"}, {"job", job}}, std::chrono::hours(24 * 365)));
    return reply["job"];
  }
  size_t drawn_lines = 0;
  Json last_seen;
  while (true) {
    COPSE_ASSIGN_OR_RETURN(Json reply, call({{"op", "status"}, {"job", job}}, std::chrono::seconds(30)));
    Json status = reply["job"];
    bool done = status["state"] != "running";
    if (o.on_change) {
      Json seen = status;
      seen.erase("elapsed_s");
      if (seen != last_seen) o.on_change(status);
      last_seen = std::move(seen);
    }
    if (o.live) {
      std::string text = RenderJobStatus(status, true);
      std::string clear;
      for (size_t i = 0; i < drawn_lines; ++i) clear += "\033[1A\033[2K";
      std::cerr << clear << text << std::flush;
      drawn_lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    }
    if (done || (o.interrupted && o.interrupted->load())) return status;
    if (o.can_progress) COPSE_RETURN_NOT_OK(o.can_progress());
    std::this_thread::sleep_for(o.interval);
  }
}

}  // namespace

Result<Json> WatchJob(net::BlockingClient& client, uint64_t job, const WatchOptions& options) {
  return Watch([&](const Json& request, std::chrono::milliseconds timeout) { return client.Call(request, timeout); }, job,
               options);
}

Result<Json> CallReconnecting(std::unique_ptr<net::BlockingClient>& client, const Json& request,
                              std::chrono::milliseconds timeout, const Reconnect& reconnect,
                              std::chrono::milliseconds reconnect_for) {
  // Every loss of the connection, however many, gets a new window of `reconnect_for`.
  while (true) {
    auto reply = client->Call(request, timeout);
    // Unavailable: the connection broke (the job manager exited, or its host went away). An
    // error reply or a timeout is an answer, not a lost job manager.
    if (reply.ok() || reply.status().code() != StatusCode::kUnavailable) return reply;
    std::cerr << "copse: lost the job manager (" << reply.status().message() << "); reconnecting for up to "
              << reconnect_for.count() / 1000 << " s\n";
    const auto until = std::chrono::steady_clock::now() + reconnect_for;
    Status last = reply.status();
    bool reconnected = false;
    while (!reconnected && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto fresh = reconnect();
      if (fresh.ok()) {
        client = std::move(*fresh);
        reconnected = true;
      } else {
        last = fresh.status();
      }
    }
    if (!reconnected) {
      return last.WithContext("the job manager did not come back within " + std::to_string(reconnect_for.count() / 1000) + " s");
    }
    std::cerr << "copse: reconnected to the job manager\n";
  }
}

Result<Json> WatchJob(std::unique_ptr<net::BlockingClient>& client, uint64_t job, const WatchOptions& options,
                      const Reconnect& reconnect, std::chrono::milliseconds reconnect_for) {
  return Watch(
      [&](const Json& request, std::chrono::milliseconds timeout) {
        return CallReconnecting(client, request, timeout, reconnect, reconnect_for);
      },
      job, options);
}

Status CheckWritableDir(const std::filesystem::path& dir, const std::string& flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return Status::InvalidArgument(flag + " " + dir.string() + ": cannot make it a directory" + (ec ? ": " + ec.message() : ""));
  }
  const auto probe = dir / (".copse-write-check-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::InvalidArgument(flag + " " + dir.string() + ": cannot write there: " + std::strerror(errno));
  ::close(fd);
  std::filesystem::remove(probe, ec);
  return Status::OK();
}

Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir, const std::string& secret,
                          std::shared_ptr<const tls::Context> tls) {
  chan::RemoteReaderOptions remote;
  remote.tls = std::move(tls);
  COPSE_ASSIGN_OR_RETURN(Json reply, client.Call({{"op", "outputs"}, {"job", job}}));
  Json written = Json::array();
  for (const auto& o : reply["outputs"]) {
    COPSE_ASSIGN_OR_RETURN(auto key, chan::OutputKey::FromJson(o["key"]));
    auto path = dir / o["path"].get<std::string>();
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    COPSE_ASSIGN_OR_RETURN(auto reader,
                           chan::OpenRemoteReader(o["host"].get<std::string>(), o["port"].get<uint16_t>(), key, secret, remote));
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

Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir,
                          const JmAddressOptions& jm) {
  COPSE_ASSIGN_OR_RETURN(std::string secret, LoadClientSecret(jm));
  COPSE_ASSIGN_OR_RETURN(auto tls, LoadClientTls(jm));
  return FetchOutputs(client, job, dir, secret, std::move(tls));
}

Result<uint64_t> SubmitJob(net::BlockingClient& client, const jm::JobGraph& graph, const std::string& file) {
  // Relative paths in the job resolve against its file's directory. /dev/stdin (or /dev/fd/N,
  // /proc/self/fd/N) stands for the file it was redirected from, whose directory is meant, or
  // for a pipe, which has none but the directory the command was given in.
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool stands_for_another = file.rfind("/dev/", 0) == 0 || file.rfind("/proc/", 0) == 0;
  const fs::path real = stands_for_another ? fs::canonical(file, ec) : fs::absolute(file, ec);
  const auto dir = !ec && fs::is_regular_file(real, ec) ? real.parent_path() : fs::current_path();
  COPSE_ASSIGN_OR_RETURN(
      Json reply, client.Call({{"op", "submit"}, {"job", graph.spec().source}, {"job_dir", dir.string()}, {"source", file}}));
  return reply["job"].get<uint64_t>();
}

Result<uint64_t> SubmitJobFile(net::BlockingClient& client, const std::string& file) {
  // Programs and their params are the job manager's to check (the client links no programs):
  // its answer names the same pointers `copse validate` would.
  jm::JobLoad load = jm::LoadJobFile(file, jm::ProgramCatalog::AcceptAny());
  if (!load.ok()) return load.status();
  return SubmitJob(client, *load.graph, file);
}

}  // namespace copse::cli
