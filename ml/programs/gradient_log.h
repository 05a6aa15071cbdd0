#pragma once
// The gradient log: what a pipeline stage's backward of micro-batch m (m < M-1) sends on to the
// backward of micro-batch m+1 in place of the gradients accumulated over micro-batches 0..m.
//
// Why: those gradients are as large as the stage's parameters (4 MB for a 1024x1024 layer), and
// since a message's tensors are immutable (the sharing contract, support.h) every micro-batch
// had to copy them into a fresh message while the model accumulated on in its own. The log names
// the same sum without a copy: entry i holds what micro-batch i's backward read — its stash set
// (the forward's stash message tensors, shared, not copied) and the dL/dy it was given — so that
//
//   sum over i <= m of Backward(dy_i, stash_i)   (accumulate = i > 0, in order)
//
// rebuilds the accumulated gradients bit for bit. The next backward on the same daemon never
// replays it: its cached model holds the sum already (ModelLease grads_key). Only a backward
// whose model does not (a re-run, another daemon, COPSE_ML_MODEL_CACHE=off) replays the log.
//
// Cost: the stage keeps its micro-batches' stashes until the step's last backward (as GPipe
// does) instead of dropping each after its backward; with recomputation a stash is only the
// stage input "x", so the log stays as small as the activations it already keeps.
//
// With batched weight gradients (params.weight_grads "batched", docs/ml-graphs.md) an entry also
// holds each layer's weight-gradient part "w<i>" (Sequential::BackwardInputs); such a log is
// never replayed: the update computes the weight gradients of all its entries in one pass.
//
// Encoding (tensor-set names): "__log/<i>/<name>" for entry i's tensors, "__log/entries" =
// [number of entries]. Entries are appended in micro-batch order; a log with m+1 entries extends
// the one with m entries by sharing its tensors.
#include <cstddef>
#include <string>

#include "common/status.h"
#include "ml/tensor.h"

namespace copse::ml::programs {

/// True when `set` is a gradient log (it has "__log/entries").
bool IsGradientLog(const NamedTensors& set);

/// The number of entries of a gradient log; DataLoss when the count is malformed or an entry is
/// missing.
Result<size_t> GradientLogEntries(const NamedTensors& log);

/// Entry `i` of `log`: its tensors under their own names (shared, not copied).
NamedTensors GradientLogEntry(const NamedTensors& log, size_t i);

/// Appends to `out` the entries of `previous` (a gradient log, or empty for none) and then a new
/// entry made of `stash` (every tensor but "__loss", which is accumulated apart) and `dy` named
/// "dy" unless `stash` carries its own; then the entry count. Tensors are shared.
Status AppendGradientLog(const NamedTensors& previous, const NamedTensors& stash, const Tensor* dy, NamedTensors& out);

}  // namespace copse::ml::programs
