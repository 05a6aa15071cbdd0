#include "ml/transformer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "ml/ops.h"
#include "ml/philox.h"

namespace copse::ml {
namespace {

constexpr float kInitStd = 0.02f;
constexpr float kLayerNormEps = 1e-5f;

int I(int64_t v) { return static_cast<int>(v); }

Status BadInput(const std::string& layer, const std::string& expected, const Tensor& x) {
  return Status::InvalidArgument(layer + ": expected input " + expected + ", got " +
                                 (x.defined() ? ShapeToString(x.shape()) : "undefined"));
}

/// Adds dW += dz^T x and db += column sums of dz over x [N, in] and dz [N, out]; writes dx =
/// dz W when dx is defined. x and `w` (the weight as the forward multiplied it) are both float32
/// or both bfloat16, and dz is multiplied in their type.
void DenseBackward(const Tensor& x, const Tensor& dz, const Tensor& w, Parameter& weight, Parameter& bias, const Tensor& dx) {
  const Tensor dz_op = dz.Cast(x.dtype());
  MatmulInto(dz_op, x, true, false, 1.0f, weight.grad);
  dz.device()->ColumnSum(dz.data(), I(dz.dim(0)), I(dz.dim(1)), 1.0f, bias.grad.data());
  if (dx.defined()) MatmulInto(dz_op, w, false, false, 0.0f, dx);
}

/// Whether a stashed tensor is what the forward left: defined, of `type`, with `numel` elements
/// (a stash read back from a message is checked so before any kernel reads it).
bool Holds(const Tensor& t, int64_t numel, DType type = DType::kFloat32) {
  return t.defined() && t.dtype() == type && t.numel() == numel;
}

/// Whether `x` is a block's float32 input [B, T, dim].
bool IsBlockInput(const Tensor& x, int dim) {
  return x.defined() && x.dtype() == DType::kFloat32 && x.ndim() == 3 && x.dim(2) == dim;
}

/// The dropout seed of a layer for this forward pass (as DropoutLayer's).
uint64_t DropoutSeed(const ForwardContext& ctx, int index) { return MixSeed(ctx.seed, static_cast<uint64_t>(index), 0xD0D0); }

bool ParsePositive(const std::string& s, int max, int* out) {
  if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoi(s);
  return *out >= 1 && *out <= max;
}

}  // namespace

// ---- spec ------------------------------------------------------------------------------------

bool IsLanguageModel(const std::string& model) { return model.rfind("gpt:", 0) == 0; }

Result<GptSpec> ParseGptSpec(const std::string& model) {
  const std::string usage = "expected gpt:LAYERS-WIDTH-HEADS-CONTEXT[,dropout=P], e.g. gpt:4-128-4-64";
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("model '" + model + "': " + what + " (" + usage + ")");
  };
  if (!IsLanguageModel(model)) return bad("not a gpt model");
  std::string body = model.substr(4), options;
  if (const size_t comma = body.find(','); comma != std::string::npos) {
    options = body.substr(comma + 1);
    body = body.substr(0, comma);
  }
  std::vector<std::string> parts;
  std::stringstream ss(body);
  for (std::string part; std::getline(ss, part, '-');) parts.push_back(part);
  if (parts.size() != 4 || body.back() == '-') return bad("needs four numbers, got '" + body + "'");
  GptSpec spec;
  const char* names[] = {"LAYERS", "WIDTH", "HEADS", "CONTEXT"};
  const int limits[] = {256, 1 << 14, 1 << 10, 1 << 14};
  int* fields[] = {&spec.layers, &spec.dim, &spec.heads, &spec.context};
  for (int i = 0; i < 4; ++i)
    if (!ParsePositive(parts[static_cast<size_t>(i)], limits[i], fields[i]))
      return bad(std::string(names[i]) + " must be an integer in [1, " + std::to_string(limits[i]) + "], got '" +
                 parts[static_cast<size_t>(i)] + "'");
  if (spec.dim % spec.heads != 0)
    return bad("WIDTH " + std::to_string(spec.dim) + " is not a multiple of HEADS " + std::to_string(spec.heads));
  if (!options.empty()) {
    if (options.rfind("dropout=", 0) != 0) return bad("unknown option '" + options + "'");
    const std::string v = options.substr(8);
    char* end = nullptr;
    const float p = std::strtof(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(p >= 0.0f && p < 1.0f))
      return bad("dropout must be a number in [0, 1), got '" + v + "'");
    spec.dropout = p;
  }
  return spec;
}

