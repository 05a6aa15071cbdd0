#pragma once
// CpuDevice: the Device implemented with OpenBLAS (cblas_sgemm, threaded by OpenBLAS with the
// count set by SetCpuThreads) and plain loops for everything else, which GCC vectorizes.
// Memory comes from a CachingAllocator over 64-byte aligned blocks. Singleton: use CpuDevice().
// Thread-safety: see Device.
#include "ml/device.h"

namespace copse::ml::internal {

/// Creates the CPU device (called once by CpuDevice()).
Device* MakeCpuDevice();

/// True when large products are split across copse's own pool (one single-threaded sgemm
/// per thread, OpenBLAS itself kept at 1 thread); false with COPSE_ML_GEMM=openblas, which
/// leaves threading to OpenBLAS.
bool SplitGemm();

}  // namespace copse::ml::internal
