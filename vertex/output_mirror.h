#pragma once
// OutputMirror: makes this daemon's copies of other daemons' outputs for mirrored channels
// (the job manager's Mirror message; jobmanager/scheduler_mirrors.cc). Each copy is fetched from
// the producer's data server into this daemon's output store, in memory, under the producer's
// key, and the job manager told when it is whole or could not be made (Mirrored). The copies
// are ordinary outputs from then on: the data server serves them, Release and Gc drop them.
//
// One thread does the fetches in the order they were asked (a step's copies are not urgent:
// they matter only if a daemon is lost later); the destructor stops it, abandoning what is left
// and ending the fetch under way.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "channels/output_store.h"
#include "common/tls.h"
#include "protocol/daemon.pb.h"

namespace copse::vertex {

class OutputMirror {
 public:
  /// `send` takes each Mirrored message for the job manager (called on the mirror's thread).
  OutputMirror(chan::OutputStore& store, std::string secret, std::shared_ptr<const tls::Context> tls,
               std::function<void(const protocol::DaemonToJm&)> send);
  ~OutputMirror();
  OutputMirror(const OutputMirror&) = delete;
  OutputMirror& operator=(const OutputMirror&) = delete;

  /// Queues the copy a Mirror message asks for.
  void Add(protocol::Mirror request);

 private:
  void Loop();
  /// Copies one output; the bytes copied, or why not.
  Result<uint64_t> Copy(const protocol::Mirror& request);

  chan::OutputStore& store_;
  const std::string secret_;
  const std::shared_ptr<const tls::Context> tls_;
  const std::function<void(const protocol::DaemonToJm&)> send_;
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<protocol::Mirror> pending_;
  std::optional<protocol::StoreLocation> current_;  // the peer of the copy being made
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace copse::vertex
