#include "ml/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include <fmt/format.h>

#include "ml/models.h"
#include "ml/optimizer.h"
#include "ml/transformer.h"

namespace copse::ml {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// The median time of `repeats` calls of `body`, after one warm-up call.
Result<double> Time(int repeats, const std::function<Status()>& body) {
  COPSE_RETURN_NOT_OK(body());
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    COPSE_RETURN_NOT_OK(body());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(std::move(times));
}

int64_t StashBytes(const LayerStash& stash) {
  int64_t bytes = 0;
  for (const Tensor& t : stash.tensors) bytes += static_cast<int64_t>(t.bytes());
  return bytes;
}

/// A batch of `b` examples the model takes: images [b, 1, 28, 28], or for a gpt model token ids
/// [b, context] (a letter, repeated: the passes' cost does not depend on which).
Result<Tensor> ModelInput(const std::string& model, int64_t b) {
  if (!IsLanguageModel(model)) return Tensor::Full({b, 1, 28, 28}, 0.5f);
  COPSE_ASSIGN_OR_RETURN(const GptSpec spec, ParseGptSpec(model));
  return Tensor::Full({b, spec.context}, 101.0f);
}

/// Scales the layers' times at micro-batch size `b` so that they add up to the whole model's
/// forward and backward timed as one vertex runs them, layer after layer: a layer timed alone
/// finds its weights and input in the cache, which in a real pass the layers before it evicted.
Status ScaleToWholeModel(const std::string& name, const Sequential& model, int64_t b, int repeats, CostTable& table) {
  COPSE_ASSIGN_OR_RETURN(const Tensor x, ModelInput(name, b));
  Stash stash;
  Tensor y;
  ForwardContext ctx;
  COPSE_ASSIGN_OR_RETURN(const double forward, Time(repeats, [&]() -> Status {
                           stash = Stash();
                           COPSE_ASSIGN_OR_RETURN(y, model.Forward(x, ctx, &stash));
                           return Status::OK();
                         }));
  const Tensor dy = Tensor::Full(y.shape(), 1e-3f);
  COPSE_ASSIGN_OR_RETURN(const double backward, Time(repeats, [&]() -> Status {
                           return model.Backward(dy, stash, /*need_input_grad=*/false, /*accumulate=*/false).status();
                         }));
  double forward_sum = 0, backward_sum = 0;
  bool first = true;  // the first layer with parameters computes no dL/dx, and none before it runs
  for (const LayerCost& l : table.layers) {
    const LayerTimes& t = l.at.at(b);
    forward_sum += t.forward;
    if (l.parameters > 0 || !first) backward_sum += first ? t.backward_first : t.backward;
    if (l.parameters > 0) first = false;
  }
  const double f = forward_sum > 0 ? forward / forward_sum : 1, g = backward_sum > 0 ? backward / backward_sum : 1;
  for (LayerCost& l : table.layers) {
    LayerTimes& t = l.at[b];
    t.forward *= f;
    for (double* v : {&t.backward, &t.backward_input, &t.weight_grad, &t.backward_first, &t.backward_input_first}) *v *= g;
  }
  return Status::OK();
}

}  // namespace

std::vector<int64_t> CostTable::MicrobatchSizes() const {
  std::vector<int64_t> sizes;
  if (layers.empty()) return sizes;
  for (const auto& [size, times] : layers.front().at) {
    const bool everywhere =
        std::all_of(layers.begin(), layers.end(), [size = size](const LayerCost& l) { return l.at.count(size) > 0; });
    if (everywhere) sizes.push_back(size);
  }
  return sizes;
}

int64_t CostTable::Parameters(int begin, int end) const {
  int64_t n = 0;
  for (int i = begin; i < end; ++i) n += layers[static_cast<size_t>(i)].parameters;
  return n;
}

