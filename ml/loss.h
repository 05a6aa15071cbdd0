#pragma once
// Losses and metrics over logits [N, C] and integer labels (host vectors: they are tiny and
// the CUDA backend copies them along with the kernel launch).
// Stateless; thread-safe.
#include <cstdint>
#include <span>

#include "ml/tensor.h"

namespace copse::ml {

struct LossOutput {
  double loss = 0;  // mean over the rows of this call
  Tensor grad;      // dL/dlogits for L = sum of row losses / normalizer
};

/// Softmax cross-entropy (torch.nn.CrossEntropyLoss, mean reduction) over the rows of logits
/// [N, C] or [..., C] (a language model's [B, T, V]: one row per position; grad has its shape). `normalizer` is the
/// number of rows the gradient is averaged over: 0 means this call's rows; a micro-batch of a
/// larger batch passes the full batch size so that micro-batch gradients add up to the batch's.
Result<LossOutput> CrossEntropyLoss(const Tensor& logits, std::span<const int32_t> labels, int64_t normalizer = 0);

/// Number of rows whose largest logit is at the label.
int64_t CountCorrect(const Tensor& logits, std::span<const int32_t> labels);

}  // namespace copse::ml
