#pragma once
// Single-threaded row-major products (float32, or bfloat16 operands into float32) through
// oneDNN's matmul primitive: the CPU product kernel
// PyTorch uses, with AVX-512 micro-kernels (brgemm) that stay fast at micro-batch sizes, where
// OpenBLAS spends much of a 16-row product packing the weight matrix (docs/ml-graphs.md has the
// figures). The primitive for each shape is built (JIT-compiled) once per calling thread and
// cached; oneDNN's own threading is held to the calling thread, so the CPU device's pool stays
// the only source of parallelism and results do not depend on which thread runs a product.
//
// Built only where oneDNN was found (COPSE_HAVE_ONEDNN); cpu_device.cc falls back to OpenBLAS.

#include "ml/dtype.h"

namespace copse::ml::internal {

/// True when this build has oneDNN (COPSE_ML_GEMM, read by cpu_device.cc, decides its use).
bool OneDnnGemmBuilt();

/// C = alpha * op(A) op(B) + beta * C, row-major, on the calling thread; A and B of type
/// `operands` (float32 or bfloat16), C float32. Returns false (and touches nothing) for what the
/// matmul primitive cannot express here (beta other than 0 or 1, strides oneDNN rejects); the
/// caller then uses OpenBLAS. alpha is the primitive's output scale.
bool OneDnnGemm(DType operands, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                const void* b, int ldb, float beta, float* c, int ldc);

}  // namespace copse::ml::internal