Result<CostTable> ProfileModel(const ProfileOptions& o) {
  if (o.microbatch_sizes.empty()) return Status::InvalidArgument("microbatch_sizes: expected at least one size");
  if (o.repeats < 1) return Status::InvalidArgument("repeats: expected at least 1");
  COPSE_ASSIGN_OR_RETURN(Sequential model, BuildModel(o.model, o.seed));
  CostTable table;
  table.model = o.model;
  table.optimizer = o.optimizer;
  table.layers.resize(model.size());
  for (size_t i = 0; i < model.size(); ++i) {
    Layer& layer = model.layer(i);
    table.layers[i].name = layer.Describe();
    for (const Parameter& p : layer.parameters()) table.layers[i].parameters += p.value.numel();
    table.layers[i].defers_weight_gradients = layer.DefersWeightGradients();
  }
  ForwardContext ctx;
  for (const int64_t b : o.microbatch_sizes) {
    if (b < 1) return Status::InvalidArgument(fmt::format("microbatch_sizes: {} is not a size", b));
    COPSE_ASSIGN_OR_RETURN(Tensor x, ModelInput(o.model, b));
    for (size_t i = 0; i < model.size(); ++i) {
      Layer& layer = model.layer(i);
      LayerCost& cost = table.layers[i];
      LayerTimes& t = cost.at[b];
      LayerStash stash;
      Tensor y;
      COPSE_ASSIGN_OR_RETURN(t.forward, Time(o.repeats, [&]() -> Status {
                               stash = LayerStash();
                               COPSE_ASSIGN_OR_RETURN(y, layer.Forward(x, ctx, &stash));
                               return Status::OK();
                             }));
      cost.out_bytes_per_sample = static_cast<int64_t>(y.bytes()) / b;
      cost.stash_bytes_per_sample = StashBytes(stash) / b;
      const Tensor dy = Tensor::Full(y.shape(), 1e-3f);
      auto backward = [&](bool need_dx) {
        return Time(o.repeats, [&]() -> Status { return layer.Backward(dy, stash, need_dx, /*accumulate=*/false).status(); });
      };
      COPSE_ASSIGN_OR_RETURN(t.backward, backward(true));
      COPSE_ASSIGN_OR_RETURN(t.backward_first, backward(false));
      if (cost.defers_weight_gradients) {
        Tensor wgrad;
        auto backward_input = [&](bool need_dx) {
          return Time(o.repeats, [&]() -> Status { return layer.BackwardInput(dy, stash, need_dx, &wgrad).status(); });
        };
        COPSE_ASSIGN_OR_RETURN(t.backward_input_first, backward_input(false));
        COPSE_ASSIGN_OR_RETURN(t.backward_input, backward_input(true));
        if (cost.parameters > 0) {
          COPSE_ASSIGN_OR_RETURN(t.weight_grad, Time(o.repeats, [&] { return layer.WeightGradients({{&stash, &wgrad}}); }));
        }
      } else {
        // Its backward cannot leave the weight gradients out.
        t.backward_input = t.backward;
        t.backward_input_first = t.backward_first;
      }
      x = y;
    }
    COPSE_RETURN_NOT_OK(ScaleToWholeModel(o.model, model, b, o.repeats, table));
  }
  // One optimizer step over every parameter, per element, as ml.update takes it: SGD out of
  // place (new tensors for the values and the momentum) from one gradient and from two.
  const int64_t parameters = model.NumParameters();
  if (parameters > 0) {
    model.ZeroGrad();
    // Two gradients in separate buffers, as a parameter server's inputs are.
    std::vector<Tensor> second;
    std::vector<std::vector<const float*>> one, two;
    for (Parameter* p : model.Parameters()) {
      second.push_back(Tensor::Full(p->grad.shape(), 1e-3f));
      one.push_back({p->grad.data()});
      two.push_back({p->grad.data(), second.back().data()});
    }
    if (o.optimizer == "adam" || o.optimizer == "adamw") {
      Adam adam(model.Parameters(), AdamOptions());
      COPSE_ASSIGN_OR_RETURN(const double step, Time(o.repeats, [&] {
                               adam.Step();
                               return Status::OK();
                             }));
      table.optimizer_per_parameter = step / static_cast<double>(parameters);
    }
    SgdOptions options;
    options.momentum = 0.9f;
    Sgd sgd(model.Parameters(), options);
    auto sgd_step = [&](const std::vector<std::vector<const float*>>& grads) {
      return Time(o.repeats, [&] {
        sgd.StepOutOfPlace(grads);
        return Status::OK();
      });
    };
    COPSE_ASSIGN_OR_RETURN(const double from_one, sgd_step(one));
    COPSE_ASSIGN_OR_RETURN(const double from_two, sgd_step(two));
    if (table.optimizer_per_parameter == 0) table.optimizer_per_parameter = from_one / static_cast<double>(parameters);
    table.gradient_sum_per_parameter = std::max(0.0, from_two - from_one) / static_cast<double>(parameters);
  }
  return table;
}

