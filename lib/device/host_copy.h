// The CPU's copy of a shard (the host engine's, and so the inline path's and
// a dump's): memcpy, except between buffers that are misaligned to each other.
//
// A cache slot is page-aligned; an application's buffer often is not (malloc
// and std::vector give 16 bytes past a page for large blocks). Between such
// buffers glibc's memcpy (rep movsb above a few KiB) runs at 0.4-0.8x its
// speed between buffers aligned alike on this project's AMD EPYC VMs (256 KiB
// shards: 7 GB/s against 18). A loop of unaligned 32-byte loads and aligned
// stores runs as fast misaligned as memcpy does aligned there, so host_copy
// takes it when the two addresses differ modulo 64, the size is between
// kVectorCopyMin and kVectorCopyMax (above, memcpy's non-temporal stores win),
// the CPU has AVX2, and the loop won on this CPU; otherwise it is memcpy.
// Which one wins depends on the CPU: on an Intel Xeon (AVX-512) glibc's
// memcpy avoids its slow case itself and beat the loop by 2-17% for 16 KiB
// shards in the CPU's caches. So the cache measures both at init for its
// shard size (calibrate_host_copy) and keeps the faster; until then, and
// where nothing measured, the loop is taken as before. bench/ucm_copy_bench
// compares the two side by side. Same contract as memcpy: the buffers do not
// overlap.
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

// What calibrate_host_copy measured: the best rate of each path for `bytes`
// copies from a page-aligned source into a destination 16 bytes past a page
// (malloc's), in GB/s, and whether the vector loop is kept.
struct CopyCalibration {
  uint64_t bytes = 0;  // 0: nothing measured (the size takes memcpy anyway, or no AVX2)
  double memcpy_gbs = 0;
  double vector_gbs = 0;
  bool vector = true;
};
// The vector loop must beat memcpy by this much to be kept (memcpy is the
// simpler path, and the two are measured on a machine that may be busy).
constexpr double kVectorCopyMargin = 1.02;

// Measures both paths for shards of `bytes`, interleaved, on a working set
// that stays in the CPU's caches (the inline path's case), the best of
// several passes each, about a millisecond in all; then host_copy takes the
// faster for mutually misaligned buffers of any size, process-wide.
CopyCalibration calibrate_host_copy(uint64_t bytes);
// Whether the vector loop is taken for misaligned buffers (calibrate_host_copy
// sets it; tests too).
bool vector_copy_preferred();
void set_vector_copy_preferred(bool vector);

void host_copy(void* dst, const void* src, size_t bytes);

// How many of this thread's host_copy calls took the vector path (tests).
uint64_t vector_copies_on_this_thread();

// The vector loop itself, whatever the alignment (for the benchmark and the
// tests); only where vector_copy_available().
void vector_copy(void* dst, const void* src, size_t bytes);

}  // namespace ucm
