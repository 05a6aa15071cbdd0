#pragma once
// Shared by `submit --wait`, `status -w` and `run`: following a job until it finishes, and
// copying its declared outputs to a directory.
#include <atomic>
#include <filesystem>
#include <functional>
#include <string>

#include "common/framed_connection.h"
#include "common/json_util.h"

namespace copse::cli {

/// Follows a job until it is no longer running and returns its final status. With `live`,
/// polls every `interval` and redraws the progress display on the terminal in place; stops
/// early (returning the last status) when `*interrupted` becomes true, and with the error
/// `can_progress` returns when that is not OK. Without any of them, sends one "wait" request
/// that the job manager answers when the job ends.
Result<Json> WatchJob(net::BlockingClient& client, uint64_t job, bool live, const std::atomic<bool>* interrupted = nullptr,
                      std::chrono::milliseconds interval = std::chrono::milliseconds(100),
                      const std::function<Status()>& can_progress = {});

/// Copies each declared output of a completed job into `dir`; returns [{path, bytes}].
Result<Json> FetchOutputs(net::BlockingClient& client, uint64_t job, const std::filesystem::path& dir,
                          const std::string& secret);

/// Reads a job file and sends it; returns the job id. Local validation errors are returned as
/// InvalidArgument listing every diagnostic.
Result<uint64_t> SubmitJobFile(net::BlockingClient& client, const std::string& file);

}  // namespace copse::cli
