// ml.allreduce (the NCCL reducer's program) over an in-process collective, and the shape of the
// `--reducer nccl` graph. The NCCL group itself is tested in tests/channels/nccl (GPU); a
// data-parallel job over it needs one GPU per worker.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "channels/memory_queue.h"
#include "jobmanager/job_loader.h"
#include "ml/graph_gen.h"
#include "ml/programs/allreduce.h"
#include "ml/tensor_message.h"

namespace copse::ml {
namespace {

/// Sums over the threads that call it, in rank order (what every rank gets is identical).
class ThreadCollective {
 public:
  explicit ThreadCollective(int size) : size_(size), posted_(static_cast<size_t>(size)) {}
  class Rank final : public vertex::Collective {
   public:
    Rank(ThreadCollective& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size_; }
    Status AllReduceSum(float* data, size_t count) override { return group_.Sum(rank_, data, count); }

   private:
    ThreadCollective& group_;
    int rank_;
  };

 private:
  Status Sum(int rank, float* data, size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    posted_[static_cast<size_t>(rank)] = data;
    if (++arrived_ == size_) cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_ == size_; });
    std::vector<float> sum(count, 0.0f);
    for (float* p : posted_) {
      for (size_t i = 0; i < count; ++i) sum[i] += p[i];
    }
    if (++summed_ == size_) cv_.notify_all();
    cv_.wait(lock, [&] { return summed_ == size_; });  // nobody writes before all have read
    std::copy(sum.begin(), sum.end(), data);
    return Status::OK();
  }

  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float*> posted_;
  int arrived_ = 0, summed_ = 0;
};

NamedTensors Gradients(float base) {
  Tensor w = Tensor::Empty({2, 3}), b = Tensor::Empty({3});
  for (int i = 0; i < 6; ++i) w.data()[i] = base + 0.1f * static_cast<float>(i);
  for (int i = 0; i < 3; ++i) b.data()[i] = -base * static_cast<float>(i);
  return {{"1.weight", w}, {"1.bias", b}, {"__loss", Tensor::Empty({2})}};
}

std::shared_ptr<chan::MessageLog> LogOf(std::vector<chan::Buffer> messages) {
  auto log = std::make_shared<chan::MessageLog>();
  log->messages = std::move(messages);
  log->closed = true;
  return log;
}

TEST_CASE("AllReduce.EveryWorkerGetsTheSumOfAllWorkersGradients") {
  constexpr int kWorkers = 3;
  ThreadCollective group(kWorkers);
  std::vector<std::shared_ptr<chan::MessageLog>> sums, gang_out(kWorkers);
  std::vector<Status> results(kWorkers);
  std::vector<std::thread> threads;
  const Json params = Json::object();
  for (int w = 0; w < kWorkers; ++w) sums.push_back(std::make_shared<chan::MessageLog>());
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      NamedTensors g = Gradients(static_cast<float>(w + 1));
      g[2].second.data()[0] = 10.0f * static_cast<float>(w), g[2].second.data()[1] = 64;
      chan::MessageLogReader grads(LogOf({TensorMessage(g)}));
      chan::MessageLogReader from_rank0(LogOf({}));  // the gang's nccl channel, drained
      chan::MessageLogWriter out(sums[static_cast<size_t>(w)]);
      gang_out[static_cast<size_t>(w)] = std::make_shared<chan::MessageLog>();
      chan::MessageLogWriter to_others(gang_out[static_cast<size_t>(w)]);
      ThreadCollective::Rank rank(group, w);
      vertex::VertexContext ctx;
      ctx.name = "allreduce" + std::to_string(w) + "[0]";
      ctx.params = &params;
      ctx.inputs.push_back(&grads);
      if (w > 0) ctx.inputs.push_back(&from_rank0);
      ctx.outputs.push_back(&out);
      if (w == 0) ctx.outputs.push_back(&to_others);
      ctx.collective = &rank;
      results[static_cast<size_t>(w)] = programs::MakeAllReduceProgram()->Run(ctx);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) CHECK_MESSAGE(st.ok(), st.ToString());
  CHECK(gang_out[0]->closed);  // rank 0 ends its channels to the others
  std::vector<float> expect_w(6, 0.0f), expect_b(3, 0.0f);
  for (int w = 0; w < kWorkers; ++w) {
    const NamedTensors g = Gradients(static_cast<float>(w + 1));
    for (int i = 0; i < 6; ++i) expect_w[static_cast<size_t>(i)] += g[0].second.data()[i];
    for (int i = 0; i < 3; ++i) expect_b[static_cast<size_t>(i)] += g[1].second.data()[i];
  }
  for (int w = 0; w < kWorkers; ++w) {
    CAPTURE(w);
    const auto& log = *sums[static_cast<size_t>(w)];
    REQUIRE(log.closed);
    REQUIRE(log.messages.size() == 1);
    auto got = ReadTensorMessage(log.messages[0]);
    REQUIRE(got.ok());
    REQUIRE(got->size() == 3);
    CHECK((*got)[0].first == "1.weight");
    CHECK((*got)[0].second.ToVector() == expect_w);
    CHECK((*got)[1].second.ToVector() == expect_b);
    CHECK((*got)[2].second.ToVector() == std::vector<float>{30.0f, 192.0f});  // loss sum, images
  }
}

TEST_CASE("AllReduce.OutsideAnNcclGangIsAClearError") {
  const Json params = Json::object();
  chan::MessageLogReader grads(LogOf({TensorMessage(Gradients(1))}));
  chan::MessageLogWriter out(std::make_shared<chan::MessageLog>());
  vertex::VertexContext ctx;
  ctx.name = "allreduce0[0]";
  ctx.params = &params;
  ctx.inputs.push_back(&grads);
  ctx.outputs.push_back(&out);
  const Status st = programs::MakeAllReduceProgram()->Run(ctx);
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK(st.message().find("--reducer nccl") != std::string::npos);
}

TEST_CASE("AllReduce.TheNcclReducerMakesAGangOfGpuVerticesPerStep") {
  GraphOptions o;
  o.kind = "data-parallel";
  o.workers = 3;
  o.reducer = "nccl";
  o.steps = 2;
  o.limit = 512;
  o.test_limit = 64;
  auto job = GenerateTrainingGraph(o);
  REQUIRE_MESSAGE(job.ok(), job.status().ToString());
  const jm::ProgramCatalog catalog{{"ml.init", "ml.grad", "ml.allreduce", "ml.update", "ml.eval"}, true, nullptr};
  jm::JobLoad load = jm::LoadJobText(job->dump(), "dp3-nccl.json", catalog);
  REQUIRE_MESSAGE(load.ok(), load.status().ToString());
  const jm::JobGraph& g = *load.graph;
  REQUIRE(g.gangs().size() == 2);  // one per step
  for (const auto& gang : g.gangs()) {
    REQUIRE(gang.members.size() == 3);
    for (auto m : gang.members) {
      CHECK(g.stage_of(m).program == "ml.allreduce");
      CHECK(g.stage_of(m).resources.gpus == 1);
    }
  }
  // Every worker steps its own copy: an update per worker, pinned with its gradients.
  for (const auto& st : (*job)["stages"]) {
    if (st["program"] == "ml.update") CHECK(st["affinity"].get<std::string>().rfind("w", 0) == 0);
  }
  o.workers = 1;
  CHECK(!GenerateTrainingGraph(o).ok());
  o.workers = 2;
  o.kind = "pipeline";
  CHECK(!GenerateTrainingGraph(o).ok());
}

}  // namespace
}  // namespace copse::ml
