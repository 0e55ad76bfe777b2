#include "backend/node_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "common/log.h"

namespace ucm {
namespace {

// A store asking for more than this has a bug in its sizing, not a need.
constexpr uint64_t kMaxNodeStateBytes = uint64_t{16} << 30;

Result check_size(uint64_t bytes) {
  if (bytes == 0) return fail(Result::kInvalidArg, "node-shared store state of 0 bytes");
  if (bytes > kMaxNodeStateBytes)
    return fail(Result::kTooLarge, "node-shared store state of %" PRIu64 " bytes is over the bound of %" PRIu64,
                bytes, kMaxNodeStateBytes);
  return Result::kOk;
}

}  // namespace

NodeState::~NodeState() { reset(); }

NodeState::NodeState(NodeState&& o) noexcept : base_(o.base_), bytes_(o.bytes_), fd_(o.fd_) {
  o.base_ = nullptr;
  o.bytes_ = 0;
  o.fd_ = -1;
}

NodeState& NodeState::operator=(NodeState&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = o.base_;
    bytes_ = o.bytes_;
    fd_ = o.fd_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

void NodeState::reset() {
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
  close_fd();
}

void NodeState::close_fd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Result NodeState::create(uint64_t bytes, NodeState* out) {
  UCM_CHECK(check_size(bytes));
  NodeState s;
  int fd;
  UCM_SYSCHECK(fd = memfd_create("ucmcache-store", MFD_CLOEXEC | MFD_ALLOW_SEALING), "memfd_create(ucmcache-store)");
  s.fd_ = fd;
  UCM_SYSCHECK(ftruncate(fd, static_cast<off_t>(bytes)), "ftruncate(store state)");
  UCM_SYSCHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), "fcntl(F_ADD_SEALS, store state)");
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return fail(Result::kSystem, "mmap(store state, %" PRIu64 " bytes): %s", bytes, strerror(errno));
  s.base_ = m;
  s.bytes_ = bytes;
  UCM_INFO(kBackend, "store state: %" PRIu64 " bytes, node-shared", bytes);
  *out = std::move(s);
  return Result::kOk;
}

Result NodeState::attach(int fd, uint64_t bytes, NodeState* out) {
  UCM_CHECK(check_size(bytes));
  struct stat st;
  UCM_SYSCHECK(fstat(fd, &st), "fstat(store state)");
  // The creator sized it from the same spec: another size is another layout.
  if (static_cast<uint64_t>(st.st_size) != bytes)
    return fail(Result::kConfigMismatch,
                "the node-shared store state local rank 0 made has %" PRIu64 " bytes; this rank's spec needs %" PRIu64,
                static_cast<uint64_t>(st.st_size), bytes);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return fail(Result::kSystem, "mmap(store state, %" PRIu64 " bytes): %s", bytes, strerror(errno));
  NodeState s;
  s.base_ = m;
  s.bytes_ = bytes;
  *out = std::move(s);
  return Result::kOk;
}

Result NodeState::make_private(uint64_t bytes, NodeState* out) {
  UCM_CHECK(check_size(bytes));
  // Untouched pages cost nothing: a large, sparsely used table stays cheap.
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return fail(Result::kSystem, "mmap(private store state, %" PRIu64 " bytes): %s", bytes, strerror(errno));
  NodeState s;
  s.base_ = m;
  s.bytes_ = bytes;
  *out = std::move(s);
  return Result::kOk;
}

}  // namespace ucm
