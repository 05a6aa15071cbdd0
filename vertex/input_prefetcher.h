#pragma once
// InputPrefetcher: fetches the remote inputs of a task that waits on this daemon (chained after
// another attempt, see Scheduler::TryChain) while it waits, so that the task starts with its
// inputs in memory instead of paying a fetch round trip to another daemon when it starts.
//
// An input written by the attempt the task waits for does not exist yet: its fetch waits for it
// at the producer's data server (fetch "wait_ms", data_server.h) and asks again until it appears
// or the task is cancelled. When that attempt runs on another daemon, this fetch is also how
// this daemon learns that the attempt succeeded — no job-manager round trip — so `on_after` is
// called once every input from it has arrived (OK) or one cannot be had (the error: its daemon
// is gone, or the output was refused).
//
// Whole outputs are held in memory: one larger than kMaxPrefetchBytes is not kept (the task
// reads it from the producer as usual) but still counts as arrived for `on_after`.
//
// Threads: a task's fetches run on one thread, taken from those kept idle by earlier tasks or
// started when none is (starting a thread costs up to a millisecond on a busy machine: the
// pool grows to the most tasks that have waited at once, a handful). The destructor cancels
// every fetch still going and joins the threads (a waiting fetch notices within kWaitSliceMs).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/tls.h"
#include "channels/channel.h"
#include "channels/output_store.h"
#include "common/json_util.h"
#include "common/status.h"
#include "protocol/daemon.pb.h"

namespace copse::vertex {

/// What was fetched ahead for one task, shared by the fetching thread and the task.
class PrefetchedInputs {
 public:
  explicit PrefetchedInputs(size_t ports) : slots_(ports) {}

  /// A reader over input `port`'s messages when they were prefetched whole (waits for the
  /// fetch to end if it still runs); nullptr when they were not, and the caller opens the input
  /// as usual (which reports any error the prefetch met). Each port can be taken once.
  std::unique_ptr<chan::ChannelReader> Take(size_t port);

 private:
  friend class InputPrefetcher;
  enum class State { kNone, kFetching, kArrived, kNotKept };
  struct Slot {
    State state = State::kNone;
    std::vector<chan::Buffer> messages;
  };
  void Settle(size_t port, State state, std::vector<chan::Buffer> messages = {});

  std::mutex mu_;
  std::condition_variable settled_;
  std::vector<Slot> slots_;  // by input port; guarded by mu_
};

class InputPrefetcher {
 public:
  static constexpr uint64_t kMaxPrefetchBytes = 64ull << 20;
  static constexpr int kWaitSliceMs = 250;  // one waiting fetch; asked again while the task waits

  explicit InputPrefetcher(std::string secret, std::shared_ptr<const tls::Context> tls = nullptr)
      : secret_(std::move(secret)), tls_(std::move(tls)) {}
  ~InputPrefetcher();
  InputPrefetcher(const InputPrefetcher&) = delete;
  InputPrefetcher& operator=(const InputPrefetcher&) = delete;

  /// The attempt a task is chained after, when it runs on another daemon.
  struct After {
    uint32_t vertex = 0, version = 0;
  };

  /// Starts fetching the remote inputs of a task (its Task.inputs, protocol/daemon.proto) on a thread of the pool. `after`: the
  /// remote attempt the task is chained after; its outputs are waited for, and `on_after` is called (from that thread) once they
  /// have all arrived, or with why one cannot be had. `cancel`: the task's flag, which stops the fetches. Returns nullptr, and
  /// calls nothing, when the task has no remote input. The prefetcher must be destroyed by a thread that holds no lock `on_after`
  /// takes.
  std::shared_ptr<PrefetchedInputs> Start(const google::protobuf::RepeatedPtrField<protocol::Input>& inputs,
                                          std::optional<After> after, std::shared_ptr<std::atomic<bool>> cancel,
                                          std::function<void(const Status&)> on_after);

 private:
  void WorkerLoop();
  /// Fetches one output whole into slot `slot` of `into`; waits for it when `from_after`. OK
  /// when it arrived, or exists but is too large to keep.
  Status FetchOne(const std::string& host, uint16_t port, const chan::OutputKey& key, bool from_after,
                  const std::atomic<bool>& cancel, PrefetchedInputs& into, size_t slot) const;

  const std::string secret_;
  const std::shared_ptr<const tls::Context> tls_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::function<void()>> pending_;  // guarded by mu_
  size_t idle_ = 0;                            // threads waiting for work; guarded by mu_
  std::vector<std::thread> threads_;           // guarded by mu_
};

}  // namespace copse::vertex