// ---- TokenEmbedding --------------------------------------------------------------------------

TokenEmbedding::TokenEmbedding(int vocab, int dim, int context) : vocab_(vocab), dim_(dim), context_(context) {
  AddParameter("token", {vocab_, dim_});
  AddParameter("position", {context_, dim_});
}

std::string TokenEmbedding::Describe() const {
  return "TokenEmbedding(" + std::to_string(vocab_) + ", " + std::to_string(dim_) + ", context " + std::to_string(context_) + ")";
}

void TokenEmbedding::InitParameters(uint64_t seed) {
  NormalInit(params_[0].value, seed, 0, kInitStd);
  NormalInit(params_[1].value, seed, 1, kInitStd);
}

Result<Tensor> TokenEmbedding::Forward(const Tensor& ids, const ForwardContext&, LayerStash* stash) {
  if (ids.ndim() != 2 || ids.dim(1) < 1)
    return BadInput(Describe(), "token ids [B, T] with 1 <= T <= " + std::to_string(context_), ids);
  if (ids.dim(1) > context_)
    return Status::InvalidArgument(Describe() + ": a sequence of " + std::to_string(ids.dim(1)) +
                                   " tokens is longer than the model's context of " + std::to_string(context_));
  // Ids index memory: check them all (a [B, T] copy, small next to the forward pass).
  const std::vector<float> host = ids.ToVector();
  for (size_t i = 0; i < host.size(); ++i)
    if (!(host[i] >= 0.0f && host[i] < static_cast<float>(vocab_)) || host[i] != std::floor(host[i]))
      return Status::InvalidArgument(Describe() + ": token id " + std::to_string(host[i]) + " at position " + std::to_string(i) +
                                     " is not an integer in [0, " + std::to_string(vocab_) + ")");
  const int b = I(ids.dim(0)), t = I(ids.dim(1));
  Tensor y = Tensor::Empty({b, t, dim_}, device_);
  device_->EmbeddingForward(ids.data(), static_cast<size_t>(b) * t, params_[0].value.data(), dim_, y.data());
  device_->BiasActivation(y.data(), params_[1].value.data(), b, t * dim_, Activation::kNone, y.data());
  if (stash) stash->tensors = {ids};
  return y;
}

Result<Tensor> TokenEmbedding::Backward(const Tensor& dy, const LayerStash& stash, bool, bool accumulate) {
  if (stash.tensors.size() != 1) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor& ids = stash.tensors[0];
  const int b = I(ids.dim(0)), t = I(ids.dim(1));
  if (dy.numel() != int64_t{b} * t * dim_) return BadInput(Describe() + " backward", ShapeToString({b, t, dim_}), dy);
  if (!accumulate) ZeroGrad();
  device_->EmbeddingBackward(ids.data(), static_cast<size_t>(b) * t, dy.data(), vocab_, dim_, 1.0f, params_[0].grad.data());
  device_->ColumnSum(dy.data(), b, t * dim_, 1.0f, params_[1].grad.data());  // rows t.. of a shorter batch stay
  return Tensor();
}

// ---- tensor-parallel shards ------------------------------------------------------------------

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// How a parameter is split: rows of each of `blocks` equal row blocks (qkv: q, k and v), the
/// columns, or not at all.
enum class Split { kNone, kRows, kColumns };

