"""The Python layer's per-shard overhead against the C API, in one process.

    mpirun -np 1 /usr/bin/python3 bench/python_overhead.py [--shard-kib 16,1024]
        [--batches 64,256] [--reps 2000] [--rounds 5] [--tiny]

For each shard size and batch, on one warm cache (every shard a hit, host
engine, so a task is the library's work plus memcpy), it times the same load
task three ways, interleaved round by round in the same process:
  c       the C API from C: entries built per task, ucm_load_task, ucm_task_wait
          (a loop inside the compiled module, without the GIL)
  list    cache.load(keys, [one numpy view per shard]).wait(): the engine's
          shape (a KEY_DTYPE array of keys, one buffer per page)
  array   cache.load(keys, one (batch, shard) numpy array).wait()
and prints per-shard microseconds (the median round) and the ratios
python/c. Target (issue 13): list/c <= 1.10 for batches of 64 or more 16 KiB
shards. --tiny checks that it runs (a few reps, not a measurement).
"""
import argparse
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import ucmcache


def run(shard, batch, reps, rounds, store):
    cfg = dict(shard_bytes=shard, shards_per_block=64, cache_bytes=max(64 << 20, 2 * batch * shard),
               reserved_slots=64, copy_engine="host", backend="posix:" + store)
    with ucmcache.Cache(MPI.COMM_SELF, **cfg) as cache:
        keys = ucmcache.make_keys([ucmcache.block_id(1 + i // 64) for i in range(batch)], np.arange(batch) % 64)
        src = np.random.default_rng(1).integers(0, 256, (batch, shard), dtype=np.uint8)
        cache.dump(keys, src).wait()
        out = np.zeros_like(src)
        views = [out[i] for i in range(batch)]
        cache.load(keys, out).wait()
        assert np.array_equal(out, src), "the warm-up load is wrong"

        def py_list():
            t0 = time.perf_counter()
            for _ in range(reps):
                cache.load(keys, views).wait()
            return time.perf_counter() - t0

        def py_array():
            t0 = time.perf_counter()
            for _ in range(reps):
                cache.load(keys, out).wait()
            return time.perf_counter() - t0

        def c_loop():
            return cache._native._bench_c_loads(keys, out, reps)

        c_loop(), py_list(), py_array()  # warm: page faults, allocator, caches
        times = {"c": [], "list": [], "array": []}
        for _ in range(rounds):  # interleaved, so drift hits every way alike
            times["c"].append(c_loop())
            times["list"].append(py_list())
            times["array"].append(py_array())
        assert np.array_equal(out, src)
        per = {k: statistics.median(v) / (reps * batch) * 1e6 for k, v in times.items()}
        hits = cache.stats().hits
    return per, hits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard-kib", default="16,1024")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="a few reps: checks that it runs, measures nothing")
    o = ap.parse_args(argv)
    if o.tiny:
        o.reps, o.rounds, o.shard_kib = 3, 1, "16"
    store = tempfile.mkdtemp(prefix="ucm_pybench.")
    worst = 0.0
    try:
        print("python_overhead: ucmcache %s, per-shard us (median of %d rounds of %d tasks), ratio python/c"
              % (ucmcache.version, o.rounds, o.reps))
        for kib in [int(x) for x in o.shard_kib.split(",")]:
            for batch in [int(x) for x in o.batches.split(",")]:
                reps = max(1, o.reps * 16 // kib) if kib > 16 else o.reps
                per, hits = run(kib << 10, batch, reps, o.rounds, store)
                r_list, r_array = per["list"] / per["c"], per["array"] / per["c"]
                print("  shard %5d KiB batch %4d: c %.3f us, list %.3f us, array %.3f us per shard; "
                      "ratio python/c %.3f (list), %.3f (array)%s"
                      % (kib, batch, per["c"], per["list"], per["array"], r_list, r_array,
                         "  [target <= 1.10]" if kib == 16 and batch >= 64 else ""))
                if kib == 16 and batch >= 64:
                    worst = max(worst, r_list)
        print("python_overhead: worst 16 KiB ratio python/c %.3f (target <= 1.10)%s"
              % (worst, "; --tiny: not a measurement" if o.tiny else ""))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
