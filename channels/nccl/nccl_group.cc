#include "channels/nccl/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "common/logging.h"

namespace copse::chan::nccl {

namespace {

using Clock = std::chrono::steady_clock;

std::string CudaError(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

std::string ToHex(const ncclUniqueId& id) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(2 * NCCL_UNIQUE_ID_BYTES);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    auto b = static_cast<unsigned char>(id.internal[i]);
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<ncclUniqueId> FromHex(std::string_view hex) {
  if (hex.size() != 2 * NCCL_UNIQUE_ID_BYTES)
    return Status::InvalidArgument("nccl unique id: expected " + std::to_string(2 * NCCL_UNIQUE_ID_BYTES) +
                                   " hex characters, got " + std::to_string(hex.size()));
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("nccl unique id: not hex at character " + std::to_string(2 * i));
    id.internal[i] = static_cast<char>(hi << 4 | lo);
  }
  return id;
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Result<std::string> NcclUniqueId() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return Status::Unavailable(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  return ToHex(id);
}

struct NcclGroup::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int rank = 0, nranks = 0, device = 0;
  NcclOptions options;
  Status dead;  // not ok once aborted

  ~Impl() {
    if (comm) ncclCommAbort(comm);
    if (stream) cudaStreamDestroy(stream);
  }

  // Aborts the communicator and remembers why. Idempotent.
  Status Kill(Status why) {
    if (!dead.ok()) return dead;
    dead = why;
    if (comm) {
      Logger("chan")->warn("nccl group rank {}/{}: aborting: {}", rank, nranks, why.ToString());
      ncclCommAbort(comm);
      comm = nullptr;
    }
    return dead;
  }

  // Polls until NCCL has no operation in progress on the communicator (initialization, or the
  // enqueueing of a non-blocking call), or the deadline/cancel/an error.
  Status WaitNccl(const char* what, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) return Kill(Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(r)));
      if (state == ncclSuccess) return Status::OK();
      if (state != ncclInProgress)
        return Kill(
            Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm) + ")"));
      COPSE_RETURN_NOT_OK(CheckDeadline(what, deadline));
      std::this_thread::yield();
    }
  }

  // Waits for the work queued on the stream, watching NCCL's async error (a peer that died
  // shows up there as a remote or system error), the deadline and the cancel flag.
  Status WaitStream(const char* what, Clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
      cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return Status::OK();
      if (e != cudaErrorNotReady) return Kill(Status::Internal(CudaError(what, e)));
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
        return Kill(Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(state)));
      COPSE_RETURN_NOT_OK(CheckDeadline(what, deadline));
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status CheckDeadline(const char* what, Clock::time_point deadline) {
    if (options.cancel && options.cancel->load()) return Kill(Status::Cancelled(std::string(what) + ": cancelled"));
    if (Clock::now() > deadline)
      return Kill(Status::Timeout(std::string(what) + ": not done within " + std::to_string(options.timeout.count()) +
                                  " ms (a peer is lost or slow)"));
    return Status::OK();
  }

  // Runs one non-blocking NCCL call to completion.
  template <typename F>
  Status Run(const char* what, F&& enqueue) {
    if (!dead.ok()) return dead;
    auto deadline = Clock::now() + options.timeout;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return Kill(Status::Internal(CudaError("cudaSetDevice", e)));
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress)
      return Kill(Status::Unavailable(std::string(what) + ": " + ncclGetErrorString(r)));
    COPSE_RETURN_NOT_OK(WaitNccl(what, deadline));
    return WaitStream(what, deadline);
  }
};

NcclGroup::NcclGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Create(std::string_view unique_id_hex, int rank, int nranks, int cuda_device,
                                                     NcclOptions options) {
  COPSE_ASSIGN_OR_RETURN(ncclUniqueId id, FromHex(unique_id_hex));
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return Status::InvalidArgument("nccl group: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  int devices = CudaDeviceCount();
  if (devices == 0) {
    return Status::FailedPrecondition(
        "nccl group: this machine has no CUDA device (a daemon's --gpus promises some; "
        "its GPUs must be real for NCCL)");
  }
  if (cuda_device < 0 || cuda_device >= devices) {
    return Status::InvalidArgument("nccl group: CUDA device " + std::to_string(cuda_device) +
                                   " asked for, but this "
                                   "machine has devices 0 to " +
                                   std::to_string(devices - 1));
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->device = cuda_device;
  impl->options = options;
  cudaError_t e = cudaSetDevice(cuda_device);
  if (e != cudaSuccess) return Status::Internal(CudaError("cudaSetDevice", e));
  e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return Status::Internal(CudaError("cudaStreamCreate", e));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline
  auto deadline = Clock::now() + options.timeout;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    Status s = Status::Unavailable(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
    if (impl->comm) (void)impl->Kill(s);
    return s;
  }
  COPSE_RETURN_NOT_OK(impl->WaitNccl("ncclCommInitRankConfig", deadline));
  Logger("chan")->info("nccl group: rank {}/{} joined on device {}", rank, nranks, cuda_device);
  return std::unique_ptr<NcclGroup>(new NcclGroup(std::move(impl)));
}

NcclGroup::~NcclGroup() {
  auto& g = *impl_;
  if (g.comm && g.dead.ok()) {
    (void)cudaSetDevice(g.device);
    auto deadline = Clock::now() + g.options.timeout;
    ncclResult_t r = ncclCommFinalize(g.comm);
    if (r == ncclSuccess || r == ncclInProgress) {
      if (g.WaitNccl("ncclCommFinalize", deadline).ok()) {
        ncclCommDestroy(g.comm);
        g.comm = nullptr;
      }
    } else {
      (void)g.Kill(Status::Unavailable("ncclCommFinalize failed"));
    }
  }
  // ~Impl aborts a communicator that did not finalize, and destroys the stream.
}

Status NcclGroup::Send(const float* data, size_t count, int peer) {
  if (peer < 0 || peer >= impl_->nranks || peer == impl_->rank)
    return Status::InvalidArgument("nccl send: peer " + std::to_string(peer));
  return impl_->Run("ncclSend", [&] { return ncclSend(data, count, ncclFloat32, peer, impl_->comm, impl_->stream); });
}

Status NcclGroup::Recv(float* data, size_t count, int peer) {
  if (peer < 0 || peer >= impl_->nranks || peer == impl_->rank)
    return Status::InvalidArgument("nccl recv: peer " + std::to_string(peer));
  return impl_->Run("ncclRecv", [&] { return ncclRecv(data, count, ncclFloat32, peer, impl_->comm, impl_->stream); });
}

Status NcclGroup::AllReduce(float* data, size_t count) {
  return impl_->Run("ncclAllReduce",
                    [&] { return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, impl_->comm, impl_->stream); });
}

void NcclGroup::Abort() { (void)impl_->Kill(Status::Cancelled("nccl group aborted")); }

int NcclGroup::rank() const { return impl_->rank; }
int NcclGroup::nranks() const { return impl_->nranks; }
Status NcclGroup::health() const { return impl_->dead; }

}  // namespace copse::chan::nccl
