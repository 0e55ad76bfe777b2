#include "device/cuda/coll_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/time.h"

namespace ucm {
namespace {

Result nccl_fail(ncclResult_t e, const char* what, uint32_t rank) {
  return fail(Result::kDevice, "%s on local rank %u: NCCL %s", what, rank, ncclGetErrorString(e));
}

// Polls until the communicator's pending work and `stream` are done, the
// deadline, or the stop flag.
Result poll(ncclComm_t comm, cudaStream_t stream, bool check_stream, uint64_t deadline_ns, const std::atomic<bool>* stop,
            const char* what, uint32_t rank) {
  uint64_t nap = 10'000;
  for (;;) {
    ncclResult_t a = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &a);
    if (q != ncclSuccess) return nccl_fail(q, "ncclCommGetAsyncError", rank);
    if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(a, what, rank);
    if (a == ncclSuccess) {
      if (!check_stream) return Result::kOk;
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return Result::kOk;
      if (e != cudaErrorNotReady)
        return fail(Result::kDevice, "%s on local rank %u: CUDA %s", what, rank, cudaGetErrorString(e));
    }
    if (stop && stop->load(std::memory_order_acquire))
      return fail(Result::kFinalized, "%s: the cache is being finalized", what);
    if (now_ns() >= deadline_ns)
      return fail(Result::kTimeout, "%s on local rank %u did not complete within its bound (a peer dead or stuck?)",
                  what, rank);
    sleep_for_ns(nap);
    nap = std::min<uint64_t>(nap * 2, 1'000'000);
  }
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, cudaStream_t stream, int device, uint32_t rank, uint32_t size)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size) {}
  ~NcclCollective() override {
    (void)cudaSetDevice(device_);
    if (!aborted_) {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommDestroy(comm_);
    }
    if (scratch_) (void)cudaFree(scratch_);
    (void)cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "nccl"; }
  std::string describe() const override {
    return "nccl: ncclBroadcast over " + std::to_string(size_) + " local ranks' GPUs (device " +
           std::to_string(device_) + ")";
  }
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }

  Result allgather(const void* mine, void* all, size_t bytes, uint64_t deadline_ns) override {
    if (cudaSetDevice(device_) != cudaSuccess) return fail(Result::kDevice, "cudaSetDevice(%d) failed", device_);
    const size_t need = bytes * (size_ + 1);
    if (need > scratch_bytes_) {
      if (scratch_) (void)cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      if (cudaMalloc(&scratch_, need) != cudaSuccess)
        return fail(Result::kDevice, "cudaMalloc of %zu bytes for the fan-out records failed", need);
      scratch_bytes_ = need;
    }
    char* d = static_cast<char*>(scratch_);
    if (cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, stream_) != cudaSuccess)
      return failed(fail(Result::kDevice, "cudaMemcpyAsync of the fan-out record failed"));
    const ncclResult_t e = ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_, stream_);
    if (e != ncclSuccess && e != ncclInProgress) return failed(nccl_fail(e, "ncclAllGather", rank_));
    if (cudaMemcpyAsync(all, d + bytes, bytes * size_, cudaMemcpyDeviceToHost, stream_) != cudaSuccess)
      return failed(fail(Result::kDevice, "cudaMemcpyAsync of the fan-out records failed"));
    return failed(poll(comm_, stream_, true, deadline_ns, stop_, "ncclAllGather of the fan-out records", rank_));
  }

  Result broadcast(const BcastOp* ops, size_t n, uint64_t deadline_ns) override {
    if (cudaSetDevice(device_) != cudaSuccess) return fail(Result::kDevice, "cudaSetDevice(%d) failed", device_);
    ncclResult_t e = ncclGroupStart();
    if (e != ncclSuccess) return failed(nccl_fail(e, "ncclGroupStart", rank_));
    for (size_t i = 0; i < n; ++i) {
      e = ncclBroadcast(ops[i].buf, ops[i].buf, ops[i].bytes, ncclUint8, static_cast<int>(ops[i].root), comm_, stream_);
      if (e != ncclSuccess && e != ncclInProgress) {
        (void)ncclGroupEnd();
        return failed(nccl_fail(e, "ncclBroadcast", rank_));
      }
    }
    e = ncclGroupEnd();
    if (e != ncclSuccess && e != ncclInProgress) return failed(nccl_fail(e, "ncclGroupEnd", rank_));
    return failed(poll(comm_, stream_, true, deadline_ns, stop_, "a round of ncclBroadcast", rank_));
  }

  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    (void)cudaSetDevice(device_);
    (void)ncclCommAbort(comm_);
    // Drained before anyone writes a fallback copy into the same destinations.
    (void)cudaStreamSynchronize(stream_);
  }

 private:
  // Any failure aborts at once: the buffers' contract (collective.h).
  Result failed(Result r) {
    if (!ok(r)) {
      const std::string why = last_error();
      abort();
      return fail(r, "%s (the NCCL communicator was aborted)", why.c_str());
    }
    return r;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  uint32_t rank_, size_;
  bool aborted_ = false;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

Result make_nccl_collective(uint32_t rank, uint32_t size, int device,
                            const std::function<Result(void*, size_t)>& share_id,
                            const std::function<Result(Result)>& agree, uint64_t deadline_ns,
                            std::unique_ptr<Collective>* out) {
  ncclUniqueId id{};
  Result r = Result::kOk;
  if (rank == 0) {
    const ncclResult_t e = ncclGetUniqueId(&id);
    if (e != ncclSuccess) r = nccl_fail(e, "ncclGetUniqueId", rank);
  }
  UCM_CHECK(share_id(&id, sizeof(id)));  // every rank, whatever rank 0 found
  UCM_CHECK(agree(r));
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    r = fail(Result::kDevice, "local rank %u: cudaSetDevice(%d) or cudaStreamCreate failed: %s", rank, device,
             cudaGetErrorString(cudaGetLastError()));
  } else {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t e = ncclCommInitRankConfig(&comm, static_cast<int>(size), id, static_cast<int>(rank), &config);
    if (e != ncclSuccess && e != ncclInProgress) {
      r = nccl_fail(e, "ncclCommInitRankConfig", rank);
      comm = nullptr;
    } else {
      r = poll(comm, stream, false, deadline_ns, nullptr, "ncclCommInitRankConfig (UCM_TIMEOUT_MS bounds it)", rank);
    }
  }
  r = agree(r);
  if (!ok(r)) {
    const std::string why = last_error();
    if (comm) (void)ncclCommAbort(comm);
    if (stream) (void)cudaStreamDestroy(stream);
    return fail(r, "%s", why.c_str());
  }
  *out = std::make_unique<NcclCollective>(comm, stream, device, rank, size);
  return Result::kOk;
}

}  // namespace ucm
