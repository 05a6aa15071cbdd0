#pragma once
// Byte encoding of tensors and named tensor sets (parameters, gradients, optimizer state,
// activation stashes) for channels and checkpoints. Format, little-endian:
//   "COPSETNS" | u32 version=1 | u32 count |
//   count x ( u32 name_len | name | u8 dtype (0 = float32, 1 = bfloat16) | u8 ndim | u16 0
//             | i64 dims[ndim] | data[prod(dims)] of that type ) |
//   u64 XXH64(seed 0) of every byte before it.
// Decoding verifies the checksum first; any damage (truncation, flipped bits, bad header)
// yields Status::DataLoss naming what is wrong, never a crash or a partial result.
// Stateless; thread-safe.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ml/tensor.h"

namespace copse::ml {

/// Encodes (copies device tensors to the host first).
std::string SerializeTensors(const NamedTensors& tensors);
/// SerializeTensors(tensors).size(), without encoding.
size_t EncodedSize(const NamedTensors& tensors);
/// SerializeTensors(tensors) without copying the tensors' contents: spans whose concatenation
/// is exactly those bytes, the headers and checksum trailer kept in `*scratch` (replaced), each
/// tensor's data in place. Valid while `*scratch` lives and the tensors are unchanged. Host
/// tensors only: empty, `*scratch` untouched, when any tensor is in device memory.
std::vector<std::string_view> SerializedSpans(const NamedTensors& tensors, std::string* scratch);
/// Decodes onto `device`.
Result<NamedTensors> DeserializeTensors(std::string_view bytes, Device* device = CpuDevice());

/// A single unnamed tensor, same format with count 1.
std::string SerializeTensor(const Tensor& tensor);
Result<Tensor> DeserializeTensor(std::string_view bytes, Device* device = CpuDevice());

/// XXH64 of `bytes` (seed 0).
uint64_t Checksum(std::string_view bytes);
/// 16 hex digits of the checksum of SerializeTensors(tensors): equal iff bit-identical.
std::string Digest(const NamedTensors& tensors);

}  // namespace copse::ml
