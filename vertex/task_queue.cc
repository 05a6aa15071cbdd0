#include "vertex/task_queue.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace copse::vertex {
namespace {

bool IsChainedAfter(const TaskQueue::Task& t, const AttemptKey& attempt) {
  return std::find(t.waiting_for.begin(), t.waiting_for.end(), attempt) != t.waiting_for.end();
}

}  // namespace

void TaskQueue::Add(Task t, Reports& withdrawn) {
  if (t.spec.after_size() == 0) {
    queue_.push_back(std::move(t));
    return;
  }
  const uint64_t job = t.spec.job();
  auto withdraw = [&](const std::string& why) {
    withdrawn.push_back(Withdrawn(t.spec, why));
    // Remembered as failed, so that a task chained after this one (sent with it, or later) is
    // withdrawn too rather than held for ever.
    WithdrawChainedAfter({KeyOf(t)}, withdrawn);
  };
  std::optional<InputPrefetcher::After> remote;
  for (const protocol::ChainedAfter& a : t.spec.after()) {
    const uint32_t vertex = a.vertex(), version = a.version();
    if (a.remote()) {
      remote = InputPrefetcher::After{vertex, version};  // at most one (the codec checks)
      continue;
    }
    auto done = finished_.find({job, vertex, version});
    if (done == finished_.end()) {
      t.waiting_for.emplace_back(job, vertex, version);
    } else if (!done->second) {
      return withdraw("the attempt it was chained after failed");
    }
  }
  if (!remote && t.waiting_for.empty()) {
    queue_.push_back(std::move(t));
    return;
  }
  // Its remote inputs are fetched while it waits; with a remote predecessor, their arrival is
  // how this daemon learns that it succeeded (RemoteAfterEnded).
  t.remote_pending = remote.has_value();
  t.prefetched = start_prefetch_(t, remote);
  if (remote && !t.prefetched) return withdraw("none of its inputs is on another daemon");
  held_.push_back(std::move(t));
}

std::optional<TaskQueue::Task> TaskQueue::Next() {
  if (queue_.empty()) return std::nullopt;
  Task t = std::move(queue_.front());
  queue_.pop_front();
  return t;
}

size_t TaskQueue::Ended(const AttemptKey& ended, bool ok, Reports& withdrawn) {
  finished_[ended] = ok;
  if (!ok) {
    WithdrawChainedAfter({ended}, withdrawn);
    return 0;
  }
  size_t queued = 0;
  for (auto it = held_.begin(); it != held_.end();) {
    if (!IsChainedAfter(*it, ended)) {
      ++it;
      continue;
    }
    std::erase(it->waiting_for, ended);
    if (!it->waiting_for.empty() || it->remote_pending) {
      ++it;
      continue;
    }
    queue_.push_front(std::move(*it));  // the job manager chains only what runs next
    ++queued;
    it = held_.erase(it);
  }
  return queued;
}

bool TaskQueue::RemoteAfterEnded(const AttemptKey& task, const Status& st, Reports& withdrawn) {
  auto it = std::find_if(held_.begin(), held_.end(), [&](const Task& t) { return KeyOf(t) == task; });
  if (it == held_.end()) return false;  // cancelled meanwhile
  if (st.ok()) {
    it->remote_pending = false;
    if (!it->waiting_for.empty()) return false;  // still waits for attempts here
    queue_.push_front(std::move(*it));
    held_.erase(it);
    return true;
  }
  it->cancel->store(true);
  withdrawn.push_back(Withdrawn(it->spec, "the outputs of the attempt it was chained after cannot be had: " + st.ToString()));
  held_.erase(it);
  WithdrawChainedAfter({task}, withdrawn);
  return false;
}

void TaskQueue::Cancel(uint64_t job, int64_t vertex, Reports& withdrawn) {
  auto match = [&](const Task& t) { return t.spec.job() == job && (vertex < 0 || int64_t{t.spec.vertex()} == vertex); };
  // Cancelled before they ran: they end here as failed, for what is chained after them.
  std::vector<AttemptKey> ended;
  for (auto& t : held_) {
    if (!match(t)) continue;
    t.cancel->store(true);  // stops its prefetch
    ended.push_back(KeyOf(t));
  }
  for (const auto& t : queue_) {
    if (match(t)) ended.push_back(KeyOf(t));
  }
  std::erase_if(queue_, match);
  std::erase_if(held_, match);
  WithdrawChainedAfter(std::move(ended), withdrawn);
}

void TaskQueue::ForgetJob(uint64_t job) {
  finished_.erase(finished_.lower_bound({job, 0, 0}),
                  job == std::numeric_limits<uint64_t>::max() ? finished_.end() : finished_.lower_bound({job + 1, 0, 0}));
}

void TaskQueue::Clear() {
  queue_.clear();
  for (auto& t : held_) t.cancel->store(true);
  held_.clear();
}

void TaskQueue::WithdrawChainedAfter(std::vector<AttemptKey> ended, Reports& withdrawn) {
  // Each attempt that ended without succeeding takes what is held after it along, down the
  // chain: a task held after a withdrawn one would otherwise wait for ever.
  while (!ended.empty()) {
    const AttemptKey key = ended.back();
    ended.pop_back();
    finished_.emplace(key, false);  // one that ran keeps its report's verdict
    for (auto it = held_.begin(); it != held_.end();) {
      if (!IsChainedAfter(*it, key)) {
        ++it;
        continue;
      }
      it->cancel->store(true);  // stops its prefetch
      withdrawn.push_back(Withdrawn(it->spec, "the attempt it was chained after failed"));
      ended.push_back(KeyOf(*it));
      it = held_.erase(it);
    }
  }
}

protocol::AttemptReport TaskQueue::Withdrawn(const protocol::Task& spec, const std::string& why) {
  protocol::AttemptReport report;
  report.set_job(spec.job());
  report.set_vertex(spec.vertex());
  report.set_version(spec.version());
  report.set_failure(protocol::FAILURE_CANCELLED);
  report.set_error("withdrawn: " + why);
  return report;
}

}  // namespace copse::vertex
