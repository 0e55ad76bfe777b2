// ucm_demo's bound (issue 15, goal 2): what the store and this cache size allow,
// measured in the same run as the decode it judges.
//
//   min loads    Belady's MIN: the fewest backend loads a cache of C slots
//                needs to serve the node's sequence of shard requests, starting
//                from what the cache held when decode began. A loaded shard
//                must be held in a slot to be copied (demand paging), and MIN
//                evicts the shard used farthest in the future, which is optimal
//                for that model: no eviction policy loads fewer.
//   raw rate     the read rate of the store's own files by O_DIRECT, in chunks
//                of one shard (rounded up to 4 KiB), on as many threads as the
//                store has I/O threads, with no cache, no copies, no checks.
//                With N ranks on a node each rank has a store of its own, so
//                the node's stores have N times the threads: the bound takes
//                the better of both counts (raw_read_best).
//                The best of several passes (the least disturbed one, on a
//                machine that other work shares), so the bound errs towards
//                asking more of the demo, never less.
//   achievable   min loads x shard bytes / raw rate.
//   cpu bound    the copies every rank must make into its KV buffer (each
//                shard it asks for, once), the node's over min(local ranks,
//                cpus) cores at the memcpy rate measured on that many threads
//                in the same run (memcpy_rate). The larger of the two bounds
//                is the binding one (Bounds).
//
// Header-only, no ucmcache internals: the demo uses the public API only, and
// tests/bench/demo_bound_test.cpp checks belady_min on sequences whose MIN is
// known by hand.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ucm_demo {

// The fewest loads (misses) a cache of `capacity` entries needs to serve `seq`
// in order, when it starts holding `resident` (keys beyond `capacity` of them
// are ignored). Each request of a key not held is a load, and the key is then
// held (evicting the held key whose next request is farthest, or never).
inline uint64_t belady_min(const std::vector<uint64_t>& seq, const std::vector<uint64_t>& resident,
                           uint64_t capacity) {
  if (capacity == 0) return seq.size();
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // next[i]: the position of the next request of seq[i] after i, or kNever.
  std::vector<uint64_t> next(seq.size(), kNever);
  std::unordered_map<uint64_t, uint64_t> first;  // key -> its first request (scan from the end)
  for (size_t i = seq.size(); i-- > 0;) {
    auto it = first.find(seq[i]);
    if (it != first.end()) {
      next[i] = it->second;
      it->second = i;
    } else {
      first.emplace(seq[i], i);
    }
  }
  // Held keys ordered by their next request; `when` maps a held key to it.
  std::set<std::pair<uint64_t, uint64_t>> held;
  std::unordered_map<uint64_t, uint64_t> when;
  for (uint64_t k : resident) {
    if (when.size() >= capacity) break;
    if (when.count(k)) continue;
    auto it = first.find(k);
    const uint64_t w = it == first.end() ? kNever : it->second;
    when.emplace(k, w);
    held.emplace(w, k);
  }
  uint64_t loads = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const uint64_t k = seq[i];
    auto it = when.find(k);
    if (it != when.end()) {
      held.erase({it->second, k});
      it->second = next[i];
      held.emplace(next[i], k);
      continue;
    }
    ++loads;
    if (when.size() >= capacity) {
      auto victim = std::prev(held.end());
      when.erase(victim->second);
      held.erase(victim);
    }
    when.emplace(k, next[i]);
    held.emplace(next[i], k);
  }
  return loads;
}

struct RawRead {
  double best_bytes_per_s = 0;    // the best pass (the bound uses this)
  double median_bytes_per_s = 0;  // the median pass (how noisy the machine was)
  uint64_t bytes_per_pass = 0;
  uint32_t files = 0;
  uint32_t threads = 0;
  int passes = 0;
  bool direct = false;  // false: the file system refused O_DIRECT, read through the page cache
  std::string error;    // not empty: nothing measured, and why
  std::string tried;    // raw_read_best: the thread counts measured, with their best rates
};