Split SplitOf(const std::string& name, int* blocks) {
  *blocks = 1;
  if (EndsWith(name, "qkv.weight") || EndsWith(name, "qkv.bias")) return *blocks = 3, Split::kRows;
  if (EndsWith(name, "fc.weight") || EndsWith(name, "fc.bias")) return Split::kRows;
  if (EndsWith(name, "proj.weight")) return Split::kColumns;
  return Split::kNone;
}

/// Copies rows [row0, row0 + rows) x columns [col0, col0 + cols) of host matrix `src` (width
/// src_cols) to `dst` at (dst_row0, dst_col0) (width dst_cols).
void CopyBlock(const float* src, int64_t src_cols, int64_t row0, int64_t col0, int64_t rows, int64_t cols, float* dst,
               int64_t dst_cols, int64_t dst_row0, int64_t dst_col0) {
  for (int64_t r = 0; r < rows; ++r)
    std::copy(src + (row0 + r) * src_cols + col0, src + (row0 + r) * src_cols + col0 + cols,
              dst + (dst_row0 + r) * dst_cols + dst_col0);
}

}  // namespace

Tensor ShardParameter(const std::string& name, const Tensor& full, int rank, int ranks) {
  int blocks = 1;
  const Split split = SplitOf(name, &blocks);
  if (ranks == 1 || split == Split::kNone) return full;
  const Tensor host = full.To(CpuDevice());
  const int64_t rows = full.dim(0), cols = full.ndim() > 1 ? full.dim(1) : 1;
  Shape shape = full.shape();
  Tensor out;
  if (split == Split::kRows) {
    const int64_t block = rows / blocks, part = block / ranks;
    shape[0] = part * blocks;
    out = Tensor::Empty(shape);
    for (int b = 0; b < blocks; ++b)
      CopyBlock(host.data(), cols, b * block + rank * part, 0, part, cols, out.data(), cols, b * part, 0);
  } else {
    const int64_t part = cols / ranks;
    shape[1] = part;
    out = Tensor::Empty(shape);
    CopyBlock(host.data(), cols, 0, rank * part, rows, part, out.data(), part, 0, 0);
  }
  return out.To(full.device());
}

Tensor UnshardParameter(const std::string& name, const std::vector<Tensor>& shards) {
  int blocks = 1;
  const Split split = SplitOf(name, &blocks);
  const int ranks = static_cast<int>(shards.size());
  if (ranks == 1 || split == Split::kNone) return shards.at(0);
  const int64_t rows = shards[0].dim(0), cols = shards[0].ndim() > 1 ? shards[0].dim(1) : 1;
  Shape shape = shards[0].shape();
  Tensor out;
  if (split == Split::kRows) {
    const int64_t part = rows / blocks, block = part * ranks;
    shape[0] = block * blocks;
    out = Tensor::Empty(shape);
    for (int r = 0; r < ranks; ++r) {
      const Tensor host = shards[static_cast<size_t>(r)].To(CpuDevice());
      for (int b = 0; b < blocks; ++b)
        CopyBlock(host.data(), cols, b * part, 0, part, cols, out.data(), cols, b * block + r * part, 0);
    }
  } else {
    shape[1] = cols * ranks;
    out = Tensor::Empty(shape);
    for (int r = 0; r < ranks; ++r) {
      const Tensor host = shards[static_cast<size_t>(r)].To(CpuDevice());
      CopyBlock(host.data(), cols, 0, 0, rows, cols, out.data(), cols * ranks, 0, r * cols);
    }
  }
  return out;
}

bool IsShardedParameter(const std::string& name) {
  int blocks = 1;
  return SplitOf(name, &blocks) != Split::kNone;
}

NamedTensors ShardParameters(const NamedTensors& full, int rank, int ranks) {
  NamedTensors out;
  for (const auto& [name, t] : full) out.emplace_back(name, ShardParameter(name, t, rank, ranks));
  return out;
}

