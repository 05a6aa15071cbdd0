#pragma once
// Entry points of the CUDA backend, callable from plain C++ (no CUDA header here): ml/device.cc
// uses them to implement CudaDevice() and CudaDeviceCount() when copse is built with CUDA.
// The devices are process-wide singletons (one per GPU ordinal), created on first use.
#include "common/status.h"
#include "ml/device.h"

namespace copse::ml::cuda {

/// Number of visible GPUs; 0 when the driver or hardware is missing.
int CudaDeviceCount();

/// GPU `ordinal`'s total memory in MB; 0 when there is no such GPU.
int64_t CudaMemoryMb(int ordinal);

/// The Device for GPU `ordinal`, or Unavailable naming why not.
Result<Device*> GetCudaDevice(int ordinal);

}  // namespace copse::ml::cuda
