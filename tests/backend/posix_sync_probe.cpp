// posix_sync_probe DIR: dumps shards 0 and 1 of one block through a posix store
// with sync=1, then shard 0 again (the file exists by then), and loads them
// back. posix_sync_test.py runs it under strace and checks the order of the
// writes and syncs: what a dump that returned OK has made durable.
#include <cstdio>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/backend_test_util.h"

using namespace ucm;
using namespace ucm::test;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: posix_sync_probe DIR\n");
    return 2;
  }
  constexpr uint64_t kBytes = 4096;
  BackendContext c;
  c.shard_bytes = kBytes;
  c.shards_per_block = 2;
  std::unique_ptr<Backend> b;
  if (make_backend(std::string("posix:") + argv[1] + ",sync=1", c, &b) != Result::kOk) {
    std::fprintf(stderr, "posix_sync_probe: %s\n", last_error().c_str());
    return 1;
  }
  AlignedBuf buf(kBytes);
  for (uint32_t s : {0u, 1u, 0u}) {
    const Key k = key(7, s);
    sim_fill(k, buf.get(), kBytes);
    std::printf("dump shard %u\n", s);
    std::fflush(stdout);
    const SyncResult r = dump_sync(b.get(), k, buf.get(), kBytes);
    if (r.result != Result::kOk) {
      std::fprintf(stderr, "posix_sync_probe: dump of shard %u: %s\n", s, r.error.c_str());
      return 1;
    }
  }
  for (uint32_t s : {0u, 1u}) {
    const SyncResult r = load_sync(b.get(), key(7, s), buf.get(), kBytes);
    if (r.result != Result::kOk || sim_verify(key(7, s), buf.get(), kBytes) != kBytes) {
      std::fprintf(stderr, "posix_sync_probe: shard %u does not read back\n", s);
      return 1;
    }
  }
  std::printf("ok\n");
  return 0;
}
