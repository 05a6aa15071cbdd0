#pragma once
// Philox4x32-10: a counter-based random generator (Salmon et al., SC'11). Every random number
// is a pure function of (key, counter), so a dropout mask, a parameter initialization or a
// shuffle depends only on (seed, stream, element index) — never on thread count, device or the
// order in which elements are visited. The CUDA kernels include this header too (all functions
// are constexpr/inline and host-device callable), which is what makes CPU and GPU masks equal.
// Stateless; thread-safe.
#include <cstdint>

#if defined(__CUDACC__)
#define COPSE_HD __host__ __device__ __forceinline__
#else
#define COPSE_HD inline
#endif

namespace copse::ml {

struct Philox4 {
  uint32_t v[4];
};

COPSE_HD uint32_t PhiloxMulHi(uint32_t a, uint32_t b, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *lo = static_cast<uint32_t>(p);
  return static_cast<uint32_t>(p >> 32);
}

/// Four 32-bit random words for (key, counter).
COPSE_HD Philox4 Philox4x32(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    const uint32_t hi0 = PhiloxMulHi(0xD2511F53u, c0, &lo0);
    const uint32_t hi1 = PhiloxMulHi(0xCD9E8D57u, c2, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// A uniform float in [0, 1) from 24 random bits (exactly representable, identical everywhere).
COPSE_HD float UniformFromBits(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

/// The uniform [0,1) float number `index` of stream `stream` under `seed`.
COPSE_HD float PhiloxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const Philox4 r = Philox4x32(seed, index >> 2, stream);
  return UniformFromBits(r.v[index & 3]);
}

/// SplitMix64 finalizer: derives independent 64-bit seeds from (seed, a, b) without collisions
/// in practice (e.g. a per-layer stream from (model seed, layer index)).
COPSE_HD uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b = 0) {
  uint64_t z = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Sequential draws from one Philox stream (for host-side uses such as shuffling).
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  uint32_t NextU32() {
    if ((pos_ & 3) == 0) block_ = Philox4x32(seed_, pos_ >> 2, stream_);
    return block_.v[pos_++ & 3];
  }
  uint64_t NextU64() { return (static_cast<uint64_t>(NextU32()) << 32) | NextU32(); }
  float NextUniform() { return UniformFromBits(NextU32()); }
  /// Uniform integer in [0, n), unbiased (rejection sampling).
  uint64_t NextBelow(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = NextU64();
    } while (x >= limit);
    return x % n;
  }

 private:
  uint64_t seed_, stream_;
  uint64_t pos_ = 0;
  Philox4 block_{};
};

}  // namespace copse::ml