Result<NamedTensors> UnshardParameters(const std::vector<NamedTensors>& shards) {
  if (shards.empty()) return Status::InvalidArgument("no tensor-parallel shards to join");
  NamedTensors out;
  for (size_t i = 0; i < shards[0].size(); ++i) {
    std::vector<Tensor> parts;
    for (size_t r = 0; r < shards.size(); ++r) {
      if (shards[r].size() != shards[0].size() || shards[r][i].first != shards[0][i].first)
        return Status::InvalidArgument("tensor-parallel shard " + std::to_string(r) + " does not hold the parameters of shard 0");
      parts.push_back(shards[r][i].second);
    }
    out.emplace_back(shards[0][i].first, UnshardParameter(shards[0][i].first, parts));
  }
  return out;
}

// ---- ResidualBlock ---------------------------------------------------------------------------

ResidualBlock::ResidualBlock(int dim, int width, int proj_in, const std::string& in, float dropout, float proj_std,
                             TensorShard shard)
    : dim_(dim), width_(width), proj_in_(proj_in), dropout_(dropout), proj_std_(proj_std), shard_(shard) {
  AddParameter("ln.weight", {dim_});
  AddParameter("ln.bias", {dim_});
  AddParameter(in + ".weight", {width_ / shard_.ranks, dim_});
  AddParameter(in + ".bias", {width_ / shard_.ranks});
  AddParameter("proj.weight", {dim_, proj_in_ / shard_.ranks});
  AddParameter("proj.bias", {dim_});
  params_[0].value.Fill(1.0f);
}

void ResidualBlock::InitBlock(uint64_t seed) {
  // Each weight as the whole block's draw (stream 2 and 4 of the layer's seed), then this
  // shard's part of it.
  auto init = [&](Parameter& p, const Shape& full, uint64_t stream, float std) {
    if (shard_.ranks == 1) return NormalInit(p.value, seed, stream, std);
    const Tensor whole = Tensor::Empty(full);
    NormalInit(whole, seed, stream, std);
    p.value.CopyFrom(ShardParameter(p.name, whole, shard_.rank, shard_.ranks));
  };
  params_[0].value.Fill(1.0f);
  params_[1].value.Fill(0.0f);
  init(params_[2], {width_, dim_}, 2, kInitStd);
  params_[3].value.Fill(0.0f);
  init(params_[4], {dim_, proj_in_}, 4, proj_std_);
  params_[5].value.Fill(0.0f);
}

std::string ResidualBlock::ShardSuffix() const {
  return shard_.ranks > 1 ? ", shard " + std::to_string(shard_.rank) + "/" + std::to_string(shard_.ranks) : std::string();
}

Result<Tensor> ResidualBlock::SumOverShards(const Tensor& partial) {
  if (shard_.ranks == 1) return partial;
  if (group_ == nullptr || group_->size() != shard_.ranks || group_->rank() != shard_.rank)
    return Status::FailedPrecondition(Describe() + ": a tensor-parallel shard " + std::to_string(shard_.rank) + " of " +
                                      std::to_string(shard_.ranks) + " needs its group (Sequential::SetTensorParallelGroup)");
  return group_->AllReduceSum(partial);
}

Result<Tensor> ResidualBlock::CloseBranch(const Tensor& partial, const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  COPSE_ASSIGN_OR_RETURN(Tensor y, SumOverShards(partial));
  const int rows = I(x.numel() / dim_);
  device_->BiasActivation(y.data(), params_[5].value.data(), rows, dim_, Activation::kNone, y.data());
  const bool drop = ctx.training && dropout_ > 0.0f;
  const uint64_t seed = drop ? DropoutSeed(ctx, index_) : 0;
  if (drop) device_->Dropout(y.data(), static_cast<size_t>(y.numel()), dropout_, seed, y.data());
  device_->Axpy(1.0f, x.data(), static_cast<size_t>(y.numel()), y.data());
  if (stash) {
    stash->seed = seed;
    stash->shape = drop ? Shape{1} : Shape{};  // shape {1}: a mask was applied
  }
  return y.Reshape(x.shape());
}

