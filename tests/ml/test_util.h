#pragma once
// Helpers shared by the ml test suites: random tensors, closeness checks, the PyTorch reference
// file reader and finite-difference gradient checks of layers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ml/layers.h"
#include "ml/philox.h"
#include "ml/tensor.h"

namespace copse::ml::testing {

inline Tensor RandomTensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f, Device* device = CpuDevice()) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * PhiloxUniform(seed, 77, i);
  return Tensor::FromVector(shape, v, device);
}

/// max|a-b| / max(max|b|, floor): the relative error of a whole tensor.
inline double RelativeError(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-6) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

inline double RelativeError(const Tensor& a, const Tensor& b) {
  CHECK(a.shape() == b.shape());
  return RelativeError(a.ToVector(), b.ToVector());
}

/// The values of a parameter to compare after Adam steps: all of them, except the key third of
/// an attention block's "qkv.bias". That bias's gradient is exactly 0 in exact arithmetic
/// (adding a constant to every key shifts a query's scores uniformly, which the softmax
/// ignores), so two implementations hold different rounding noise of ~1e-9 there, which Adam's
/// g / (sqrt(v) + eps) turns into steps of +-lr either way. It never affects the output.
inline std::vector<float> ComparableAfterAdam(const std::string& name, const Tensor& value) {
  std::vector<float> v = value.ToVector();
  if (name.size() >= 8 && name.compare(name.size() - 8, 8, "qkv.bias") == 0) {
    const auto d = static_cast<ptrdiff_t>(v.size() / 3);
    v.erase(v.begin() + d, v.begin() + 2 * d);
  }
  return v;
}

/// Tensors of tests/data/ml/torch_reference.bin (written by scripts/torch_reference.py).
inline std::map<std::string, Tensor> LoadReference(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string b = ss.str();
  REQUIRE(b.size() > 12);
  REQUIRE(b.compare(0, 8, "CPSREF01") == 0);
  size_t pos = 8;
  auto get = [&](void* dst, size_t n) {
    REQUIRE(pos + n <= b.size());
    std::memcpy(dst, b.data() + pos, n);
    pos += n;
  };
  uint32_t count;
  get(&count, 4);
  std::map<std::string, Tensor> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len, ndim;
    get(&len, 4);
    std::string name(len, '\0');
    get(name.data(), len);
    get(&ndim, 4);
    Shape shape(ndim);
    for (auto& d : shape) get(&d, 8);
    std::vector<float> v(static_cast<size_t>(NumElements(shape)));
    get(v.data(), v.size() * 4);
    out[name] = Tensor::FromVector(shape, v);
  }
  return out;
}

inline std::string ReferencePath() { return std::string(COPSE_SOURCE_DIR) + "/tests/data/ml/torch_reference.bin"; }

/// Checks Layer::Backward against central finite differences of L = sum(y * r) for random r,
/// on up to `samples` coordinates of the input and of every parameter.
inline void GradCheck(Layer& layer, const Tensor& x, uint64_t seed = 1, int samples = 24, double eps = 1e-3, double rtol = 2e-2,
                      double atol = 2e-3) {
  ForwardContext ctx;
  ctx.seed = 42;
  LayerStash stash;
  auto y = layer.Forward(x, ctx, &stash);
  REQUIRE(y.ok());
  const Tensor r = RandomTensor(y->shape(), seed + 1000);
  const std::vector<float> rv = r.ToVector();
  layer.ZeroGrad();
  auto dx = layer.Backward(r, stash, true);
  REQUIRE(dx.ok());
  auto loss = [&]() {
    LayerStash s;
    auto out = layer.Forward(x, ctx, &s);
    REQUIRE(out.ok());
    const std::vector<float> v = out->ToVector();
    double sum = 0;
    for (size_t i = 0; i < v.size(); ++i) sum += static_cast<double>(v[i]) * rv[i];
    return sum;
  };
  auto check = [&](const Tensor& target, const Tensor& analytic, const std::string& what) {
    const std::vector<float> ana = analytic.ToVector();
    std::vector<float> host = target.ToVector();
    PhiloxStream pick(seed, 5);
    const size_t n = host.size();
    for (int s = 0; s < samples && n > 0; ++s) {
      const size_t i = s < static_cast<int>(n) && n <= static_cast<size_t>(samples) ? static_cast<size_t>(s)
                                                                                    : static_cast<size_t>(pick.NextBelow(n));
      const float orig = host[i];
      host[i] = orig + static_cast<float>(eps);
      target.device()->CopyFromHost(target.data(), host.data(), n * 4);
      const double up = loss();
      host[i] = orig - static_cast<float>(eps);
      target.device()->CopyFromHost(target.data(), host.data(), n * 4);
      const double down = loss();
      host[i] = orig;
      target.device()->CopyFromHost(target.data(), host.data(), n * 4);
      const double numeric = (up - down) / (2 * eps);
      INFO(layer.Describe() << " d/d" << what << "[" << i << "]: numeric " << numeric << " analytic " << ana[i]);
      CHECK(std::abs(numeric - ana[i]) <= atol + rtol * std::abs(numeric));
    }
  };
  if (dx->defined()) check(x, *dx, "x");  // token ids have no gradient
  for (Parameter& p : layer.parameters()) check(p.value, p.grad, p.name);
}

}  // namespace copse::ml::testing
