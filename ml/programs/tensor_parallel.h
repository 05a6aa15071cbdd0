#pragma once
// ml.tp_step: one training step of one member of a tensor-parallel group (tensor_parallel.cc
// says how the group's gang is joined and what each port carries).
#include <memory>

#include "ml/sequential.h"
#include "ml/transformer.h"
#include "vertex/program.h"

namespace copse::ml::programs {

/// A vertex's live channels to the other members of its tensor-parallel gang as the group its
/// layers all-reduce over: input first_input + k and output first_output + k join it to the
/// k-th other member in rank order (k from 0). Each sum adds every member's part in rank order.
class LiveChannelGroup final : public TensorParallelGroup {
 public:
  LiveChannelGroup(vertex::VertexContext& ctx, int rank, int size, size_t first_input, size_t first_output)
      : ctx_(ctx), rank_(rank), size_(size), first_input_(first_input), first_output_(first_output) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<Tensor> AllReduceSum(const Tensor& partial) override;
  /// Reads the peers' channels to their end, once the vertex has ended its own (CloseOutputs):
  /// no member returns before its peers have read what it sent.
  Status Finish();

 private:
  vertex::VertexContext& ctx_;
  int rank_, size_;
  size_t first_input_, first_output_;
};

/// For the vertex of a tensor-parallel member (params.tensor_parallel > 1), whose last
/// tensor_parallel - 1 inputs and outputs are its live channels to the other members: `model`
/// gets the group of those channels for as long as the scope lives (the model may be a cached
/// one that outlives the vertex). Without tensor parallelism it does nothing.
class TensorParallelScope {
 public:
  static Result<std::unique_ptr<TensorParallelScope>> Open(vertex::VertexContext& ctx, int rank, int ranks,
                                                           const Sequential& model);
  ~TensorParallelScope() { model_.SetTensorParallelGroup(nullptr); }
  LiveChannelGroup& group() { return group_; }

 private:
  TensorParallelScope(vertex::VertexContext& ctx, int rank, int ranks, const Sequential& model, size_t first_input,
                      size_t first_output)
      : group_(ctx, rank, ranks, first_input, first_output), model_(model) {
    model_.SetTensorParallelGroup(&group_);
  }
  LiveChannelGroup group_;
  const Sequential& model_;
};

std::unique_ptr<vertex::VertexProgram> MakeTensorParallelStepProgram();

}  // namespace copse::ml::programs
