#pragma once
// Element types of tensors, and the precision a forward pass computes its products in.
//
// float32 is every tensor's type unless a layer computing in bfloat16 makes it otherwise.
// bfloat16 is float32's upper 16 bits (8-bit exponent, 7-bit mantissa): the same range, about
// three significant decimal digits. Conversion rounds to nearest, ties to even (NaN stays NaN),
// as PyTorch and oneDNN round — so the same float32 values give the same bfloat16 bits on
// every device.
//
// Mixed precision (Precision::kBFloat16), as PyTorch's autocast does it: matrix products read
// bfloat16 operands and accumulate and write float32; parameters, their gradients, optimizer
// state and elementwise work (activations, norms, softmax, losses) stay float32. What a layer
// keeps for its backward pass is the bfloat16 operand it multiplied (half the bytes), and
// activations crossing a pipeline stage boundary travel in bfloat16.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace copse::ml {

enum class DType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
};

/// Bytes per element.
constexpr size_t DTypeSize(DType t) { return t == DType::kBFloat16 ? 2 : 4; }
/// "float32" or "bfloat16".
const char* DTypeName(DType t);

/// The precision of a forward pass's matrix products.
enum class Precision { kFloat32, kBFloat16 };

/// "fp32" or "bf16", as flags and job files spell them.
const char* PrecisionName(Precision p);
/// Parses "fp32" or "bf16"; the error lists what is accepted ("fp16" is named as needing
/// loss scaling on a GPU, which copse does not have yet).
Result<Precision> ParsePrecision(const std::string& name);

/// bfloat16 of `x`: round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t FloatToBFloat16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace copse::ml
