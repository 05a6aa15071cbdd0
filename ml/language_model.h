#pragma once
// What a trained language model (a "gpt:..." Sequential, ml/transformer.h) is used for besides
// training: its validation loss, and text it writes.
// Thread-safety: as Sequential::Predict (concurrent calls on one model are fine).
#include <cstdint>
#include <string>

#include "ml/dataset.h"
#include "ml/sequential.h"

namespace copse::ml {

/// Mean cross-entropy per token of `model` on the windows of `data` (batches of `batch`
/// windows, no dropout); exp() of it is the perplexity.
Result<double> EvaluateLoss(const Sequential& model, const Dataset& data, int64_t batch = 32);

/// Continues `prompt` (at least one byte) by `length` bytes, each drawn from
/// softmax(logits / temperature) of the last position with the uniform number i of
/// Philox(seed); greedy when temperature == 0. The model sees the last `context` bytes.
/// Deterministic: the same model, prompt and seed give the same text.
Result<std::string> GenerateText(const Sequential& model, int context, const std::string& prompt, int length, float temperature,
                                 uint64_t seed);

}  // namespace copse::ml
