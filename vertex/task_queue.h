#pragma once
// TaskQueue: the tasks a daemon was sent and has not started yet — queued ones, which workers
// take in order, and chained ones (Task.after, see Scheduler::TryChain), held until the
// attempts they run after have ended: each on this daemon, or at most one on another daemon,
// whose outputs arriving here (the InputPrefetcher's fetch) tells that it succeeded.
//
// A held task is queued, at the front, when everything it waits for has succeeded; it is
// withdrawn — never run, reported failed with class `cancelled`, uncharged, so the job
// manager places it again — when one of them failed, was cancelled or withdrawn, down the
// chain. How each attempt here ended is remembered for chained tasks that arrive after it
// (until the job's gc).
//
// Not thread-safe and starts nothing: the daemon calls it under its lock, wakes its workers
// for what was queued, and sends the withdrawn reports each call appends to `withdrawn` (after
// any report it already holds: a chained task's report never overtakes its predecessor's).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "protocol/daemon.pb.h"
#include "vertex/attempt_executor.h"
#include "vertex/input_prefetcher.h"

namespace copse::vertex {

/// One attempt: job, vertex, version.
using AttemptKey = std::tuple<uint64_t, uint32_t, uint32_t>;

class TaskQueue {
 public:
  struct Task : AttemptTask {
    // Held (chained): the attempts here it still waits for, and whether it still waits for the
    // outputs of one on another daemon. Queued when neither is left.
    std::vector<AttemptKey> waiting_for;
    bool remote_pending = false;
  };
  using Reports = std::vector<protocol::AttemptReport>;

  /// Starts fetching a held task's remote inputs while it waits (InputPrefetcher::Start):
  /// `remote`, when set, is the attempt on another daemon it is chained after, whose arrival
  /// the daemon passes on to RemoteAfterEnded. Returns nullptr when the task has no remote
  /// input.
  using StartPrefetch =
      std::function<std::shared_ptr<PrefetchedInputs>(const Task& task, std::optional<InputPrefetcher::After> remote)>;

  explicit TaskQueue(StartPrefetch start_prefetch) : start_prefetch_(std::move(start_prefetch)) {}

  /// A task the job manager sent: queued at the back, held, or withdrawn when it is chained
  /// after an attempt that failed here, or after a remote one but has no remote input.
  void Add(Task task, Reports& withdrawn);

  /// The first queued task, nullopt when none is.
  std::optional<Task> Next();

  /// Attempt `attempt` ran here and ended (`ok`: it succeeded). The tasks chained after it that
  /// wait for nothing else now are queued at the front; when it failed, they are withdrawn,
  /// down the chain. Returns how many were queued.
  size_t Ended(const AttemptKey& attempt, bool ok, Reports& withdrawn);

  /// The outputs of the remote attempt held task `task` runs after have arrived here (`st` OK),
  /// or cannot be had: the task is queued at the front when it waits for nothing else, or
  /// withdrawn with the reason, down the chain. Returns whether it was queued (false also when
  /// it is no longer held: cancelled meanwhile).
  bool RemoteAfterEnded(const AttemptKey& task, const Status& st, Reports& withdrawn);

  /// Cancels the job's tasks that have not started (`vertex` < 0: all of them; else that
  /// vertex's): dropped, their prefetches stopped, and what is chained after them withdrawn.
  void Cancel(uint64_t job, int64_t vertex, Reports& withdrawn);

  /// Forgets how the job's attempts ended (its gc; the job id's maximum: every job).
  void ForgetJob(uint64_t job);

  /// Drops every task, stopping held tasks' prefetches (the daemon stops or re-registers).
  void Clear();

  size_t queued() const { return queue_.size(); }
  size_t held() const { return held_.size(); }

 private:
  static AttemptKey KeyOf(const Task& t) { return {t.spec.job(), t.spec.vertex(), t.spec.version()}; }
  static protocol::AttemptReport Withdrawn(const protocol::Task& spec, const std::string& why);
  void WithdrawChainedAfter(std::vector<AttemptKey> ended, Reports& withdrawn);

  StartPrefetch start_prefetch_;
  std::deque<Task> queue_;
  std::vector<Task> held_;
  std::map<AttemptKey, bool> finished_;  // how each attempt here ended (true: succeeded)
};

}  // namespace copse::vertex