Json ToJson(const CostTable& t) {
  Json layers = Json::array();
  for (const LayerCost& l : t.layers) {
    Json at = Json::object();
    for (const auto& [size, x] : l.at) {
      at[std::to_string(size)] = {{"forward", x.forward},
                                  {"backward", x.backward},
                                  {"backward_input", x.backward_input},
                                  {"weight_grad", x.weight_grad},
                                  {"backward_first", x.backward_first},
                                  {"backward_input_first", x.backward_input_first}};
    }
    layers.push_back({{"name", l.name},
                      {"parameters", l.parameters},
                      {"out_bytes_per_sample", l.out_bytes_per_sample},
                      {"stash_bytes_per_sample", l.stash_bytes_per_sample},
                      {"defers_weight_gradients", l.defers_weight_gradients},
                      {"at", std::move(at)}});
  }
  Json out = {
      {"model", t.model},
      {"threads", t.threads},
      {"optimizer", t.optimizer},
      {"optimizer_per_parameter", t.optimizer_per_parameter},
      {"gradient_sum_per_parameter", t.gradient_sum_per_parameter},
      {"layers", std::move(layers)},
      {"link", {{"gap", t.link.gap}, {"hop", t.link.hop}, {"bytes_per_s", t.link.bytes_per_s}, {"measured", t.link.measured}}}};
  if (!t.measured_on.empty()) out["measured_on"] = t.measured_on;
  if (t.calibrated) {
    out["calibration"] = {{"vertex_overhead", t.vertex_overhead},
                          {"update_overhead", t.update_overhead},
                          {"gradient_overhead", t.gradient_overhead},
                          {"server_overhead", t.server_overhead}};
  }
  return out;
}

namespace {

/// Reads the fields of a cost table, each error naming its JSON path.
class TableReader {
 public:
  Status Object(const Json& j, const std::string& path) const {
    return j.is_object() ? Status::OK() : Status::InvalidArgument(path + ": expected an object");
  }
  // Seconds from 0 to `most` (a pass of an hour is no measurement).
  Result<double> Seconds(const Json& j, const char* key, const std::string& path, double most = 3600) const {
    const std::string at = path + "/" + key;
    if (!j.contains(key) || !j[key].is_number()) return Status::InvalidArgument(at + ": expected a number");
    const double v = j[key].get<double>();
    if (!(v >= 0) || v > most) return Status::InvalidArgument(fmt::format("{}: expected 0 to {} seconds, got {}", at, most, v));
    return v;
  }
  // Counts up to 2^40 (parameters, bytes per sample): products of them with a batch stay far
  // inside 64 bits.
  Result<int64_t> Count(const Json& j, const char* key, const std::string& path) const {
    const std::string at = path + "/" + key;
    if (!j.contains(key) || !j[key].is_number_integer()) return Status::InvalidArgument(at + ": expected a whole number");
    const int64_t v = j[key].get<int64_t>();
    if (v < 0 || v > (int64_t{1} << 40)) return Status::InvalidArgument(fmt::format("{}: expected 0 to 2^40, got {}", at, v));
    return v;
  }
};

}  // namespace

