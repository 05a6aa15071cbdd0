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
//
// float16 (IEEE half: 5-bit exponent, 10-bit mantissa) has three more bits of mantissa and far
// less range: gradients below 2^-24 vanish and values above 65504 overflow. Precision::kFloat16
// multiplies in float16 like bf16 does in bfloat16, and needs dynamic loss scaling
// (ml/loss_scaler.h) to keep small gradients representable — what GPUs' float16 tensor cores
// are for. Conversion rounds to nearest even, overflow gives infinity, NaN stays a quiet NaN,
// with the same bits on the host and on CUDA (one function, compiled for both).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

/// Functions compiled for the host and, in CUDA sources, for the device too.
#if defined(__CUDACC__)
#define COPSE_ML_HOST_DEVICE __host__ __device__
#else
#define COPSE_ML_HOST_DEVICE
#endif

namespace copse::ml {

enum class DType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

/// Bytes per element.
constexpr size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }
/// "float32", "bfloat16" or "float16".
const char* DTypeName(DType t);

/// The precision of a forward pass's matrix products.
enum class Precision { kFloat32, kBFloat16, kFloat16 };

/// "fp32", "bf16" or "fp16", as flags and job files spell them.
const char* PrecisionName(Precision p);
/// Parses "fp32", "bf16" or "fp16"; the error lists what is accepted.
Result<Precision> ParsePrecision(const std::string& name);
/// The type a product's operands have in `p`: float32, bfloat16 or float16.
constexpr DType ProductType(Precision p) {
  return p == Precision::kBFloat16 ? DType::kBFloat16 : p == Precision::kFloat16 ? DType::kFloat16 : DType::kFloat32;
}

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

/// float16 of `x`, round to nearest even (F. Giesen's float_to_half_fast3_rtne): overflow gives
/// infinity, NaN a quiet NaN, values below 2^-14 subnormals (rounded by a float addition).
COPSE_ML_HOST_DEVICE inline uint16_t FloatToFloat16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= 0x47800000u) {  // 65536 and up, infinity, NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below 2^-14: subnormal or zero; the addition rounds
    float f;
    memcpy(&f, &u, 4);
    f += 0.5f;
    memcpy(&o, &f, 4);
    o -= 0x3f000000u;
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // rebias the exponent (15 - 127) and round half to even
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

/// float32 of a float16 (exact).
COPSE_ML_HOST_DEVICE inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {  // zero or subnormal: mant x 2^-24, exact in float32
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

}  // namespace copse::ml
