// The CPU's copy of a shard (the host engine's, and so the inline path's and
// a dump's): memcpy, except between buffers that are misaligned to each other.
//
// A cache slot is page-aligned; an application's buffer often is not (malloc
// and std::vector give 16 bytes past a page for large blocks). Between such
// buffers glibc's memcpy (rep movsb above a few KiB) runs at 0.4-0.8x its
// speed between buffers aligned alike on this project's AMD EPYC VMs (256 KiB
// shards: 7 GB/s against 18). A loop of unaligned 32-byte loads and aligned
// stores runs as fast misaligned as memcpy does aligned, so host_copy takes it
// when the two addresses differ modulo 64, the size is between
// kVectorCopyMin and kVectorCopyMax (above, memcpy's non-temporal stores win)
// and the CPU has AVX2; otherwise it is memcpy. bench/ucm_copy_bench compares
// the two side by side. Same contract as memcpy: the buffers do not overlap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucm {

enum class CopyPath { kMemcpy, kVector };

constexpr size_t kVectorCopyMin = 256;
constexpr size_t kVectorCopyMax = size_t{4} << 20;

// Whether this CPU can take the vector path (AVX2), asked once.
bool vector_copy_available();

// The path host_copy takes for these arguments.
CopyPath host_copy_path(const void* dst, const void* src, size_t bytes);

void host_copy(void* dst, const void* src, size_t bytes);

// How many of this thread's host_copy calls took the vector path (tests).
uint64_t vector_copies_on_this_thread();

// The vector loop itself, whatever the alignment (for the benchmark and the
// tests); only where vector_copy_available().
void vector_copy(void* dst, const void* src, size_t bytes);

}  // namespace ucm