// Reads `paths` (at most `max_bytes` of them per pass, in the order given) in
// chunks of `chunk` bytes, rounded up to 4 KiB, on `threads` threads: at least
// `passes` passes, and more until `min_seconds` have passed (at most
// kMaxRawPasses), so a small store is read often enough for its best pass to
// be a quiet one. The files are opened before timing; each pass takes its
// chunks from one shared counter, so the threads keep as many reads in flight
// as the store's I/O threads would.
constexpr int kMaxRawPasses = 1000;

// Runs work(t) on `threads` threads at once, pass after pass: at least
// `passes` of them and until `min_seconds` have passed (at most
// kMaxRawPasses), or until stop() says so after a pass. reset() runs before
// each pass; each pass's rate is bytes() (read after it) over its time, from
// its start to the last thread's end.
template <class Work, class Reset, class Bytes, class Stop>
std::vector<double> timed_passes(uint32_t threads, int passes, double min_seconds, Work&& work, Reset&& reset,
                                 Bytes&& bytes, Stop&& stop) {
  std::atomic<bool> more{true};
  std::barrier sync(static_cast<ptrdiff_t>(threads) + 1);
  auto worker = [&](uint32_t t) {
    for (;;) {
      sync.arrive_and_wait();
      if (!more.load()) return;
      work(t);
      sync.arrive_and_wait();
    }
  };
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  std::vector<double> rates;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < kMaxRawPasses; ++pass) {
    const double so_far = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass >= passes && so_far >= min_seconds) break;
    reset();
    const auto t0 = std::chrono::steady_clock::now();
    sync.arrive_and_wait();  // start
    sync.arrive_and_wait();  // every thread done
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) rates.push_back(double(bytes()) / s);
    if (stop()) break;
  }
  more.store(false);
  sync.arrive_and_wait();  // the workers see `more` and return
  for (auto& t : ts) t.join();
  return rates;
}

// One chunk of a store file that a raw-read pass reads.
struct RawPiece {
  int fd;
  uint64_t off;
};

// Opens `paths` (O_DIRECT while the file system takes it) and cuts them into
// chunks, up to `max_bytes` in all: out's direct, files and bytes_per_pass.
// False (out->error says why) on a file that does not open; the fds opened so
// far are in `fds` either way, for the caller to close.
inline bool raw_open_pieces(const std::vector<std::string>& paths, uint64_t chunk, uint64_t max_bytes, RawRead* out,
                            std::vector<int>* fds, std::vector<RawPiece>* pieces) {
  out->direct = true;
  for (const std::string& p : paths) {
    if (out->bytes_per_pass >= max_bytes) break;
    int fd = out->direct ? open(p.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
    if (fd < 0 && out->direct && errno == EINVAL) out->direct = false;  // this file system takes no O_DIRECT
    if (fd < 0 && !out->direct) fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      out->error = "open " + p + ": " + std::strerror(errno);
      return false;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      continue;
    }
    fds->push_back(fd);
    ++out->files;
    for (uint64_t off = 0; off < static_cast<uint64_t>(st.st_size) && out->bytes_per_pass < max_bytes; off += chunk) {
      pieces->push_back({fd, off});
      out->bytes_per_pass += std::min<uint64_t>(chunk, static_cast<uint64_t>(st.st_size) - off);
    }
  }
  return true;
}

// raw_read_rate's result from its passes' rates and what went wrong in them.
inline void raw_finish(std::vector<double> rates, bool direct_refused, int read_error, RawRead* out) {
  if (direct_refused) out->direct = false;
  if (read_error != 0) {
    out->error = std::string("read: ") + std::strerror(read_error);
    return;
  }
  if (rates.empty()) {
    out->error = "no pass timed";
    return;
  }
  out->passes = static_cast<int>(rates.size());
  std::sort(rates.begin(), rates.end());
  out->best_bytes_per_s = rates.back();
  out->median_bytes_per_s = rates[rates.size() / 2];
}

