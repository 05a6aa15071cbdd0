#pragma once
// NcclGroup: the `nccl` channel kind — GPU-to-GPU tensor send/recv between the vertices of a
// gang, and collectives (all-reduce) over the whole gang, on NCCL communicators that can
// never hang a vertex.
//
// Setup: the daemon hosting rank 0 calls NcclUniqueId() (it also starts NCCL's bootstrap
// listener in that process, which must therefore stay alive until every rank has joined) and
// reports the hex id to the job manager, which hands it to every member of the gang with its
// rank. Each member then calls NcclGroup::Create(id, rank, nranks, its CUDA device, options).
//
// Deadlines: the communicator is created non-blocking (ncclConfig_t.blocking = 0). Creation and
// every operation poll ncclCommGetAsyncError and the operation's CUDA stream until done, an
// error, `options.timeout`, or `options.cancel`; on timeout, cancel or a NCCL error the
// communicator is aborted (ncclCommAbort) and the group is dead: every later call returns the
// same error. So a lost peer (its daemon killed) costs at most one timeout and a restart of
// the gang, never a hang. Codes: Timeout (deadline), Cancelled (flag), Unavailable (NCCL
// reported a remote or system error), InvalidArgument (bad id, rank, count), Internal (CUDA).
//
// Operations are synchronous: they return when the data is in the destination buffer (or sent).
// Buffers are device pointers on the group's device. Thread-safety: a group is used by one
// thread at a time.
//
// Usage:
//   // rank 0's daemon:  COPSE_ASSIGN_OR_RETURN(std::string id, nccl::NcclUniqueId());
//   COPSE_ASSIGN_OR_RETURN(auto g, nccl::NcclGroup::Create(id, rank, nranks, device, {}));
//   COPSE_RETURN_NOT_OK(g->AllReduce(grad, n));            // sum over the gang, in place
//   if (rank == 0) COPSE_RETURN_NOT_OK(g->Send(acts, n, 1)); else COPSE_RETURN_NOT_OK(g->Recv(acts, n, 0));
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace copse::chan::nccl {

/// GPUs visible to this process (0 when there is no driver or device).
int CudaDeviceCount();

/// A new NCCL unique id (ncclGetUniqueId), as 256 hex characters.
Result<std::string> NcclUniqueId();

struct NcclOptions {
  /// The longest any one call (Create, Send, Recv, AllReduce) may take before the group aborts.
  std::chrono::milliseconds timeout{30'000};
  /// When set, a call in progress aborts the group and returns Cancelled (polled every ms).
  const std::atomic<bool>* cancel = nullptr;
};

class NcclGroup {
 public:
  /// Joins the communicator `unique_id_hex` (from NcclUniqueId) as `rank` of `nranks`, on CUDA
  /// device `cuda_device`. Returns when every rank has joined, or the deadline/cancel/error.
  static Result<std::unique_ptr<NcclGroup>> Create(std::string_view unique_id_hex, int rank, int nranks, int cuda_device,
                                                   NcclOptions options = {});
  /// Finalizes the communicator (aborts it if that does not finish within the timeout).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  /// Sends `count` floats at device pointer `data` to rank `peer` (which calls Recv).
  Status Send(const float* data, size_t count, int peer);
  /// Receives `count` floats from rank `peer` into device pointer `data`.
  Status Recv(float* data, size_t count, int peer);
  /// In-place sum over every rank of the group.
  Status AllReduce(float* data, size_t count);
  /// Aborts the communicator now (peers blocked on us fail too); later calls return Cancelled.
  void Abort();

  int rank() const;
  int nranks() const;
  /// OK while the group is usable; else the error that killed it.
  Status health() const;

  struct Impl;

 private:
  explicit NcclGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace copse::chan::nccl
