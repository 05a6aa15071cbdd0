#pragma once
// The layers of a decoder-only transformer (GPT-2's pre-LayerNorm block), with explicit backward
// passes like every layer of ml/layers.h, and the model spec that names one. A GPT model is a
// Sequential (models.h builds it from "gpt:L-D-H-C"):
//
//   TokenEmbedding -> Dropout -> (AttentionBlock -> MlpBlock) x L -> LayerNorm -> Linear(D, V)
//
// Each block is a residual layer, y = x + f(LayerNorm(x)), so every block boundary is a place a
// pipeline stage can end: the residual stream [B, T, D] is the only tensor that crosses it.
// Inputs are token ids [B, T] held as floats (exact integers); the head's logits are [B, T, V].
//
// Initialization follows GPT-2 (and nanoGPT): embeddings and projection weights N(0, 0.02), the
// projections that end a residual branch N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm 1 and 0,
// each drawn from the Philox stream of (seed, global layer index) as every layer's parameters.
// Dropout (when the spec asks for it) applies to the embeddings' sum and to each residual
// branch, its mask a function of (step seed, layer index, element) only.
// Thread-safety: as Layer.
#include <cstdint>
#include <string>
#include <vector>

#include "ml/layers.h"

namespace copse::ml {

/// What "gpt:L-D-H-C[,dropout=P]" names: L blocks of width D with H heads over a context of C
/// tokens, byte-level (vocab 256).
struct GptSpec {
  int layers = 0;
  int dim = 0;
  int heads = 0;
  int context = 0;
  float dropout = 0.0f;
  int vocab = 256;
};

/// Tensor parallelism (Megatron-LM's): each of `ranks` members holds a shard of every block —
/// the attention's heads [rank * H/ranks, (rank + 1) * H/ranks) (their rows of qkv, their
/// columns of proj) and a slice of the MLP's 4D hidden units (rows of fc, columns of proj) —
/// and everything else whole. A block's two products that end in a sum over the shards (the
/// output projection forward, the input projection's dL/dx backward) give each member a
/// partial [B, T, D] that the group adds up; so each block costs one all-reduce forward and one
/// backward. Every member computes the replicated parts on the same inputs, so their gradients
/// and updates agree bit for bit without exchanging them.
struct TensorShard {
  int rank = 0;
  int ranks = 1;
};

/// The members of one tensor-parallel group, as a layer sees them.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The sum of every member's `partial` (same shape everywhere), added in rank order so that
  /// every member gets the same bits; every member must call it, in the same order.
  virtual Result<Tensor> AllReduceSum(const Tensor& partial) = 0;
};

/// The shard of full parameter `name` ("<index>.qkv.weight", ...) that member `rank` of `ranks`
/// holds (the whole tensor when the parameter is replicated), and back: the full tensor from
/// every member's shard, in rank order.
Tensor ShardParameter(const std::string& name, const Tensor& full, int rank, int ranks);
Tensor UnshardParameter(const std::string& name, const std::vector<Tensor>& shards);
NamedTensors ShardParameters(const NamedTensors& full, int rank, int ranks);
/// Whether parameter `name` is split over a tensor-parallel group (else every member holds it
/// whole).
bool IsShardedParameter(const std::string& name);
/// `shards[r]` is member r's parameter set (same names in the same order).
Result<NamedTensors> UnshardParameters(const std::vector<NamedTensors>& shards);

/// Whether `model` names a language model ("gpt:...").
bool IsLanguageModel(const std::string& model);

/// Parses and checks a spec; the error names the part that is wrong.
Result<GptSpec> ParseGptSpec(const std::string& model);

/// Token and learned position embeddings: ids [B, T] (T <= context) -> [B, T, D].
/// Parameters "token" [vocab, D] and "position" [context, D].
class TokenEmbedding final : public Layer {
 public:
  TokenEmbedding(int vocab, int dim, int context);
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& ids, const ForwardContext& ctx, LayerStash* stash) override;
  /// Never returns dL/dids (token ids have no gradient).
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override;

 private:
  int vocab_, dim_, context_;
};

