#pragma once
// Tensor sets as channel messages. A message made here carries the tensors themselves (a
// chan::Payload): a consumer on the producer's daemon takes them as they are, with no encoding,
// hashing, copying or decoding; a consumer on another daemon, a spilled output or a stream gets
// the ml/serialize.h bytes, encoded on first demand. Both paths give the same values, so results
// never depend on where a consumer ran.
//
// Contract: the tensors of a message are immutable. A producer hands over tensors nobody will
// write again (clone what a model keeps using); a consumer that wants to write clones first.
// Thread-safe.
#include <cstdint>

#include "channels/buffer.h"
#include "ml/tensor.h"

namespace copse::ml {

/// A message carrying `tensors` (owned by the message from now on; see the contract above).
chan::Buffer TensorMessage(NamedTensors tensors);
/// A message carrying one unnamed tensor (SerializeTensor's encoding).
chan::Buffer SingleTensorMessage(Tensor tensor);

/// The tensors of a message: the producer's own (read-only) when it carries them, else decoded
/// from its bytes (DataLoss when damaged). `shared` is set to whether they are the producer's.
Result<NamedTensors> ReadTensorMessage(const chan::Buffer& message, bool* shared = nullptr);
/// The one tensor of a SingleTensorMessage (or of SerializeTensor bytes).
Result<Tensor> ReadSingleTensor(const chan::Buffer& message);

/// Identity of a message's tensors for caches: equal keys mean equal tensors (a carried set's
/// process-unique id, or a hash of the encoded bytes' checksum trailer); 0 when unknown.
uint64_t TensorMessageKey(const chan::Buffer& message);

}  // namespace copse::ml