Result<CostTable> CostTableFromJson(const Json& j) {
  const TableReader r;
  COPSE_RETURN_NOT_OK(r.Object(j, "cost table"));
  CostTable t;
  if (!j.contains("model") || !j["model"].is_string()) return Status::InvalidArgument("/model: expected a string");
  t.model = j["model"].get<std::string>();
  if (j.contains("optimizer")) {
    if (!j["optimizer"].is_string()) return Status::InvalidArgument("/optimizer: expected a string");
    t.optimizer = j["optimizer"].get<std::string>();
  }
  if (j.contains("measured_on") && j["measured_on"].is_string()) t.measured_on = j["measured_on"].get<std::string>();
  COPSE_ASSIGN_OR_RETURN(const int64_t threads, r.Count(j, "threads", ""));
  t.threads = static_cast<int>(std::clamp<int64_t>(threads, 1, 1024));
  COPSE_ASSIGN_OR_RETURN(t.optimizer_per_parameter, r.Seconds(j, "optimizer_per_parameter", ""));
  COPSE_ASSIGN_OR_RETURN(t.gradient_sum_per_parameter, r.Seconds(j, "gradient_sum_per_parameter", ""));
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty() || j["layers"].size() > kMaxLayers)
    return Status::InvalidArgument(fmt::format("/layers: expected an array of 1 to {} layers", kMaxLayers));
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const Json& lj = j["layers"][i];
    const std::string path = "/layers/" + std::to_string(i);
    COPSE_RETURN_NOT_OK(r.Object(lj, path));
    LayerCost l;
    if (lj.contains("name") && lj["name"].is_string()) l.name = lj["name"].get<std::string>();
    COPSE_ASSIGN_OR_RETURN(l.parameters, r.Count(lj, "parameters", path));
    COPSE_ASSIGN_OR_RETURN(l.out_bytes_per_sample, r.Count(lj, "out_bytes_per_sample", path));
    COPSE_ASSIGN_OR_RETURN(l.stash_bytes_per_sample, r.Count(lj, "stash_bytes_per_sample", path));
    if (!lj.contains("defers_weight_gradients") || !lj["defers_weight_gradients"].is_boolean())
      return Status::InvalidArgument(path + "/defers_weight_gradients: expected true or false");
    l.defers_weight_gradients = lj["defers_weight_gradients"].get<bool>();
    if (!lj.contains("at") || !lj["at"].is_object() || lj["at"].empty())
      return Status::InvalidArgument(path + "/at: expected an object of micro-batch sizes");
    for (const auto& [key, tj] : lj["at"].items()) {
      const std::string at = path + "/at/" + key;
      int64_t size = 0;
      if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos ||
          (size = std::stoll(key)) < 1)
        return Status::InvalidArgument(at + ": expected a micro-batch size from 1 to 999999999");
      COPSE_RETURN_NOT_OK(r.Object(tj, at));
      LayerTimes x;
      COPSE_ASSIGN_OR_RETURN(x.forward, r.Seconds(tj, "forward", at));
      COPSE_ASSIGN_OR_RETURN(x.backward, r.Seconds(tj, "backward", at));
      COPSE_ASSIGN_OR_RETURN(x.backward_input, r.Seconds(tj, "backward_input", at));
      COPSE_ASSIGN_OR_RETURN(x.weight_grad, r.Seconds(tj, "weight_grad", at));
      COPSE_ASSIGN_OR_RETURN(x.backward_first, r.Seconds(tj, "backward_first", at));
      COPSE_ASSIGN_OR_RETURN(x.backward_input_first, r.Seconds(tj, "backward_input_first", at));
      l.at[size] = x;
    }
    t.layers.push_back(std::move(l));
  }
  if (j.contains("link")) {
    const Json& lj = j["link"];
    COPSE_RETURN_NOT_OK(r.Object(lj, "/link"));
    COPSE_ASSIGN_OR_RETURN(t.link.gap, r.Seconds(lj, "gap", "/link", 1));
    COPSE_ASSIGN_OR_RETURN(t.link.hop, r.Seconds(lj, "hop", "/link", 1));
    if (!lj.contains("bytes_per_s") || !lj["bytes_per_s"].is_number() || !(lj["bytes_per_s"].get<double>() >= 1e3) ||
        lj["bytes_per_s"].get<double>() > 1e13)
      return Status::InvalidArgument("/link/bytes_per_s: expected a number from 1e3 to 1e13");
    t.link.bytes_per_s = lj["bytes_per_s"].get<double>();
    if (lj.contains("measured") && !lj["measured"].is_boolean())
      return Status::InvalidArgument("/link/measured: expected true or false");
    t.link.measured = lj.value("measured", false);
  }
  if (j.contains("calibration")) {
    const Json& cj = j["calibration"];
    COPSE_RETURN_NOT_OK(r.Object(cj, "/calibration"));
    COPSE_ASSIGN_OR_RETURN(t.vertex_overhead, r.Seconds(cj, "vertex_overhead", "/calibration"));
    COPSE_ASSIGN_OR_RETURN(t.update_overhead, r.Seconds(cj, "update_overhead", "/calibration"));
    COPSE_ASSIGN_OR_RETURN(t.gradient_overhead, r.Seconds(cj, "gradient_overhead", "/calibration"));
    COPSE_ASSIGN_OR_RETURN(t.server_overhead, r.Seconds(cj, "server_overhead", "/calibration"));
    t.calibrated = true;
  }
  if (t.MicrobatchSizes().empty()) return Status::InvalidArgument("/layers: no micro-batch size was measured for every layer");
  return t;
}

