#pragma once
// CpuDevice: the Device on the CPU. Matrix products run on oneDNN's matmul (where the build
// found it; onednn_gemm.h) or OpenBLAS, one single-threaded product per thread of copse's own
// pool; everything else is plain loops, which GCC vectorizes. COPSE_ML_GEMM picks the products'
// backend: unset or "onednn", oneDNN where built, else OpenBLAS split over the pool;
// "openblas-split", that OpenBLAS path even where oneDNN is built; "openblas", OpenBLAS
// threading itself. Any other value is reported on stderr and treated as unset.
// Memory comes from a CachingAllocator over 64-byte aligned blocks. Singleton: use CpuDevice().
// Thread-safety: see Device.
#include "ml/device.h"

namespace copse::ml::internal {

/// Creates the CPU device (called once by CpuDevice()).
Device* MakeCpuDevice();

/// True when large products are split across copse's own pool (one single-threaded product
/// per thread, OpenBLAS itself kept at 1 thread); false with COPSE_ML_GEMM=openblas, which
/// leaves threading to OpenBLAS.
bool SplitGemm();

/// The products' backend in force: "onednn", "openblas-split" or "openblas" (see above);
/// COPSE_ML_GEMM is read once, here and nowhere else.
const char* GemmBackend();

}  // namespace copse::ml::internal
