#pragma once
// The model zoo of copse: the architectures `copse train` and the graph generators know by
// name, built as Sequential models with parameters initialized from a seed.
//   "mlp"        Flatten -> Linear(784,1024)+ReLU -> Linear(1024,1024)+ReLU -> Linear(1024,10)
//   "cnn"        Conv(1,16,3,p1)+ReLU -> MaxPool2 -> Conv(16,32,3,p1)+ReLU -> MaxPool2 -> Flatten
//                -> Linear(1568,128)+ReLU -> Linear(128,10)
//   "mlp:A-B-..-Z"  an MLP with those layer widths (ReLU between), e.g. "mlp:784-64-10"; A must
//                be 784 and Z 10
//   "gpt:L-D-H-C[,dropout=P]"  a decoder-only transformer (ml/transformer.h): L blocks of width
//                D with H heads over a context of C bytes
// Image models take [N, 1, 28, 28] images and give [N, 10] logits; gpt models take token ids
// [B, T] (T <= C) and give [B, T, 256] logits.
#include <string>

#include "ml/sequential.h"

namespace copse::ml {

/// Builds and initializes the named model on the CPU.
Result<Sequential> BuildModel(const std::string& name, uint64_t seed);

/// Builds the named model's layers with zeroed parameters, skipping initialization (about 20 ms
/// for "mlp"): for callers that need only its shapes or set every parameter right after.
Result<Sequential> BuildModelLayers(const std::string& name);

/// Member `rank` of `ranks` of a tensor-parallel gpt model (ml/transformer.h): its blocks hold
/// their shard, initialized as that shard of BuildModel(name, seed), and need a group
/// (Sequential::SetTensorParallelGroup) to run. ranks == 1 is the whole model. The error names
/// the model and why it cannot be split so.
Result<Sequential> BuildModelShard(const std::string& name, uint64_t seed, int rank, int ranks);
Result<Sequential> BuildModelShardLayers(const std::string& name, int rank, int ranks);

}  // namespace copse::ml
