// `copse plan`'s planner (ml/planner.h) and cost tables (ml/layer_profile.h): the split its
// dynamic program finds and the layout it chooses equal brute force on synthetic tables; its
// replay of a schedule idles as the theory says; memory it cannot fit is named.
#include "ml/planner.h"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include "ml/layer_profile.h"
#include "ml/pipeline_bubble.h"

using namespace copse::ml;

namespace {

/// A table of `n` layers with costs from `seed`: times proportional to the micro-batch size
/// plus a fixed part, so that small micro-batches run less efficiently, as real products do.
CostTable Synthetic(int n, uint64_t seed, const std::vector<int64_t>& sizes = {1, 2, 4, 8, 16, 32, 64, 128}) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.2, 2.0);
  CostTable t;
  t.model = "synthetic";
  t.optimizer_per_parameter = 1e-10;
  t.gradient_sum_per_parameter = 5e-11;
  t.link = {20e-6, 100e-6, 2e9, true};
  for (int i = 0; i < n; ++i) {
    LayerCost l;
    l.name = "layer" + std::to_string(i);
    l.parameters = static_cast<int64_t>(1e5 * unit(rng));
    l.out_bytes_per_sample = static_cast<int64_t>(4096 * unit(rng));
    l.stash_bytes_per_sample = l.out_bytes_per_sample;
    l.defers_weight_gradients = true;
    const double f = unit(rng) * 1e-5, fixed = unit(rng) * 1e-4;
    for (const int64_t b : sizes) {
      LayerTimes x;
      x.forward = fixed + f * static_cast<double>(b);
      x.backward_input = 1.1 * x.forward;
      x.weight_grad = 0.9 * x.forward;
      x.backward = x.backward_input + x.weight_grad;
      x.backward_first = x.weight_grad;
      x.backward_input_first = 0.1 * x.forward;
      l.at[b] = x;
    }
    t.layers.push_back(std::move(l));
  }
  return t;
}

/// Checks that `table` edited by `edit` is refused with an error starting with `field`.
void Refuses(const CostTable& table, const std::function<void(copse::Json&)>& edit, const std::string& field) {
  copse::Json j = ToJson(table);
  edit(j);
  auto r = CostTableFromJson(j);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find(field) == 0);
}

/// A request for a batch of 128 on `daemons` daemons of `slots` slots.
PlanRequest Request(int daemons, int slots) {
  PlanRequest r;
  r.batch = 128;
  r.daemons = daemons;
  r.slots_per_daemon = slots;
  return r;
}

/// `n` equal layers (forward and backward seconds each, no weight-gradient work), with free
/// hand-offs and updates: where the pipeline theory holds exactly.
CostTable EqualLayers(int n, const std::vector<int64_t>& sizes, double forward, double backward) {
  CostTable t = Synthetic(n, 1, sizes);
  for (auto& l : t.layers) {
    l.parameters = 1;
    l.out_bytes_per_sample = 0;
    for (auto& [size, x] : l.at) x = {forward, backward, backward, 0, backward, backward};
  }
  t.optimizer_per_parameter = 0;
  t.link = {0, 0, 1e9, true};
  return t;
}

/// Every split of n layers into `stages` non-empty ranges.
void Splits(int n, int stages, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> split = {0};
  std::function<void(int)> rec = [&](int k) {
    if (k == stages) {
      split.push_back(n);
      visit(split);
      split.pop_back();
      return;
    }
    for (int b = split.back() + 1; b <= n - (stages - k); ++b) {
      split.push_back(b);
      rec(k + 1);
      split.pop_back();
    }
  };
  rec(1);
}

}  // namespace