inline RawRead raw_read_rate(const std::vector<std::string>& paths, uint64_t chunk, uint32_t threads, int passes,
                             uint64_t max_bytes, double min_seconds = 0) {
  RawRead out;
  out.threads = threads = std::max<uint32_t>(threads, 1);
  chunk = (std::max<uint64_t>(chunk, 1) + 4095) & ~uint64_t{4095};
  std::vector<int> fds;
  std::vector<RawPiece> pieces;
  auto close_all = [&] {
    for (int fd : fds) close(fd);
    fds.clear();
  };
  if (!raw_open_pieces(paths, chunk, max_bytes, &out, &fds, &pieces)) {
    close_all();
    return out;
  }
  if (pieces.empty()) {
    out.error = "no store files to read";
    close_all();
    return out;
  }
  std::vector<void*> bufs(threads, nullptr);
  for (auto& b : bufs)
    if (posix_memalign(&b, 4096, chunk) != 0) b = nullptr;
  if (std::any_of(bufs.begin(), bufs.end(), [](void* b) { return b == nullptr; })) {
    for (void* b : bufs) std::free(b);
    close_all();
    out.error = "out of memory for the read buffers";
    return out;
  }
  // A direct read the file system still refuses (alignment) is redone through
  // the page cache for the rest of the run, as the store does, and reported.
  std::atomic<bool> direct_refused{false};
  std::atomic<int> read_error{0};
  std::atomic<size_t> cursor{0};
  std::atomic<uint64_t> got{0};
  auto work = [&](uint32_t t) {
    for (size_t i; (i = cursor.fetch_add(1, std::memory_order_relaxed)) < pieces.size();) {
      ssize_t n = pread(pieces[i].fd, bufs[t], chunk, static_cast<off_t>(pieces[i].off));
      if (n < 0 && errno == EINVAL) {
        direct_refused.store(true);
        const int fl = fcntl(pieces[i].fd, F_GETFL);
        if (fl >= 0) (void)fcntl(pieces[i].fd, F_SETFL, fl & ~O_DIRECT);
        n = pread(pieces[i].fd, bufs[t], chunk, static_cast<off_t>(pieces[i].off));
      }
      if (n < 0) read_error.store(errno);
      else got.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
  };
  auto reset = [&] {
    cursor.store(0);
    got.store(0);
  };
  std::vector<double> rates = timed_passes(
      threads, passes, min_seconds, work, reset, [&] { return got.load(); }, [&] { return read_error.load() != 0; });
  for (void* b : bufs) std::free(b);
  close_all();
  raw_finish(std::move(rates), direct_refused.load(), read_error.load(), &out);
  return out;
}

// raw_read_rate on each thread count in `threads` (duplicates and zeros
// skipped), in the order given; the one with the best pass is returned, and
// `tried` lists each count with its best rate ("8 threads 1.37 GB/s, ..."). An
// error on any count is returned as that count's result.
inline RawRead raw_read_best(const std::vector<std::string>& paths, uint64_t chunk, std::vector<uint32_t> threads,
                             int passes, uint64_t max_bytes, double min_seconds = 0) {
  RawRead best;
  std::string tried;
  std::vector<uint32_t> seen;
  for (uint32_t t : threads) {
    t = std::max<uint32_t>(t, 1);
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    RawRead r = raw_read_rate(paths, chunk, t, passes, max_bytes, min_seconds);
    if (!r.error.empty()) return r;
    char line[64];
    std::snprintf(line, sizeof(line), "%s%u threads %.2f GB/s", tried.empty() ? "" : ", ", t, r.best_bytes_per_s / 1e9);
    tried += line;
    if (best.passes == 0 || r.best_bytes_per_s > best.best_bytes_per_s) best = r;
  }
  best.tried = tried;
  return best;
}

// ---- the cpu bound --------------------------------------------------------
// What the cpus allow, beside what the store allows: each rank must copy every
// shard it asks for into its KV buffer (the copy an engine cannot skip; the
// demo's verification and the store's checksums are extra work on top). The
// node's copies run on at most min(local ranks, cpus) cores at once, so
//   cpu bound = local ranks x bytes per rank / memcpy rate on that many cores,
// the rate measured here: `threads` threads at once, each copying a buffer of
// `bytes` (larger than the last-level cache: memory speed, as the copies from
// the cache's data plane are) into another, at least `passes` passes and
// `min_seconds`. The best rate is each thread's best copy (bytes over its own
// time) summed over the threads: on a machine other work shares, a pass where
// no thread at all was disturbed is rare, a best copy per thread (made while
// the others copy too) is not; so the bound errs towards asking more. The
// median is the median pass's (all threads' bytes over the slowest thread's
// time): how noisy the machine was.
struct CopyRate {
  double best_bytes_per_s = 0;    // every thread together: the sum of each one's best copy
  double median_bytes_per_s = 0;
  uint64_t bytes_per_thread = 0;
  uint32_t threads = 0;
  int passes = 0;
  std::string error;  // not empty: nothing measured, and why
};

inline CopyRate memcpy_rate(uint32_t threads, uint64_t bytes, int passes, double min_seconds = 0) {
  CopyRate out;
  out.threads = threads = std::max<uint32_t>(threads, 1);
  out.bytes_per_thread = bytes = std::max<uint64_t>(bytes, 4096);
  std::vector<std::vector<uint8_t>> src(threads), dst(threads);
  try {
    for (uint32_t t = 0; t < threads; ++t) {
      src[t].assign(bytes, uint8_t(t + 1));  // written once: no page is faulted in a timed pass
      dst[t].assign(bytes, 0);
    }
  } catch (const std::bad_alloc&) {
    out.error = "out of memory for the copy buffers";
    return out;
  }
  std::vector<double> fastest(threads, 0);  // each thread's shortest copy, seconds (its own slot)
  auto copy = [&](uint32_t t) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst[t].data(), src[t].data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0 && (fastest[t] == 0 || s < fastest[t])) fastest[t] = s;
  };
  std::vector<double> rates =
      timed_passes(threads, passes, min_seconds, copy, [] {}, [&] { return bytes * threads; }, [] { return false; });
  if (rates.empty()) {
    out.error = "no pass timed";
    return out;
  }
  for (uint32_t t = 0; t < threads; ++t)
    if (dst[t][bytes - 1] != uint8_t(t + 1)) out.error = "a copy did not land";  // nor can the compiler drop it
  if (!out.error.empty()) return out;
  out.passes = static_cast<int>(rates.size());
  std::sort(rates.begin(), rates.end());
  for (double s : fastest) out.best_bytes_per_s += s > 0 ? double(bytes) / s : 0;
  out.best_bytes_per_s = std::max(out.best_bytes_per_s, rates.back());
  out.median_bytes_per_s = rates[rates.size() / 2];
  return out;
}

