#pragma once
// Shared by `submit --wait`, `status -w` and `run`: following a job until it finishes, and
// copying its declared outputs to a directory.
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "cli/jm_client.h"
#include "common/framed_connection.h"
#include "common/json_util.h"
#include "jobmanager/job_graph.h"

namespace copse::cli {

struct WatchOptions {
  /// Poll every `interval` and redraw the progress display on the terminal in place.
  bool live = false;
  /// Stop early, returning the last status, once this becomes true.
  const std::atomic<bool>* interrupted = nullptr;
  std::chrono::milliseconds interval{100};
  /// Checked between polls: stop with its error when it is not OK.
  std::function<Status()> can_progress;
  /// Called with each polled status that differs from the one before (its elapsed time
  /// aside), the final one included: `status -w -o json` prints each as a line.
  std::function<void(const Json& status)> on_change;
};

/// Follows a job until it is no longer running and returns its final status. With none of
/// `options`' live display, interruption or progress check, sends one "wait" request that the
/// job manager answers when the job ends; otherwise polls.
Result<Json> WatchJob(net::BlockingClient& client, uint64_t job, const WatchOptions& options = {});

/// Opens a new connection to the job manager.
using Reconnect = std::function<Result<std::unique_ptr<net::BlockingClient>>()>;

/// One request on `client`; when the connection is lost, connects again through `reconnect`
/// (every 200 ms, for up to `reconnect_for`) and asks again. `client` is the connection in use
/// at the end.
Result<Json> CallReconnecting(std::unique_ptr<net::BlockingClient>& client, const Json& request,
                              std::chrono::milliseconds timeout, const Reconnect& reconnect,
                              std::chrono::milliseconds reconnect_for = std::chrono::seconds(60));

/// WatchJob that outlives a job manager restart: when the connection is lost, connects again
/// through `reconnect` (every 200 ms, for up to `reconnect_for`; a job manager started again
/// on its state directory resumes its jobs) and goes on watching. `client` is the connection
/// in use at the end.
Result<Json> WatchJob(std::unique_ptr<net::BlockingClient>& client, uint64_t job, const WatchOptions& options,
                      const Reconnect& reconnect, std::chrono::milliseconds reconnect_for = std::chrono::seconds(60));

/// Creates `dir` if needed and checks that files can be written in it, so that a job is not run
/// for outputs that could not be copied; an error naming `flag` and the directory otherwise.
Status CheckWritableDir(const std::filesystem::path& dir, const std::string& flag);

/// Copies each declared output of a completed job into `dir`; returns [{path, bytes}].
Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir, const std::string& secret,
                          std::shared_ptr<const tls::Context> tls = nullptr);
/// The same, with the secret a client of `jm` presents (LoadClientSecret).
Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir,
                          const JmAddressOptions& jm);

/// Reads a job file and sends it; returns the job id. Local validation errors (the file's
/// shape; programs and params are the job manager's to check) are returned as InvalidArgument
/// listing every diagnostic.
Result<uint64_t> SubmitJobFile(net::BlockingClient& client, const std::string& file);
/// Sends a job already read from `file` (read once: a pipe cannot be read twice).
Result<uint64_t> SubmitJob(net::BlockingClient& client, const jm::JobGraph& graph, const std::string& file);

}  // namespace copse::cli
