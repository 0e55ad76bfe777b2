// The table of memory a store's io_uring has registered (posix_uring.h): the
// regions a load may land in (BackendContext::buffers), cut into chunks the
// kernel takes as one registered buffer each, sorted by address, and the
// lookup of the chunk that holds a read's whole destination. A pure table: it
// registers nothing and owns none of the memory it describes.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ucm {

// The most one registered buffer may hold: the kernel refuses a bigger one.
constexpr uint64_t kMaxFixedChunk = uint64_t{1} << 30;

class FixedBuffers {
 public:
  FixedBuffers() = default;
  // Regions of zero bytes are dropped; a region above `max_chunk` becomes
  // several chunks, each at most `max_chunk`.
  FixedBuffers(const std::vector<std::pair<void*, uint64_t>>& regions, uint64_t max_chunk = kMaxFixedChunk);

  // What io_uring_register_buffers takes: chunk i is buffer index i.
  const std::vector<iovec>& iovecs() const { return chunks_; }
  bool empty() const { return chunks_.empty(); }
  void clear() { chunks_.clear(); }
  // The index of the chunk that holds all of [p, p + n), or -1 (none does:
  // outside every chunk, or across two).
  int find(const void* p, uint64_t n) const;

 private:
  std::vector<iovec> chunks_;
};

}  // namespace ucm
