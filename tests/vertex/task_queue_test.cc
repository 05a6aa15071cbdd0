// The daemon's task queue alone: which tasks are queued, held after the attempts they are
// chained after, released or withdrawn down the chain, with a fake prefetch in place of the
// InputPrefetcher (no daemon, no sockets, no threads).
#include "vertex/task_queue.h"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

namespace copse::vertex {
namespace {

using Task = TaskQueue::Task;

struct After {
  uint32_t vertex, version = 1;
  bool remote = false;
};

Task MakeTask(uint64_t job, uint32_t vertex, std::vector<After> after = {}, uint32_t version = 1) {
  Task t;
  t.spec.set_job(job);
  t.spec.set_vertex(vertex);
  t.spec.set_version(version);
  for (const After& a : after) {
    protocol::ChainedAfter& c = *t.spec.add_after();
    c.set_vertex(a.vertex);
    c.set_version(a.version);
    c.set_remote(a.remote);
  }
  return t;
}

/// Records the prefetches started; a task with a remote predecessor gets a prefetch unless
/// `no_remote_inputs`.
struct FakePrefetch {
  struct Started {
    uint32_t vertex;
    std::optional<InputPrefetcher::After> remote;
  };
  std::vector<Started> started;
  bool no_remote_inputs = false;

  TaskQueue::StartPrefetch Fn() {
    return [this](const Task& t, std::optional<InputPrefetcher::After> remote) -> std::shared_ptr<PrefetchedInputs> {
      started.push_back({t.spec.vertex(), remote});
      if (remote && no_remote_inputs) return nullptr;
      return std::make_shared<PrefetchedInputs>(1);
    };
  }
};

std::vector<uint32_t> Drain(TaskQueue& q) {
  std::vector<uint32_t> out;
  while (auto t = q.Next()) out.push_back(t->spec.vertex());
  return out;
}

std::vector<uint32_t> Vertices(const TaskQueue::Reports& reports) {
  std::vector<uint32_t> out;
  for (const auto& r : reports) {
    CHECK(r.failure() == protocol::FAILURE_CANCELLED);
    CHECK(r.error().rfind("withdrawn: ", 0) == 0);
    out.push_back(r.vertex());
  }
  return out;
}

TEST_CASE("TaskQueue.TasksWithoutPredecessorsRunInTheOrderSent") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  for (uint32_t v : {3, 1, 2}) q.Add(MakeTask(1, v), withdrawn);
  CHECK(q.queued() == 3);
  CHECK(q.held() == 0);
  CHECK(Drain(q) == std::vector<uint32_t>{3, 1, 2});
  CHECK(withdrawn.empty());
  CHECK(prefetch.started.empty());
}

TEST_CASE("TaskQueue.AChainedTaskIsHeldUntilEveryPredecessorSucceededThenRunsNext") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  q.Add(MakeTask(1, 5, {{1}, {2}}), withdrawn);  // after attempts 1.1 and 2.1 here
  q.Add(MakeTask(1, 9), withdrawn);
  CHECK(q.held() == 1);
  CHECK(q.queued() == 1);
  REQUIRE(prefetch.started.size() == 1);  // its remote inputs come while it waits
  CHECK(!prefetch.started[0].remote);
  CHECK(q.Ended({1, 1, 1}, true, withdrawn) == 0);  // still waits for 2
  CHECK(q.held() == 1);
  CHECK(q.Ended({1, 2, 2}, true, withdrawn) == 0);  // another version: not the one it waits for
  CHECK(q.Ended({1, 2, 1}, true, withdrawn) == 1);
  CHECK(q.held() == 0);
  CHECK(Drain(q) == std::vector<uint32_t>{5, 9});  // at the front: the job manager chains what runs next
  CHECK(withdrawn.empty());
}

TEST_CASE("TaskQueue.AChainedTaskArrivingAfterItsPredecessorEndedIsQueuedOrWithdrawnAtOnce") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  CHECK(q.Ended({1, 1, 1}, true, withdrawn) == 0);
  CHECK(q.Ended({1, 2, 1}, false, withdrawn) == 0);
  q.Add(MakeTask(1, 3, {{1}}), withdrawn);
  CHECK(q.queued() == 1);
  CHECK(q.held() == 0);
  q.Add(MakeTask(1, 4, {{2}}), withdrawn);
  CHECK(Vertices(withdrawn) == std::vector<uint32_t>{4});
  CHECK(q.queued() == 1);
  // Withdrawn counts as failed: what comes chained after it is withdrawn too.
  q.Add(MakeTask(1, 6, {{4}}), withdrawn);
  CHECK(Vertices(withdrawn) == std::vector<uint32_t>{4, 6});
  // A job's gc forgets how its attempts ended; another job's stay.
  q.ForgetJob(1);
  q.Add(MakeTask(1, 7, {{1}}), withdrawn);
  CHECK(q.held() == 1);
}

