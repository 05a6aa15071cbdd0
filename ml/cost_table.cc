#include "ml/cost_table.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

namespace copse::ml {
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

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

namespace {

Json LayersToJson(const std::vector<LayerCost>& layers) {
  Json out = Json::array();
  for (const LayerCost& l : layers) {
    Json at = Json::object();
    for (const auto& [size, x] : l.at) {
      at[std::to_string(size)] = {{"forward", x.forward},
                                  {"backward", x.backward},
                                  {"backward_input", x.backward_input},
                                  {"weight_grad", x.weight_grad},
                                  {"backward_first", x.backward_first},
                                  {"backward_input_first", x.backward_input_first}};
    }
    out.push_back({{"name", l.name},
                   {"parameters", l.parameters},
                   {"out_bytes_per_sample", l.out_bytes_per_sample},
                   {"stash_bytes_per_sample", l.stash_bytes_per_sample},
                   {"defers_weight_gradients", l.defers_weight_gradients},
                   {"at", std::move(at)}});
  }
  return out;
}

}  // namespace

Json ToJson(const CostTable& t) {
  const Json layers = LayersToJson(t.layers);
  Json out = {
      {"model", t.model},
      {"threads", t.threads},
      {"optimizer", t.optimizer},
      {"optimizer_per_parameter", t.optimizer_per_parameter},
      {"gradient_sum_per_parameter", t.gradient_sum_per_parameter},
      {"layers", std::move(layers)},
      {"link", {{"gap", t.link.gap}, {"hop", t.link.hop}, {"bytes_per_s", t.link.bytes_per_s}, {"measured", t.link.measured}}}};
  if (!t.measured_on.empty()) out["measured_on"] = t.measured_on;
  if (t.local_cores > 0) out["local_cores"] = t.local_cores;
  if (!t.shards.empty()) {
    Json shards = Json::object();
    for (const auto& [ranks, layers] : t.shards) shards[std::to_string(ranks)] = LayersToJson(layers);
    out["shards"] = std::move(shards);
  }
  if (t.calibrated) {
    out["calibration"] = {{"vertex_overhead", t.vertex_overhead},
                          {"update_overhead", t.update_overhead},
                          {"gradient_overhead", t.gradient_overhead},
                          {"server_overhead", t.server_overhead},
                          {"tensor_parallel_overhead", t.tensor_parallel_overhead},
                          {"vertex_scale", t.vertex_scale}};
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

/// The layer list at j[key] (`base` + "/" + key its path).
Result<std::vector<LayerCost>> LayersFromJson(const TableReader& r, const Json& j, const char* key, const std::string& base) {
  const std::string at_key = base + "/" + key;
  if (!j.contains(key) || !j[key].is_array() || j[key].empty() || j[key].size() > kMaxLayers)
    return Status::InvalidArgument(fmt::format("{}: expected an array of 1 to {} layers", at_key, kMaxLayers));
  std::vector<LayerCost> out;
  for (size_t i = 0; i < j[key].size(); ++i) {
    const Json& lj = j[key][i];
    const std::string path = at_key + "/" + std::to_string(i);
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
    out.push_back(std::move(l));
  }
  return out;
}

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
  if (j.contains("local_cores")) {
    COPSE_ASSIGN_OR_RETURN(const int64_t cores, r.Count(j, "local_cores", ""));
    t.local_cores = static_cast<int>(std::min<int64_t>(cores, 1 << 20));
  }
  COPSE_ASSIGN_OR_RETURN(const int64_t threads, r.Count(j, "threads", ""));
  t.threads = static_cast<int>(std::clamp<int64_t>(threads, 1, 1024));
  COPSE_ASSIGN_OR_RETURN(t.optimizer_per_parameter, r.Seconds(j, "optimizer_per_parameter", ""));
  COPSE_ASSIGN_OR_RETURN(t.gradient_sum_per_parameter, r.Seconds(j, "gradient_sum_per_parameter", ""));
  COPSE_ASSIGN_OR_RETURN(t.layers, LayersFromJson(r, j, "layers", ""));
  if (j.contains("shards")) {
    if (!j["shards"].is_object()) return Status::InvalidArgument("/shards: expected an object of group sizes");
    for (const auto& [key, lj] : j["shards"].items()) {
      if (key.size() > 2 || key.find_first_not_of("0123456789") != std::string::npos || key.empty() || key[0] == '0' ||
          std::stoi(key) < 2 || std::stoi(key) > 16)
        return Status::InvalidArgument("/shards/" + key + ": expected a tensor-parallel group size from 2 to 16");
      COPSE_ASSIGN_OR_RETURN(auto layers, LayersFromJson(r, j["shards"], key.c_str(), "/shards"));
      if (layers.size() != t.layers.size())
        return Status::InvalidArgument(
            fmt::format("/shards/{}: {} layers, where the model has {}", key, layers.size(), t.layers.size()));
      // Shards at every size the layers were measured at: a layout weighs both at one size.
      for (size_t i = 0; i < layers.size(); ++i) {
        for (const auto& [size, x] : t.layers[i].at) {
          if (!layers[i].at.count(size))
            return Status::InvalidArgument(
                fmt::format("/shards/{}/{}/at: no times at {}, where layer {} has them", key, i, size, i));
        }
      }
      t.shards[std::stoi(key)] = std::move(layers);
    }
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
    if (cj.contains("vertex_scale")) {
      if (!cj["vertex_scale"].is_number() || !(cj["vertex_scale"].get<double>() >= 0.5) || cj["vertex_scale"].get<double>() > 4)
        return Status::InvalidArgument("/calibration/vertex_scale: expected a number from 0.5 to 4");
      t.vertex_scale = cj["vertex_scale"].get<double>();
    }
    if (cj.contains("tensor_parallel_overhead")) {
      COPSE_ASSIGN_OR_RETURN(t.tensor_parallel_overhead, r.Seconds(cj, "tensor_parallel_overhead", "/calibration"));
    }
    t.calibrated = true;
  }
  if (t.MicrobatchSizes().empty()) return Status::InvalidArgument("/layers: no micro-batch size was measured for every layer");
  return t;
}

namespace {

/// Sets every time of `out` (a layer list of tables[0]) to the median over the tables that have
/// that list (`list` of a table, or null) and that layer's size.
void MedianLayers(const std::vector<CostTable>& tables,
                  const std::function<const std::vector<LayerCost>*(const CostTable&)>& list, std::vector<LayerCost>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    for (auto& [size, x] : out[i].at) {
      auto field = [&, size = size](double LayerTimes::*member) {
        std::vector<double> v;
        for (const CostTable& t : tables) {
          const std::vector<LayerCost>* layers = list(t);
          if (!layers || i >= layers->size()) continue;
          auto it = (*layers)[i].at.find(size);
          if (it != (*layers)[i].at.end()) v.push_back(it->second.*member);
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
}

}  // namespace

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
  MedianLayers(
      tables, [](const CostTable& t) -> const std::vector<LayerCost>* { return &t.layers; }, out.layers);
  for (auto& [ranks, layers] : out.shards) {
    const int r = ranks;
    auto shard = [r](const CostTable& t) -> const std::vector<LayerCost>* {
      auto it = t.shards.find(r);
      return it == t.shards.end() || it->second.size() != t.layers.size() ? nullptr : &it->second;
    };
    MedianLayers(tables, shard, layers);
  }
  return out;
}

}  // namespace copse::ml