Tensor ResidualBlock::BranchGrad(const Tensor& dy, const LayerStash& stash) const {
  return stash.shape.empty() ? dy : Dropout(dy, dropout_, stash.seed);
}

Result<Tensor> ResidualBlock::InputGrad(const Tensor& dh_partial, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dy, bool need_dx) {
  COPSE_ASSIGN_OR_RETURN(Tensor dh, SumOverShards(dh_partial));
  Tensor dx = Tensor::Empty(x.shape(), device_);
  device_->LayerNormBackward(dh.data(), x.data(), params_[0].value.data(), mean.data(), rstd.data(), I(x.numel() / dim_), dim_,
                             dx.data(), params_[0].grad.data(), params_[1].grad.data());
  if (!need_dx) return Tensor();
  device_->Axpy(1.0f, dy.data(), static_cast<size_t>(dx.numel()), dx.data());  // the residual path
  return dx;
}

// ---- AttentionBlock --------------------------------------------------------------------------
// Stash: x, LayerNorm mean and rstd, h = LayerNorm(x) [N, D], qkv [N, 3Dl], the probabilities P
// [B, Hl, T, T], and o [N, Dl] (the local heads' outputs side by side, before the projection);
// in bfloat16, h and o as multiplied (bfloat16), and the copies of qkv.weight and proj.weight in
// LayerStash::weights. The attention's own products (scores, mixing) stay float32. Here
// Hl = H / ranks heads of this shard span Dl = D / ranks columns. Head j of row block b is
// the column block j * D/H of q, k and v within qkv; the per-head products are one BatchedGemm
// each, over (b, j).

AttentionBlock::AttentionBlock(int dim, int heads, float dropout, float proj_std, TensorShard shard)
    : ResidualBlock(dim, 3 * dim, dim, "qkv", dropout, proj_std, shard), heads_(heads) {}

std::string AttentionBlock::Describe() const {
  return "AttentionBlock(" + std::to_string(dim_) + ", heads " + std::to_string(heads_) + ShardSuffix() + ")";
}

Result<Tensor> AttentionBlock::Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  if (x.ndim() != 3 || x.dim(2) != dim_ || x.dim(1) < 1) return BadInput(Describe(), "[B, T, " + std::to_string(dim_) + "]", x);
  Device* d = device_;
  const int b = I(x.dim(0)), t = I(x.dim(1)), n = b * t, dh = dim_ / heads_;
  const int hl = heads_ / shard_.ranks, dl = dim_ / shard_.ranks, d3 = 3 * dl;
  LayerNormResult ln = LayerNorm(x, params_[0].value, params_[1].value, kLayerNormEps);
  const Tensor h = ProductOperand(ln.y.Reshape({n, dim_}), ctx.precision);
  const Tensor w_qkv = ProductWeight(params_[2], ctx), w_proj = ProductWeight(params_[4], ctx);
  const Tensor qkv = LinearForward(h, w_qkv, params_[3].value);

  Tensor p = Tensor::Empty({b, hl, t, t}, d);
  Device::GemmBatch scores{b, hl, int64_t{t} * d3, dh, int64_t{t} * d3, dh, int64_t{hl} * t * t, int64_t{t} * t};
  d->BatchedGemm(false, true, t, t, dh, 1.0f / std::sqrt(static_cast<float>(dh)), qkv.data(), d3, qkv.data() + dl, d3, 0.0f,
                 p.data(), t, scores);
  d->CausalSoftmax(p.data(), b * hl, t, p.data());
  Tensor o = Tensor::Empty({n, dl}, d);
  Device::GemmBatch mix{b, hl, int64_t{hl} * t * t, int64_t{t} * t, int64_t{t} * d3, dh, int64_t{t} * dl, dh};
  d->BatchedGemm(false, false, t, dh, t, 1.0f, p.data(), t, qkv.data() + 2 * dl, d3, 0.0f, o.data(), dl, mix);

  const Tensor o_op = ProductOperand(o, ctx.precision);
  COPSE_ASSIGN_OR_RETURN(Tensor y, CloseBranch(Matmul(o_op, w_proj, false, true), x, ctx, stash));
  if (stash) {
    stash->tensors = {x, ln.mean, ln.rstd, h, qkv, p, o_op};
    stash->weights.clear();
    if (ctx.precision != Precision::kFloat32) stash->weights = {w_qkv, w_proj};
  }
  return y;
}