TEST_CASE("Planner.BestSplitEqualsBruteForceOnItsObjective") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const CostTable t = Synthetic(9, seed);
    for (int stages : {2, 3, 4}) {
      for (int m : {1, 4, 8}) {
        const int64_t mb = 128 / m;
        double brute = INFINITY;
        Splits(9, stages, [&](const std::vector<int>& s) { brute = std::min(brute, SplitObjective(t, s, m, mb)); });
        const std::vector<int> found = BestSplit(t, stages, m, mb);
        REQUIRE(found.size() == static_cast<size_t>(stages) + 1);
        CHECK(found.front() == 0);
        CHECK(found.back() == 9);
        CHECK(SplitObjective(t, found, m, mb) == doctest::Approx(brute).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("Planner.ChoosesTheLayoutBruteForceFindsFastest") {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const CostTable t = Synthetic(7, seed);
    const PlanRequest r = Request(3, 1);
    auto plan = MakePlan(t, r);
    REQUIRE(plan.ok());
    REQUIRE(plan->best == 0);
    // Every layout and every split, replayed.
    double brute = INFINITY;
    std::string brute_layout;
    auto consider = [&](const Layout& l) {
      auto p = Predict(t, l, r);
      REQUIRE(p.ok());
      if (p->fits && p->step_s < brute) brute = p->step_s, brute_layout = l.Describe();
    };
    for (int d : {1, 2}) consider({"data-parallel", d, 1, "", {}});
    for (int stages : {2, 3}) {
      for (int m = 1; m <= 32; m *= 2) {
        for (const char* schedule : {"gpipe", "1f1b"}) {
          Splits(7, stages, [&](const std::vector<int>& s) { consider({"pipeline", stages, m, schedule, s}); });
        }
        // Interleaved: 2 chunks a daemon, micro-batches a multiple of the daemons.
        if (m % stages == 0 && 2 * stages <= 7) {
          Splits(7, 2 * stages, [&](const std::vector<int>& s) { consider({"pipeline", stages, m, "interleaved", s, 2}); });
        }
      }
    }
    const Candidate& chosen = plan->candidates.front();
    CHECK(chosen.prediction.step_s == doctest::Approx(brute).epsilon(1e-12));
    INFO(chosen.layout.Describe(), " vs ", brute_layout);
    // Candidates come fastest first.
    for (size_t i = 1; i < plan->candidates.size(); ++i) {
      CHECK(plan->candidates[i - 1].prediction.step_s <= plan->candidates[i].prediction.step_s);
    }
  }
}

TEST_CASE("Planner.ReplayOfEqualStagesIdlesAsTheTheorySays") {
  // Equal stages, free hand-offs and updates: the bubble is (p-1)/(m+p-1) for GPipe and 1F1B.
  const CostTable t = EqualLayers(4, {16, 128}, 1e-3, 2e-3);
  PlanRequest r;
  r.batch = 128;
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (int stages : {2, 4}) {
      std::vector<int> split;
      for (int s = 0; s <= stages; ++s) split.push_back(s * 4 / stages);
      auto p = Predict(t, {"pipeline", stages, 8, schedule, split}, r);
      REQUIRE(p.ok());
      CHECK(p->bubble == doctest::Approx(TheoreticalBubble(stages, 8)));
      // (m + p - 1) slots of one micro-batch's forward and backward on a stage.
      const double slot = (4 / stages) * 3e-3;
      CHECK(p->step_s == doctest::Approx((8 + stages - 1) * slot));
    }
  }
}

TEST_CASE("Planner.InterleavedReplayIdlesAsTheTheorySays") {
  // V chunks a daemon shrink the bubble to (p-1)/(v*m+p-1) with equal chunks and free hand-offs.
  const CostTable t = EqualLayers(8, {16}, 1e-3, 1e-3);
  PlanRequest r;
  r.batch = 128;
  const Layout l{"pipeline", 2, 8, "interleaved", {0, 2, 4, 6, 8}, 2};
  CHECK(l.Describe() == "pipeline 2 interleaved V=2 M=8 split 0,2,4,6,8");
  auto p = Predict(t, l, r);
  REQUIRE(p.ok());
  CHECK(p->bubble == doctest::Approx(TheoreticalBubble(2, 8, 2)));
  CHECK(p->memory_bytes.size() == 2);
  // Micro-batches must be a multiple of the daemons, and the split have P x V stages.
  CHECK(!Predict(t, {"pipeline", 2, 1, "interleaved", {0, 2, 4, 6, 8}, 2}, r).ok());
  CHECK(!Predict(t, {"pipeline", 2, 8, "interleaved", {0, 4, 8}, 2}, r).ok());
}

TEST_CASE("Planner.NamesTheDaemonThatCannotHoldItsPartAndByHowMuch") {
  CostTable t = Synthetic(4, 3);
  t.layers[3].parameters = 50 << 20;  // 50 Mi parameters: 800 MiB with gradients, copy and momentum
  PlanRequest r = Request(2, 1);
  r.memory_per_daemon = int64_t{600} << 20;
  auto plan = MakePlan(t, r);
  REQUIRE(plan.ok());
  CHECK(plan->best == -1);
  bool named_stage = false;
  for (const auto& c : plan->candidates) {
    CHECK_FALSE(c.prediction.fits);
    if (c.layout.kind == "pipeline") {
      CHECK(c.prediction.why_not.find("stage 1 needs ") == 0);
      CHECK(c.prediction.why_not.find("more than the 600.0 MiB a daemon offers") != std::string::npos);
      named_stage = true;
    }
  }
  CHECK(named_stage);
  // With room for it, the same table plans.
  r.memory_per_daemon = int64_t{4} << 30;
  auto roomy = MakePlan(t, r);
  REQUIRE(roomy.ok());
  CHECK(roomy->best == 0);
}

TEST_CASE("Planner.PrefersASplitThatFits") {
  // Layers 0 and 1 hold 40 MiB each (with gradients, copy and momentum): no stage of 60 MiB
  // holds both, so only the split after layer 0 fits — though layer 0 is nearly free, and the
  // fastest split would put it with layer 1.
  CostTable t = Synthetic(4, 7);
  for (auto& l : t.layers) l.parameters = 1 << 10, l.stash_bytes_per_sample = 0;
  t.layers[0].parameters = t.layers[1].parameters = 40 << 16;
  for (auto& [size, x] : t.layers[0].at) x = {1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6};
  PlanRequest r = Request(2, 1);
  const std::vector<int> fitting = {0, 1, 4};
  auto loose = MakePlan(t, r);
  REQUIRE(loose.ok());
  for (const auto& c : loose->candidates) {
    if (c.layout.kind != "pipeline") continue;
    CHECK(c.layout.split != fitting);  // the fastest pipeline, where memory does not count
    break;
  }
  r.memory_per_daemon = int64_t{60} << 20;
  auto tight = MakePlan(t, r);
  REQUIRE(tight.ok());
  REQUIRE(tight->best == 0);
  for (const auto& c : tight->candidates) {
    if (c.layout.kind != "pipeline") continue;
    CHECK(c.prediction.fits);
    // Interleaved chunks (one layer each here) put layers 0 and 1 on different daemons anyway.
    if (c.layout.schedule != "interleaved") CHECK(c.layout.split == fitting);
  }
}

TEST_CASE("Planner.RefusesWhatItCannotPlan") {
  const CostTable t = Synthetic(4, 1, {128});
  PlanRequest r;
  r.batch = 0;
  CHECK(!MakePlan(t, r).ok());
  r.batch = 96;  // no size measured that a layout of 96 needs
  auto none = MakePlan(t, r);
  CHECK(!none.ok());
  CHECK(none.status().message().find("sizes 128") != std::string::npos);
  r.batch = 128;
  CHECK(!Predict(t, {"pipeline", 2, 1, "1f1b", {0, 5, 4}}, r).ok());
}

TEST_CASE("CostTable.RoundTripsAndNamesTheBadField") {
  const CostTable t = Synthetic(3, 5, {8, 16});
  auto back = CostTableFromJson(ToJson(t));
  REQUIRE(back.ok());
  CHECK(ToJson(*back) == ToJson(t));
  copse::Json bad = ToJson(t);
  bad["layers"][1]["at"]["16"]["forward"] = -1;
  auto e = CostTableFromJson(bad);
  REQUIRE(!e.ok());
  CHECK(e.status().message().find("/layers/1/at/16/forward") == 0);
  bad = ToJson(t);
  bad["layers"][0]["at"]["x"] = bad["layers"][0]["at"]["8"];
  CHECK(CostTableFromJson(bad).status().message().find("/layers/0/at/x") == 0);
  bad = ToJson(t);
  bad["link"]["bytes_per_s"] = 0;
  CHECK(CostTableFromJson(bad).status().message().find("/link/bytes_per_s") == 0);
  CHECK(!CostTableFromJson(copse::Json::array()).ok());
}

TEST_CASE("Planner.CalibrationAddsWhatRealVerticesTookBeyondTheLayers") {
  CostTable t = Synthetic(4, 2);
  PlanRequest r;
  r.batch = 128;
  const Layout pipeline{"pipeline", 2, 4, "1f1b", {0, 2, 4}};
  const auto before = Predict(t, pipeline, r);
  const VertexTimes v = StageVertexTimes(t, 0, 2, 32, 4);
  using K = VertexSample::Kind;
  // Forwards and backwards took 100 us more than their layers (one outlier), updates 1 ms more.
  std::vector<VertexSample> samples = {{K::kStage, v.forward, v.forward + 1e-4, 32},
                                       {K::kStage, v.backward, v.backward + 1e-4, 32},
                                       {K::kStage, v.forward, v.forward + 5e-2, 32},
                                       {K::kStageUpdate, v.update, v.update + 1e-3, 32}};
  REQUIRE(Calibrate(t, samples).ok());
  CHECK(t.calibrated);
  CHECK(t.vertex_overhead == doctest::Approx(1e-4));
  CHECK(t.update_overhead == doctest::Approx(1e-3));
  CHECK(t.gradient_overhead == doctest::Approx(1e-4));  // no data-parallel samples: the pipeline's
  CHECK(t.server_overhead == doctest::Approx(1e-3));
  // The prediction grows by them; StageVertexTimes stays the layers' own.
  const auto after = Predict(t, pipeline, r);
  CHECK(after->step_s > before->step_s + 8 * 1e-4);
  CHECK(StageVertexTimes(t, 0, 2, 32, 4).forward == doctest::Approx(v.forward));
  // Round trip, and a run that timed no update calibrates nothing.
  CHECK(CostTableFromJson(ToJson(t))->server_overhead == doctest::Approx(1e-3));
  CostTable fresh = Synthetic(4, 2);
  CHECK(!Calibrate(fresh, {{K::kStage, 1e-3, 2e-3, 8}}).ok());
  CHECK_FALSE(fresh.calibrated);
}

TEST_CASE("Planner.OnlyTheFirstStageSkipsTheFirstTrainableLayersInputGradient") {
  // Layer 0 has no parameters (a Flatten): the first stage runs no backward for it and no
  // dL/dx for layer 1; a stage starting at layer 1 computes dL/dx through every layer.
  CostTable t = Synthetic(4, 9);
  t.layers[0].parameters = 0;
  const int64_t b = 32;
  auto at = [&](int i) { return t.layers[static_cast<size_t>(i)].at.at(b); };
  const double first = StageVertexTimes(t, 0, 4, b, 4).backward;
  CHECK(first == doctest::Approx(at(1).backward_input_first + at(2).backward_input + at(3).backward_input));
  const double later = StageVertexTimes(t, 1, 4, b, 4).backward;
  CHECK(later == doctest::Approx(at(1).backward_input + at(2).backward_input + at(3).backward_input));
  // A worker's gradient vertex over the whole model: full backwards, the first trainable
  // layer's without dL/dx.
  CHECK(StageVertexTimes(t, 0, 4, b, 1).gradient ==
        doctest::Approx(at(0).forward + at(1).forward + at(2).forward + at(3).forward + at(1).backward_first + at(2).backward +
                        at(3).backward));
  // BestSplit agrees with brute force on such a table too, and has no split it cannot make.
  for (int stages : {2, 3}) {
    double brute = INFINITY;
    Splits(4, stages, [&](const std::vector<int>& s) { brute = std::min(brute, SplitObjective(t, s, 4, b)); });
    CHECK(SplitObjective(t, BestSplit(t, stages, 4, b), 4, b) == doctest::Approx(brute));
  }
  CHECK(BestSplit(t, 5, 4, b).empty());
  CHECK(BestSplit(t, 2, 4, 3).empty());  // size 3 was not measured
}

TEST_CASE("CostTable.RefusesValuesThatWouldBreakThePlanner") {
  const CostTable t = Synthetic(3, 5, {8, 16});
  auto refuses = [&](const std::function<void(copse::Json&)>& edit, const std::string& field) { Refuses(t, edit, field); };
  refuses([](copse::Json& j) { j["link"]["measured"] = "yes"; }, "/link/measured");
  refuses([](copse::Json& j) { j["link"]["bytes_per_s"] = 1e-320; }, "/link/bytes_per_s");
  refuses([](copse::Json& j) { j["link"]["hop"] = 5; }, "/link/hop");
  refuses([](copse::Json& j) { j["layers"][0]["parameters"] = int64_t{1} << 41; }, "/layers/0/parameters");
  refuses([](copse::Json& j) { j["layers"][2]["at"]["8"]["backward"] = "slow"; }, "/layers/2/at/8/backward");
  refuses([](copse::Json& j) { j["threads"] = -1; }, "/threads");
  refuses([](copse::Json& j) { j["calibration"] = {{"vertex_overhead", 1e-4}}; }, "/calibration/update_overhead");
  refuses(
      [](copse::Json& j) {
        for (int i = 0; i < 5000; ++i) j["layers"].push_back(j["layers"][0]);
      },
      "/layers");
  // The planner refuses a table whose times are all zero instead of dividing by them.
  CostTable zero = Synthetic(3, 5, {128});
  for (auto& l : zero.layers)
    for (auto& [size, x] : l.at) x = {};
  zero.optimizer_per_parameter = 0;
  zero.link = {0, 0, 1e9, true};
  PlanRequest r;
  r.batch = 128;
  r.daemons = 1;
  CHECK(!MakePlan(zero, r).ok());
}

TEST_CASE("Planner.WeighsTensorParallelGroupsFromTheirShards") {
  CostTable t = Synthetic(4, 4);
  // Member 0 of 2 does half of each layer's work.
  std::vector<LayerCost> half = t.layers;
  for (auto& l : half) {
    l.parameters /= 2;
    for (auto& [size, x] : l.at) {
      for (double* v : {&x.forward, &x.backward, &x.backward_input, &x.weight_grad, &x.backward_first, &x.backward_input_first})
        *v /= 2;
    }
  }
  t.shards[2] = half;
  PlanRequest r = Request(1, 2);
  auto plan = MakePlan(t, r);
  REQUIRE(plan.ok());
  const Candidate* tp = nullptr;
  for (const auto& c : plan->candidates) {
    if (c.layout.kind == "tensor-parallel") tp = &c;
  }
  REQUIRE(tp != nullptr);
  CHECK(tp->layout.Describe() == "tensor-parallel 2");
  // Half the work of one worker's step, plus the calibrated rest and a gap.
  const double member = *TensorParallelMemberStep(t, 2, 128);
  CHECK(!TensorParallelMemberStep(t, 4, 128).ok());
  CHECK(!TensorParallelMemberStep(t, 2, 3).ok());
  CHECK(tp->prediction.step_s == doctest::Approx(member + t.link.gap));
  CHECK(member < StageVertexTimes(t, 0, 4, 128, 1).gradient);
  // Beyond a daemon's slots, or sharing fewer cores, it is weighed as such.
  r.slots_per_daemon = 1;
  const auto narrow = MakePlan(t, r);
  REQUIRE(narrow.ok());
  for (const auto& c : narrow->candidates) CHECK(c.layout.kind != "tensor-parallel");
  r.slots_per_daemon = 2;
  r.cores = 1;
  CHECK(Predict(t, {"tensor-parallel", 2, 1, "", {}}, r)->step_s == doctest::Approx(2 * member + t.link.gap));
  // Shards travel with the table, and must match its layers.
  auto back = CostTableFromJson(ToJson(t));
  REQUIRE(back.ok());
  CHECK(ToJson(*back) == ToJson(t));
  copse::Json bad = ToJson(t);
  bad["shards"]["2"].erase(0);
  CHECK(CostTableFromJson(bad).status().message().find("/shards/2: 3 layers, where the model has 4") == 0);
  bad = ToJson(t);
  bad["shards"]["1"] = bad["shards"]["2"];
  CHECK(CostTableFromJson(bad).status().message().find("/shards/1") == 0);
}

TEST_CASE("Planner.CalibrationFitsScaleAndOverheadOverTwoMicroBatchSizes") {
  CostTable t = Synthetic(4, 2);
  using K = VertexSample::Kind;
  // Vertices of micro-batches of 8 and 32 took 1.2 x their layers' time + 300 us; a gradient
  // vertex 1.2 x + 1 ms; a tensor-parallel member 1.2 x + 2 ms.
  std::vector<VertexSample> samples = {{K::kStageUpdate, 1e-3, 2e-3, 32},
                                       {K::kGradient, 1e-2, 1.2e-2 + 1e-3, 128},
                                       {K::kTensorParallel, 1e-2, 1.2e-2 + 2e-3, 128}};
  for (int64_t mb : {8, 32}) {
    for (int i = 0; i < 3; ++i) {
      const double predicted = (mb == 8 ? 1e-3 : 4e-3) * (1 + 0.1 * i);
      samples.push_back({K::kStage, predicted, 1.2 * predicted + 3e-4, mb});
    }
  }
  REQUIRE(Calibrate(t, samples).ok());
  CHECK(t.vertex_scale == doctest::Approx(1.2));
  CHECK(t.vertex_overhead == doctest::Approx(3e-4));
  CHECK(t.gradient_overhead == doctest::Approx(1e-3));  // its excess over the scaled prediction
  CHECK(t.tensor_parallel_overhead == doctest::Approx(2e-3));
  CHECK(t.update_overhead == doctest::Approx(1e-3));  // updates are not layer passes: not scaled
  CHECK(CostTableFromJson(ToJson(t))->vertex_scale == doctest::Approx(1.2));
  // Samples of one size (however their predictions spread) cannot tell the scale from the
  // overhead: scale 1 and the median excess.
  std::vector<VertexSample> one_size = {{K::kStageUpdate, 1e-3, 2e-3, 8}};
  for (double predicted : {1e-3, 2e-3, 3e-3, 4e-3}) one_size.push_back({K::kStage, predicted, 1.2 * predicted + 3e-4, 8});
  REQUIRE(Calibrate(t, one_size).ok());
  CHECK(t.vertex_scale == 1);
  CHECK(t.vertex_overhead == doctest::Approx(0.2 * 2.5e-3 + 3e-4));
}

TEST_CASE("Planner.ScaleAndCoresApplyAlikeToEveryKindOfLayout") {
  CostTable t = Synthetic(4, 6);
  PlanRequest r;
  r.batch = 128;
  r.daemons = 2;
  r.slots_per_daemon = 2;
  const Layout dp{"data-parallel", 2, 1, "", {}};
  const Layout pipeline{"pipeline", 2, 2, "1f1b", {0, 2, 4}};
  const double dp_before = Predict(t, dp, r)->step_s, pipe_before = Predict(t, pipeline, r)->step_s;
  const double objective_before = SplitObjective(t, {0, 2, 4}, 2, 64);
  t.vertex_scale = 2;
  CHECK(Predict(t, dp, r)->step_s > dp_before);
  CHECK(Predict(t, pipeline, r)->step_s > pipe_before);
  CHECK(SplitObjective(t, {0, 2, 4}, 2, 64) > objective_before);
  // The stage times BestSplit and the replay use agree: the objective of a split is built from
  // what Stage() gives (forward + backward + two transfers per boundary).
  const VertexTimes raw = StageVertexTimes(t, 0, 2, 64, 1);  // unscaled, as calibration needs
  const VertexTimes raw2 = StageVertexTimes(t, 2, 4, 64, 1);
  const double transfers = 2 * (t.link.hop + static_cast<double>(t.layers[1].out_bytes_per_sample * 64) / t.link.bytes_per_s);
  const double t0 = 2 * (raw.forward + raw.backward) + transfers, t1 = 2 * (raw2.forward + raw2.backward);
  CHECK(SplitObjective(t, {0, 2, 4}, 2, 64) == doctest::Approx(t0 + t1 + std::max(t0, t1)));
  // Two workers on one core share it.
  t.vertex_scale = 1;
  r.cores = 1;
  CHECK(Predict(t, dp, r)->step_s > dp_before);
  // A median over tables takes each shard's times too.
  CostTable a = Synthetic(3, 1, {8}), b = a, c = a;
  a.shards[2] = a.layers, b.shards[2] = b.layers, c.shards[2] = c.layers;
  a.shards[2][0].at[8].forward = 1, b.shards[2][0].at[8].forward = 2, c.shards[2][0].at[8].forward = 30;
  CHECK(MedianTable({a, b, c})->shards[2][0].at[8].forward == 2);
}

TEST_CASE("CostTable.RefusesBadCalibrationsAndShards") {
  CostTable t = Synthetic(3, 5, {8, 16});
  t.calibrated = true;
  t.shards[2] = t.layers;
  auto refuses = [&](const std::function<void(copse::Json&)>& edit, const std::string& field) { Refuses(t, edit, field); };
  refuses([](copse::Json& j) { j["calibration"]["vertex_scale"] = 9; },
          "/calibration/vertex_scale: expected a number from 0.5 to 4");
  refuses([](copse::Json& j) { j["calibration"]["vertex_scale"] = "big"; }, "/calibration/vertex_scale");
  refuses([](copse::Json& j) { j["calibration"]["tensor_parallel_overhead"] = -1; }, "/calibration/tensor_parallel_overhead");
  refuses([](copse::Json& j) { j["shards"]["2"][1]["at"].erase("16"); }, "/shards/2/1/at: no times at 16");
  refuses([](copse::Json& j) { j["shards"]["02"] = j["shards"]["2"]; }, "/shards/02");
  refuses([](copse::Json& j) { j["shards"] = 3; }, "/shards");
  refuses([](copse::Json& j) { j["local_cores"] = -2; }, "/local_cores");
}

TEST_CASE("CostTable.MeasuredOnARealModel") {
  ProfileOptions o;
  o.model = "mlp:784-32-10";
  o.microbatch_sizes = {4, 16};
  o.repeats = 2;
  auto t = ProfileModel(o);
  REQUIRE(t.ok());
  REQUIRE(t->layers.size() == 3);  // Flatten, Linear(784, 32)+ReLU, Linear(32, 10)
  CHECK(t->layers[1].parameters == 784 * 32 + 32);
  CHECK(t->layers[1].out_bytes_per_sample == 32 * 4);
  CHECK(t->MicrobatchSizes() == std::vector<int64_t>{4, 16});
  CHECK(t->layers[1].at[16].forward > 0);
  CHECK(t->layers[1].at[16].weight_grad > 0);
  CHECK(t->optimizer_per_parameter > 0);
  // A gpt model: token windows of its context.
  o.model = "gpt:1-16-2-8";
  auto gpt = ProfileModel(o);
  REQUIRE(gpt.ok());
  CHECK(gpt->layers.size() > 3);
  CHECK(gpt->layers.back().out_bytes_per_sample == 8 * 256 * 4);  // logits [T, 256] per window
  CHECK(gpt->shards.empty());
  o.tensor_parallel = {2};
  gpt = ProfileModel(o);
  REQUIRE(gpt.ok());
  REQUIRE(gpt->shards.count(2));
  CHECK(gpt->shards[2].size() == gpt->layers.size());
  int64_t whole = 0, shard = 0;
  for (size_t i = 0; i < gpt->layers.size(); ++i) whole += gpt->layers[i].parameters, shard += gpt->shards[2][i].parameters;
  CHECK(shard < whole);
  o.model = "mlp:785-10";
  CHECK(!ProfileModel(o).ok());
}