// The two bounds side by side: which one the decode cannot beat.
struct Bounds {
  double store_s = 0;  // achievable: the store's (fewest loads at the raw read rate)
  double cpu_s = 0;    // the copies' (cpu bound above)
  double binding_s() const { return std::max(store_s, cpu_s); }
  const char* binding() const { return cpu_s > store_s ? "cpu" : "store"; }
};

// ---- the decode pipeline ------------------------------------------------------
// ucm_demo's decode runs positions pos = step * layers + layer in order, with
// up to `window` layer tasks in flight, each loading into part pos % parts of
// the KV buffer (parts layers of it). run_pipeline calls submit(pos) and
// complete(pos) (wait, verify) in the order the demo does: positions pos + 1
// .. pos + window - 1 are submitted before pos completes. A part is loaded
// again only after its last position completed (parts >= window), and what
// it holds then is another layer's bytes (kv_parts_for), or nothing
// (clear_after_check), so a load that wrote nothing fails its check.

// The parts a window needs: one per task in flight, one more where that
// number is a multiple of the layers (a part would receive the same layer as
// the step before, whose bytes a silent failure would leave there).
inline int kv_parts_for(int window, int layers) {
  int parts = window;
  if (layers > 1 && parts % layers == 0) ++parts;
  return parts;
}
// Whether each part must be cleared after its check: it would otherwise next
// receive the layer it holds (always so with one layer).
inline bool clear_after_check(int parts, int layers) { return layers <= 1 || parts % layers == 0; }

template <class Submit, class Complete>
void run_pipeline(int total, int window, Submit&& submit, Complete&& complete) {
  int next = 0;
  for (int pos = 0; pos < total; ++pos) {
    while (next < total && next < pos + window) submit(next++);
    complete(pos);
  }
}

}  // namespace ucm_demo