Result<CostTable> MedianTable(const std::vector<CostTable>& tables) {
  if (tables.empty()) return Status::InvalidArgument("no cost table to take the median of");
  CostTable out = tables.front();
  for (const CostTable& t : tables) {
    if (t.model != out.model || t.layers.size() != out.layers.size())
      return Status::InvalidArgument("cost tables of different models: " + out.model + " and " + t.model);
  }
  auto median_of = [&](const std::function<double(const CostTable&)>& field) {
    std::vector<double> v;
    for (const CostTable& t : tables) v.push_back(field(t));
    return Median(std::move(v));
  };
  out.optimizer_per_parameter = median_of([](const CostTable& t) { return t.optimizer_per_parameter; });
  out.gradient_sum_per_parameter = median_of([](const CostTable& t) { return t.gradient_sum_per_parameter; });
  out.measured_on.clear();
  for (size_t i = 0; i < out.layers.size(); ++i) {
    for (auto& [size, x] : out.layers[i].at) {
      auto at = [&, size = size](const CostTable& t) -> const LayerTimes* {
        auto it = t.layers[i].at.find(size);
        return it == t.layers[i].at.end() ? nullptr : &it->second;
      };
      auto field = [&](double LayerTimes::*member) {
        std::vector<double> v;
        for (const CostTable& t : tables) {
          if (const LayerTimes* lt = at(t)) v.push_back(lt->*member);
        }
        return Median(std::move(v));
      };
      x.forward = field(&LayerTimes::forward);
      x.backward = field(&LayerTimes::backward);
      x.backward_input = field(&LayerTimes::backward_input);
      x.weight_grad = field(&LayerTimes::weight_grad);
      x.backward_first = field(&LayerTimes::backward_first);
      x.backward_input_first = field(&LayerTimes::backward_input_first);
    }
  }
  return out;
}

}  // namespace copse::ml
