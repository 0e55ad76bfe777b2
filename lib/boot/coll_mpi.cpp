#include "boot/coll_mpi.h"

#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "boot/node.h"
#include "common/time.h"

namespace ucm {
namespace {

// Staging that a collective given up on may still write into: kept for the
// life of the process (MPI cannot cancel a collective), never freed.
void keep_for_late_transfers(std::vector<char>* stage, std::vector<MPI_Request>* reqs) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::pair<std::vector<char>*, std::vector<MPI_Request>*>>();
  std::lock_guard<std::mutex> g(mu);
  kept->emplace_back(stage, reqs);
}

class MpiCollective final : public Collective {
 public:
  MpiCollective(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~MpiCollective() override {
    // A communicator with a collective given up on stays (its requests may
    // still complete into the kept staging).
    // After MPI_Finalize, MPI has freed it (and must not be called).
    if (!broken_ && comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }
  const char* name() const override { return "mpi"; }
  std::string describe() const override {
    return "mpi: MPI_Ibcast over " + std::to_string(size_) + " local ranks, host destinations";
  }
  uint32_t rank() const override { return static_cast<uint32_t>(rank_); }
  uint32_t size() const override { return static_cast<uint32_t>(size_); }

  Result allgather(const void* mine, void* all, size_t bytes, uint64_t deadline_ns) override {
    if (bytes > INT_MAX) return fail(Result::kInvalidArg, "allgather of %zu bytes", bytes);
    auto* stage = new std::vector<char>(bytes * (static_cast<size_t>(size_) + 1));
    auto* reqs = new std::vector<MPI_Request>(1, MPI_REQUEST_NULL);
    std::memcpy(stage->data(), mine, bytes);
    if (MPI_Iallgather(stage->data(), static_cast<int>(bytes), MPI_BYTE, stage->data() + bytes,
                       static_cast<int>(bytes), MPI_BYTE, comm_, reqs->data()) != MPI_SUCCESS) {
      delete stage;
      delete reqs;
      return fail(Result::kSystem, "MPI_Iallgather over the node communicator failed");
    }
    const Result r = complete(reqs, deadline_ns, "MPI_Iallgather of the fan-out records");
    if (!ok(r)) {
      keep_for_late_transfers(stage, reqs);
      return r;
    }
    std::memcpy(all, stage->data() + bytes, bytes * static_cast<size_t>(size_));
    delete stage;
    delete reqs;
    return Result::kOk;
  }

  Result broadcast(const BcastOp* ops, size_t n, uint64_t deadline_ns) override {
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += ops[i].bytes;
    auto* stage = new std::vector<char>(total);
    auto* reqs = new std::vector<MPI_Request>();
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      char* s = stage->data() + off;
      if (ops[i].root == static_cast<uint32_t>(rank_)) std::memcpy(s, ops[i].buf, ops[i].bytes);
      // In pieces below INT_MAX bytes (MPI counts are ints).
      for (uint64_t done = 0; done < ops[i].bytes;) {
        const int piece = static_cast<int>(std::min<uint64_t>(ops[i].bytes - done, 1u << 30));
        MPI_Request q = MPI_REQUEST_NULL;
        if (MPI_Ibcast(s + done, piece, MPI_BYTE, static_cast<int>(ops[i].root), comm_, &q) != MPI_SUCCESS) {
          keep_for_late_transfers(stage, reqs);
          return fail(Result::kSystem, "MPI_Ibcast of entry %zu (root local rank %u) failed", i, ops[i].root);
        }
        reqs->push_back(q);
        done += static_cast<uint64_t>(piece);
      }
      off += ops[i].bytes;
    }
    const Result r = complete(reqs, deadline_ns, "a round of MPI_Ibcast");
    if (!ok(r)) {
      keep_for_late_transfers(stage, reqs);
      return r;
    }
    off = 0;
    for (size_t i = 0; i < n; ++i) {
      if (ops[i].root != static_cast<uint32_t>(rank_)) std::memcpy(ops[i].buf, stage->data() + off, ops[i].bytes);
      off += ops[i].bytes;
    }
    delete stage;
    delete reqs;
    return Result::kOk;
  }

  void abort() override { broken_ = true; }

 private:
  // Tests the requests until all completed, the deadline, or the stop flag;
  // sleeps a little more each round (20 us to 1 ms).
  Result complete(std::vector<MPI_Request>* reqs, uint64_t deadline_ns, const char* what) {
    uint64_t nap = 20'000;
    for (;;) {
      int flag = 0;
      if (MPI_Testall(static_cast<int>(reqs->size()), reqs->data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return fail(Result::kSystem, "%s: MPI_Testall failed", what);
      if (flag) return Result::kOk;
      if (stop_requested()) return fail(Result::kFinalized, "%s: the cache is being finalized", what);
      if (now_ns() >= deadline_ns)
        return fail(Result::kTimeout, "%s did not complete within its bound (a local rank stopped calling?)", what);
      sleep_for_ns(nap);
      nap = std::min<uint64_t>(nap * 2, 1'000'000);
    }
  }

  MPI_Comm comm_;
  int rank_, size_;
  bool broken_ = false;
};

}  // namespace

Result make_mpi_collective(MPI_Comm node, const std::vector<ProcessIdentity>* watch, std::unique_ptr<Collective>* out) {
  int level = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&level) != MPI_SUCCESS) return fail(Result::kSystem, "MPI_Query_thread failed");
  // Every rank duplicates (collective); the level check comes after, so a rank
  // that refuses does not leave the others in MPI_Comm_dup.
  // On the heap: a duplication given up on (a peer died) may still complete into it.
  auto* made = new MPI_Comm(MPI_COMM_NULL);
  MPI_Request q = MPI_REQUEST_NULL;
  if (MPI_Comm_idup(node, made, &q) != MPI_SUCCESS) {
    delete made;
    return fail(Result::kSystem, "MPI_Comm_idup of the node communicator failed");
  }
  if (const Result r = wait_watching(&q, watch, "duplicating the node communicator for the fan-out (MPI_Comm_idup)");
      !ok(r)) {
    keep_for_abandoned_collective(made);
    return r;
  }
  MPI_Comm dup = *made;
  delete made;
  int rank = 0, size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  if (level < MPI_THREAD_MULTIPLE) {
    MPI_Comm_free(&dup);
    const char* names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED"};
    return fail(Result::kUnsupported,
                "UCM_FANOUT=mpi needs MPI initialized with MPI_THREAD_MULTIPLE (its own thread calls MPI_Ibcast); "
                "this process has %s",
                level >= 0 && level < 3 ? names[level] : "an unknown level");
  }
  *out = std::make_unique<MpiCollective>(dup, rank, size);
  return Result::kOk;
}

}  // namespace ucm
