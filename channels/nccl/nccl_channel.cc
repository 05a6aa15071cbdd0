#include "channels/nccl/nccl_channel.h"

#include <cuda_runtime.h>

#include <cstring>
#include <limits>

namespace copse::chan::nccl {
namespace {

constexpr uint64_t kEndOfStream = std::numeric_limits<uint64_t>::max();

/// A growable device buffer on one GPU.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int device) : device_(device) {}
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  Result<float*> Reserve(size_t floats) {
    if (cudaSetDevice(device_) != cudaSuccess) return Status::Unavailable("cannot select GPU " + std::to_string(device_));
    if (floats <= capacity_) return ptr_;
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), floats * sizeof(float)) != cudaSuccess) {
      return Status::Unavailable("cudaMalloc of " + std::to_string(floats * sizeof(float)) + " bytes failed");
    }
    capacity_ = floats;
    return ptr_;
  }

 private:
  int device_;
  float* ptr_ = nullptr;
  size_t capacity_ = 0;
};

Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return Status::OK();
  cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  return e == cudaSuccess ? Status::OK() : Status::Unavailable(std::string("cudaMemcpy: ") + cudaGetErrorString(e));
}

size_t Floats(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

class NcclWriter final : public ChannelWriter {
 public:
  NcclWriter(NcclGroup& group, int peer, int device) : group_(group), peer_(peer), buf_(device) {}
  Status Write(Buffer message) override { return Send(message.size(), message.data()); }
  Status Close() override { return Send(kEndOfStream, nullptr); }

 private:
  Status Send(uint64_t length, const char* data) {
    size_t payload = length == kEndOfStream ? 0 : Floats(length);
    COPSE_ASSIGN_OR_RETURN(float* dev, buf_.Reserve(2 + payload));
    COPSE_RETURN_NOT_OK(Copy(dev, &length, sizeof(length), cudaMemcpyHostToDevice));
    COPSE_RETURN_NOT_OK(group_.Send(dev, 2, peer_));
    if (payload == 0) return Status::OK();
    COPSE_RETURN_NOT_OK(Copy(dev, data, length, cudaMemcpyHostToDevice));
    return group_.Send(dev, payload, peer_);
  }

  NcclGroup& group_;
  int peer_;
  DeviceBuffer buf_;
};

class NcclReader final : public ChannelReader {
 public:
  NcclReader(NcclGroup& group, int peer, int device) : group_(group), peer_(peer), buf_(device) {}
  Result<std::optional<Buffer>> Next() override {
    if (done_) return std::optional<Buffer>();
    COPSE_ASSIGN_OR_RETURN(float* dev, buf_.Reserve(2));
    COPSE_RETURN_NOT_OK(group_.Recv(dev, 2, peer_));
    uint64_t length = 0;
    COPSE_RETURN_NOT_OK(Copy(&length, dev, sizeof(length), cudaMemcpyDeviceToHost));
    if (length == kEndOfStream) {
      done_ = true;
      return std::optional<Buffer>();
    }
    COPSE_ASSIGN_OR_RETURN(dev, buf_.Reserve(Floats(length)));
    COPSE_RETURN_NOT_OK(group_.Recv(dev, Floats(length), peer_));
    std::string bytes(length, '\0');
    COPSE_RETURN_NOT_OK(Copy(bytes.data(), dev, length, cudaMemcpyDeviceToHost));
    return std::optional<Buffer>(Buffer(std::move(bytes)));
  }

 private:
  NcclGroup& group_;
  int peer_;
  DeviceBuffer buf_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<ChannelWriter> MakeNcclWriter(NcclGroup& group, int peer_rank, int cuda_device) {
  return std::make_unique<NcclWriter>(group, peer_rank, cuda_device);
}

std::unique_ptr<ChannelReader> MakeNcclReader(NcclGroup& group, int peer_rank, int cuda_device) {
  return std::make_unique<NcclReader>(group, peer_rank, cuda_device);
}

Status AllReduceHost(NcclGroup& group, float* data, size_t count, int cuda_device) {
  DeviceBuffer buf(cuda_device);
  COPSE_ASSIGN_OR_RETURN(float* dev, buf.Reserve(count));
  COPSE_RETURN_NOT_OK(Copy(dev, data, count * sizeof(float), cudaMemcpyHostToDevice));
  COPSE_RETURN_NOT_OK(group.AllReduce(dev, count));
  return Copy(data, dev, count * sizeof(float), cudaMemcpyDeviceToHost);
}

}  // namespace copse::chan::nccl