Result<Tensor> AttentionBlock::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 7) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor &x = stash.tensors[0], &mean = stash.tensors[1], &rstd = stash.tensors[2], &h = stash.tensors[3],
               &qkv = stash.tensors[4], &p = stash.tensors[5], &o = stash.tensors[6];
  if (!IsBlockInput(x, dim_)) return Status::FailedPrecondition(Describe() + ": a stash that does not fit this block");
  {
    const int64_t rows = x.dim(0) * x.dim(1), seq = x.dim(1), heads = heads_ / shard_.ranks, local = dim_ / shard_.ranks;
    if (!Holds(mean, rows) || !Holds(rstd, rows) || !Holds(h, rows * dim_, h.dtype()) || !Holds(qkv, rows * 3 * local) ||
        !Holds(p, x.dim(0) * heads * seq * seq) || !Holds(o, rows * local, h.dtype()))
      return Status::FailedPrecondition(Describe() + ": a stash that does not fit this block");
  }
  const DType type = h.dtype();
  const Tensor w_qkv = BackwardWeight(stash, 0, params_[2], type), w_proj = BackwardWeight(stash, 1, params_[4], type);
  if (dy.numel() != x.numel()) return BadInput(Describe() + " backward", ShapeToString(x.shape()), dy);
  Device* d = device_;
  const int b = I(x.dim(0)), t = I(x.dim(1)), n = b * t, dh = dim_ / heads_;
  const int hl = heads_ / shard_.ranks, dl = dim_ / shard_.ranks, d3 = 3 * dl;
  if (!accumulate) ZeroGrad();

  const Tensor dz = BranchGrad(dy, stash);
  Tensor dout = Tensor::Empty({n, dl}, d);
  DenseBackward(o, dz.Reshape({n, dim_}), w_proj, params_[4], params_[5], dout);

  // dP = dO V^T, dV = P^T dO, dS = softmax'(dP), dQ = s dS K, dK = s dS^T Q.
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  Tensor dp = Tensor::Empty({b, hl, t, t}, d);
  Tensor dqkv = Tensor::Empty({n, d3}, d);
  const int64_t per_p = int64_t{hl} * t * t, blk = int64_t{t} * t, row3 = int64_t{t} * d3, row1 = int64_t{t} * dl;
  d->BatchedGemm(false, true, t, t, dh, 1.0f, dout.data(), dl, qkv.data() + 2 * dl, d3, 0.0f, dp.data(), t,
                 {b, hl, row1, dh, row3, dh, per_p, blk});
  d->BatchedGemm(true, false, t, dh, t, 1.0f, p.data(), t, dout.data(), dl, 0.0f, dqkv.data() + 2 * dl, d3,
                 {b, hl, per_p, blk, row1, dh, row3, dh});
  d->CausalSoftmaxBackward(p.data(), dp.data(), b * hl, t, dp.data());
  d->BatchedGemm(false, false, t, dh, t, scale, dp.data(), t, qkv.data() + dl, d3, 0.0f, dqkv.data(), d3,
                 {b, hl, per_p, blk, row3, dh, row3, dh});
  d->BatchedGemm(true, false, t, dh, t, scale, dp.data(), t, qkv.data(), d3, 0.0f, dqkv.data() + dl, d3,
                 {b, hl, per_p, blk, row3, dh, row3, dh});

  Tensor dh_part = Tensor::Empty({n, dim_}, d);
  DenseBackward(h, dqkv, w_qkv, params_[2], params_[3], dh_part);
  return InputGrad(dh_part, x, mean, rstd, dy, need_dx);
}

