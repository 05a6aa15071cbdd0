#pragma once
// Elementwise erf and exp over float arrays for the CPU device's GELU and softmax kernels.
// glibc's scalar erff/expf took over a third of a GPT training step; its vector variants
// (libmvec: 16 lanes on AVX-512) compute the same functions to within glibc's stated error.
//
// Determinism: every element takes the same path whatever n and wherever it sits in the array
// (on AVX-512, the tail is a masked vector, never the scalar function), so an element's bits do
// not depend on how a kernel's range was split between threads. CPUs without AVX-512, and
// builds without libmvec, use the scalar functions for every element.
#include <cstddef>

namespace copse::ml::internal {

/// y[i] = erf(x[i]) for i < n (y may alias x).
void VectorErf(const float* x, size_t n, float* y);
/// y[i] = exp(x[i]) for i < n (y may alias x).
void VectorExp(const float* x, size_t n, float* y);
/// Which path runs here: "libmvec avx512" or "scalar".
const char* VectorMathPath();

}  // namespace copse::ml::internal