TEST_CASE("TaskQueue.AFailedAttemptWithdrawsWhatIsChainedAfterItDownTheChain") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  q.Add(MakeTask(1, 2, {{1}}), withdrawn);
  q.Add(MakeTask(1, 3, {{2}}), withdrawn);
  q.Add(MakeTask(1, 4, {{3}}), withdrawn);
  q.Add(MakeTask(1, 8, {{7}}), withdrawn);  // another chain: untouched
  CHECK(q.held() == 4);
  CHECK(q.Ended({1, 1, 1}, false, withdrawn) == 0);
  CHECK(Vertices(withdrawn) == std::vector<uint32_t>{2, 3, 4});
  CHECK(q.held() == 1);
  CHECK(q.queued() == 0);
  CHECK(q.Ended({1, 7, 1}, true, withdrawn) == 1);
  CHECK(Drain(q) == std::vector<uint32_t>{8});
}

TEST_CASE("TaskQueue.CancelDropsTheJobsWaitingTasksAndWithdrawsWhatFollowsThem") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  Task held = MakeTask(1, 2, {{1}});
  auto held_flag = held.cancel;
  q.Add(std::move(held), withdrawn);
  q.Add(MakeTask(1, 5), withdrawn);
  q.Add(MakeTask(1, 6, {{5}}), withdrawn);  // after a queued task of the cancelled vertex
  q.Add(MakeTask(2, 5), withdrawn);         // another job's
  q.Add(MakeTask(1, 7), withdrawn);

  SUBCASE("one vertex") {
    q.Cancel(1, 5, withdrawn);
    CHECK(Vertices(withdrawn) == std::vector<uint32_t>{6});
    CHECK(!held_flag->load());
    CHECK(q.held() == 1);
    CHECK(Drain(q) == std::vector<uint32_t>{5, 7});  // job 2's vertex 5, and job 1's 7
  }
  SUBCASE("the whole job") {
    q.Cancel(1, -1, withdrawn);
    // Cancelled tasks are not reported (the job manager cancelled them); only what was chained
    // after them and not cancelled itself would be.
    CHECK(withdrawn.empty());
    CHECK(held_flag->load());  // its prefetch stops
    CHECK(q.held() == 0);
    CHECK(Drain(q) == std::vector<uint32_t>{5});
    CHECK(q.Ended({2, 5, 1}, true, withdrawn) == 0);
  }
}

TEST_CASE("TaskQueue.ATaskAfterARemoteAttemptRunsWhenItsOutputsArriveOrIsWithdrawnWithWhy") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  q.Add(MakeTask(1, 2, {{1, 1, /*remote=*/true}}), withdrawn);
  REQUIRE(prefetch.started.size() == 1);
  REQUIRE(prefetch.started[0].remote.has_value());
  CHECK(prefetch.started[0].remote->vertex == 1);
  CHECK(q.held() == 1);

  SUBCASE("arrived") {
    CHECK(q.RemoteAfterEnded({1, 2, 1}, Status::OK(), withdrawn));
    CHECK(Drain(q) == std::vector<uint32_t>{2});
    CHECK(!q.RemoteAfterEnded({1, 2, 1}, Status::OK(), withdrawn));  // no longer held
  }
  SUBCASE("arrived, but it also waits for an attempt here") {
    q.Add(MakeTask(1, 4, {{1, 1, true}, {3}}), withdrawn);
    CHECK(!q.RemoteAfterEnded({1, 4, 1}, Status::OK(), withdrawn));
    CHECK(q.held() == 2);
    CHECK(q.Ended({1, 3, 1}, true, withdrawn) == 1);
    CHECK(Drain(q) == std::vector<uint32_t>{4});
  }
  SUBCASE("cannot be had") {
    q.Add(MakeTask(1, 3, {{2}}), withdrawn);
    CHECK(!q.RemoteAfterEnded({1, 2, 1}, Status::Unavailable("its daemon is gone"), withdrawn));
    CHECK(Vertices(withdrawn) == std::vector<uint32_t>{2, 3});
    CHECK(withdrawn[0].error().find("its daemon is gone") != std::string::npos);
    CHECK(q.held() == 0);
  }
  SUBCASE("no input from another daemon to learn it by") {
    prefetch.no_remote_inputs = true;
    q.Add(MakeTask(1, 5, {{4, 1, true}}), withdrawn);
    CHECK(Vertices(withdrawn) == std::vector<uint32_t>{5});
    CHECK(withdrawn[0].error().find("none of its inputs is on another daemon") != std::string::npos);
  }
}

TEST_CASE("TaskQueue.ClearDropsEverythingAndStopsHeldPrefetches") {
  FakePrefetch prefetch;
  TaskQueue q(prefetch.Fn());
  TaskQueue::Reports withdrawn;
  Task held = MakeTask(1, 2, {{1}});
  auto flag = held.cancel;
  q.Add(std::move(held), withdrawn);
  q.Add(MakeTask(1, 3), withdrawn);
  q.Clear();
  CHECK(flag->load());
  CHECK(q.queued() == 0);
  CHECK(q.held() == 0);
  CHECK(withdrawn.empty());
}

}  // namespace
}  // namespace copse::vertex