// ---- MlpBlock --------------------------------------------------------------------------------
// Stash: x, LayerNorm mean and rstd, h = LayerNorm(x) [N, D], z = Fc(h) [N, 4D/R] and
// a = GELU(z); in bfloat16, h and a as multiplied (bfloat16), and the copies of fc.weight and
// proj.weight in LayerStash::weights.

MlpBlock::MlpBlock(int dim, float dropout, float proj_std, TensorShard shard)
    : ResidualBlock(dim, 4 * dim, 4 * dim, "fc", dropout, proj_std, shard) {}

std::string MlpBlock::Describe() const {
  return "MlpBlock(" + std::to_string(dim_) + ", " + std::to_string(width_) + ShardSuffix() + ")";
}

Result<Tensor> MlpBlock::Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) {
  if (x.ndim() != 3 || x.dim(2) != dim_) return BadInput(Describe(), "[B, T, " + std::to_string(dim_) + "]", x);
  const int n = I(x.dim(0) * x.dim(1));
  LayerNormResult ln = LayerNorm(x, params_[0].value, params_[1].value, kLayerNormEps);
  const Tensor h = ProductOperand(ln.y.Reshape({n, dim_}), ctx.precision);
  const Tensor w_fc = ProductWeight(params_[2], ctx), w_proj = ProductWeight(params_[4], ctx);
  const Tensor z = LinearForward(h, w_fc, params_[3].value);
  const Tensor a = ProductOperand(Gelu(z), ctx.precision);
  COPSE_ASSIGN_OR_RETURN(Tensor y, CloseBranch(Matmul(a, w_proj, false, true), x, ctx, stash));
  if (stash) {
    stash->tensors = {x, ln.mean, ln.rstd, h, z, a};
    stash->weights.clear();
    if (ctx.precision != Precision::kFloat32) stash->weights = {w_fc, w_proj};
  }
  return y;
}

Result<Tensor> MlpBlock::Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate) {
  if (stash.tensors.size() != 6) return Status::FailedPrecondition(Describe() + ": empty stash");
  const Tensor &x = stash.tensors[0], &mean = stash.tensors[1], &rstd = stash.tensors[2], &h = stash.tensors[3],
               &z = stash.tensors[4], &a = stash.tensors[5];
  if (!IsBlockInput(x, dim_)) return Status::FailedPrecondition(Describe() + ": a stash that does not fit this block");
  {
    const int64_t rows = x.dim(0) * x.dim(1), wide = proj_in_ / shard_.ranks;
    if (!Holds(mean, rows) || !Holds(rstd, rows) || !Holds(h, rows * dim_, h.dtype()) || !Holds(z, rows * wide) ||
        !Holds(a, rows * wide, h.dtype()))
      return Status::FailedPrecondition(Describe() + ": a stash that does not fit this block");
  }
  const DType type = h.dtype();
  const Tensor w_fc = BackwardWeight(stash, 0, params_[2], type), w_proj = BackwardWeight(stash, 1, params_[4], type);
  if (dy.numel() != x.numel()) return BadInput(Describe() + " backward", ShapeToString(x.shape()), dy);
  Device* d = device_;
  const int n = I(x.dim(0) * x.dim(1)), wide = proj_in_ / shard_.ranks;
  if (!accumulate) ZeroGrad();
  const Tensor dz2 = BranchGrad(dy, stash);
  Tensor da = Tensor::Empty({n, wide}, d);
  DenseBackward(a, dz2.Reshape({n, dim_}), w_proj, params_[4], params_[5], da);
  d->ActivationBackward(Activation::kGelu, z.data(), da.data(), static_cast<size_t>(da.numel()), da.data());
  Tensor dh_part = Tensor::Empty({n, dim_}, d);
  DenseBackward(h, da, w_fc, params_[2], params_[3], dh_part);
  return InputGrad(dh_part, x, mean, rstd, dy, need_dx);
}

}  // namespace copse::ml
