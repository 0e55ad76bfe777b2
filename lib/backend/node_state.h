// Memory a store shares among the ranks of one node.
//
// Some stores keep state that must be the node's, not a process's: the sim
// store's set of dumped keys is the first (a key rank 0 dumped exists for rank
// 1 too). A store says how many bytes it needs (backend_node_state_bytes in
// backend.h, a pure function of the spec, so every rank of the node computes
// the same number); local rank 0 creates a memfd of that size next to the
// cache's planes, the boot socket hands it to the peers with the planes' fds,
// and every rank maps it and passes base and size to its store in
// BackendContext. The memory starts zeroed; its layout belongs to the store.
//
// A NodeState owns one mapping (and, on the creator until it has handed the
// fd out, the fd). Nothing is created in any file system: the memfd is
// anonymous and goes away with the last rank that maps it. A process that is
// not part of a node (a test, a benchmark) makes a private one instead, so a
// store never needs two code paths.
#pragma once

#include <cstdint>

#include "common/result.h"

namespace ucm {

class NodeState {
 public:
  NodeState() = default;
  ~NodeState();
  NodeState(NodeState&& o) noexcept;
  NodeState& operator=(NodeState&& o) noexcept;
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  // A zeroed memfd of `bytes`, sealed against resizing, mapped shared; the fd
  // stays open for handing out (close_fd() once done).
  [[nodiscard]] static Result create(uint64_t bytes, NodeState* out);
  // Maps a memfd another rank created; its size must be `bytes` exactly.
  // Does not take `fd` (the caller closes it).
  [[nodiscard]] static Result attach(int fd, uint64_t bytes, NodeState* out);
  // Zeroed memory of one process (anonymous, never shared).
  [[nodiscard]] static Result make_private(uint64_t bytes, NodeState* out);

  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  bool valid() const { return base_ != nullptr; }
  void close_fd();

 private:
  void reset();
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  int fd_ = -1;
};

}  // namespace ucm