/// What the two kinds of block share: y = x + Dropout(Proj(f(Fc(LayerNorm(x))))) with
/// parameters "ln.weight", "ln.bias", "<in>.weight" [width, D], "<in>.bias", "proj.weight"
/// [D, width], "proj.bias" — the input projection column-parallel and the output projection
/// row-parallel over a shard's members, its bias added once after their sum.
class ResidualBlock : public Layer {
 public:
  void SetTensorParallelGroup(TensorParallelGroup* group) override { group_ = group; }

 protected:
  /// `in` names the input projection and `width` is its full output width (3D, 4D); `proj_in`
  /// is the output projection's full input width (D: the heads' outputs; 4D: the hidden units).
  ResidualBlock(int dim, int width, int proj_in, const std::string& in, float dropout, float proj_std, TensorShard shard);
  /// LayerNorm 1 and 0, zero biases, the projections' weights N(0, 0.02) and N(0, proj_std):
  /// a shard gets its part of the whole block's draws.
  void InitBlock(uint64_t seed);
  /// " shard r/R" for Describe, or nothing.
  std::string ShardSuffix() const;
  /// The branch's end: the members' partial output projections summed, proj.bias, dropout (in
  /// training), then x added. Records in `stash` whether a mask was applied.
  Result<Tensor> CloseBranch(const Tensor& partial, const Tensor& x, const ForwardContext& ctx, LayerStash* stash);
  /// dL/d(branch output) from dL/dy: dropout's backward.
  Tensor BranchGrad(const Tensor& dy, const LayerStash& stash) const;
  /// dL/dx from the members' partial dL/d(LayerNorm output): summed, through the LayerNorm
  /// (adding its parameters' gradients), plus the residual path's dy. Undefined if !need_dx.
  Result<Tensor> InputGrad(const Tensor& dh_partial, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                           bool need_dx);
  /// The group's sum of `partial`, or `partial` without tensor parallelism.
  Result<Tensor> SumOverShards(const Tensor& partial);

  int dim_, width_, proj_in_;  // full widths; this shard holds width_ / ranks and proj_in_ / ranks of them
  float dropout_, proj_std_;
  TensorShard shard_;
  TensorParallelGroup* group_ = nullptr;
};

/// y = x + Dropout(Proj(CausalSelfAttention(LayerNorm(x)))) over x [B, T, D], with H heads of
/// D / H: scores scaled by 1 / sqrt(D / H), masked so that position t attends to 0..t.
/// The input projection is "qkv" [3D, D]. With a shard of R ranks: the block's H/R heads,
/// "qkv.weight" [3D/R, D], "proj.weight" [D, D/R].
class AttentionBlock final : public ResidualBlock {
 public:
  AttentionBlock(int dim, int heads, float dropout, float proj_std, TensorShard shard = {});
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override { InitBlock(seed); }

 private:
  int heads_;
};

/// y = x + Dropout(Proj(GELU(Fc(LayerNorm(x))))) over x [B, T, D], Fc widening to 4D ("fc").
/// With a shard of R ranks: "fc.weight" [4D/R, D], "fc.bias" [4D/R], "proj.weight" [D, 4D/R].
class MlpBlock final : public ResidualBlock {
 public:
  MlpBlock(int dim, float dropout, float proj_std, TensorShard shard = {});
  std::string Describe() const override;
  Result<Tensor> Forward(const Tensor& x, const ForwardContext& ctx, LayerStash* stash) override;
  Result<Tensor> Backward(const Tensor& dy, const LayerStash& stash, bool need_dx, bool accumulate = true) override;
  void InitParameters(uint64_t seed) override { InitBlock(seed); }
};

}  // namespace copse::ml
