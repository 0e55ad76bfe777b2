"""python -m ucmcache.demo: the main job (ucm_demo) from Python.

    mpirun -np 4 /usr/bin/python3 -m ucmcache.demo [--prompts 32] [--layers 16]
        [--shard-kib 256] [--cache-mib 48] [--steps 3] [--hot 4] [--store DIR]
        [--backend SPEC]

The same workload as ucm_demo, through the Python package: every rank dumps
the KV shards of a set of prompts (one shard per layer) in prefill, then
decode steps load them back layer by layer into numpy arrays, touching the
hot shared-prefix blocks first, and verify every byte. The KV content and the
block ids are ucm_demo's (the same function of block, layer and offset), and
rank 0 prints the same summary.
"""

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import ucmcache

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
MAX_LAYERS = 1 << 16


def _mix64(z):
    """splitmix64's finalizer (apps/demo_kv.h mix64), on uint64 arrays."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def kv_seed(block, layer):
    """ucm_demo's kv_seed(block, layer) (apps/demo_kv.h)."""
    return int(_mix64(np.array([(1 << 63) | (block << 16) | (layer & (MAX_LAYERS - 1))], np.uint64))[0])


@functools.lru_cache(maxsize=4)
def _offset_words(n):
    t = _mix64(np.arange(n, dtype=np.uint64))
    t.setflags(write=False)
    return t


def kv_words(block, layer, n):
    """ucm_demo's kv_word(block, layer, i) for i in [0, n), as uint64: the
    seed of (block, layer) xor a table of offset words computed once."""
    return _offset_words(n) ^ np.uint64(kv_seed(block, layer))


def kv_word(block, layer, i):
    return int(kv_words(block, layer, i + 1)[i])


def block_of(prompt):
    """ucm_demo's block_id(prompt): block_id_word halves 0 and 1, little-endian."""
    lo, hi = (int(x) for x in _mix64(np.array([(1 << 62) | (prompt << 1) | h for h in (0, 1)], np.uint64)))
    return lo.to_bytes(8, "little") + hi.to_bytes(8, "little")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m ucmcache.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--shard-kib", type=int, default=256)
    p.add_argument("--cache-mib", type=int, default=48)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hot", type=int, default=4)
    p.add_argument("--store", default="")
    p.add_argument("--backend", default="")
    o = p.parse_args(argv)
    if (o.prompts < 1 or o.layers < 1 or o.shard_kib < 4 or o.cache_mib < 1 or o.steps < 1 or o.hot < 0
            or o.hot > o.prompts or o.layers > MAX_LAYERS):
        p.error("out-of-range option (1 <= layers <= %d; prompts >= 1; shard-kib >= 4; 0 <= hot <= prompts)"
                % MAX_LAYERS)
    return o


def main(argv=None, comm=None):
    """Runs the demo on ``comm`` (default COMM_WORLD); returns the exit code."""
    o = parse(sys.argv[1:] if argv is None else argv)
    comm = comm or MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    store, own_store = "", False
    if not o.backend:
        if rank == 0:
            store = o.store or tempfile.mkdtemp(prefix="ucm_demo.", dir="/tmp")
            own_store = not o.store
        store = comm.bcast(store, root=0)
    config = {"shard_bytes": o.shard_kib << 10, "shards_per_block": o.layers}
    # Host destinations (every byte is verified on the CPU): the host engine
    # even on a node with GPUs, as ucm_demo.
    if "UCM_COPY_ENGINE" not in os.environ:
        config["copy_engine"] = "host"
    if "UCM_CACHE_BYTES" not in os.environ:
        config["cache_bytes"] = o.cache_mib << 20
    if o.backend:
        config["backend"] = o.backend
    elif "UCM_BACKEND" not in os.environ:
        config["backend"] = "posix:" + store
    try:
        rc = run(comm, o, config)
    finally:
        comm.Barrier()
        if own_store:
            shutil.rmtree(store, ignore_errors=True)
    return rc


def run(comm, o, config):
    rank, size = comm.Get_rank(), comm.Get_size()
    with ucmcache.Cache(comm, **config) as cache:
        info = cache.info()
        shard = cache.shard_bytes
        backend = cache.config["backend"]
        if rank == 0:
            print("ucmcache.demo: %d ranks (%d per node, %d nodes), %d prompts x %d layers x %d KiB = %.1f MiB of KV, "
                  "cache %.1f MiB per node, store %s, copy engine %s"
                  % (size, info.local_size, info.node_count, o.prompts, o.layers, shard >> 10,
                     o.prompts * o.layers * shard / (1 << 20), cache.config["cache_bytes"] / (1 << 20), backend,
                     info.copy_engine), flush=True)
        blocks = [block_of(p) for p in range(o.prompts)]
        words = shard // 8
        kv = np.zeros((o.prompts, words), np.uint64)  # one row per prompt: its shard of a layer

        # ---- prefill: dump every prompt's KV, layer by layer ----
        t0 = time.monotonic()
        for layer in range(o.layers):
            for p in range(o.prompts):
                kv[p] = kv_words(p, layer, words)
            keys = ucmcache.make_keys(blocks, layer)
            cache.dump(keys, kv).wait()
        comm.Barrier()
        prefill_s = time.monotonic() - t0

        # ---- decode: load the prompts back, layer by layer ----
        hot = blocks[:o.hot]
        kv[:] = 0
        bad = tasks = 0
        t0 = time.monotonic()
        for step in range(o.steps):
            if hot:
                cache.touch(hot)
            for layer in range(o.layers):
                keys = ucmcache.make_keys(blocks, layer)
                cache.load(keys, kv).wait()
                tasks += 1
                for p in range(o.prompts):
                    if not np.array_equal(kv[p], kv_words(p, layer, words)):
                        bad += 1
                if o.layers == 1:
                    kv[:] = 0  # the next load is the same layer: a load that wrote nothing must not pass
            comm.Barrier()
            if rank == 0:
                ns = cache.stats(node=True)
                print("  decode step %d/%d: %d backend loads, %d hits, %d evictions so far (node 0)"
                      % (step + 1, o.steps, ns.owner_loads, ns.hits, ns.evictions), flush=True)
        decode_s = time.monotonic() - t0

        # ---- summary ----
        mine, node = cache.stats(), cache.stats(node=True)
        leader = info.local_rank == 0
        bad_all = comm.reduce(bad, op=MPI.SUM, root=0)
        loads_all = comm.reduce(node.owner_loads if leader else 0, op=MPI.SUM, root=0)
        leaders = comm.reduce(1 if leader else 0, op=MPI.SUM, root=0)
        gbps = mine.bytes_to_device / decode_s / 1e9
        gbps_all = comm.reduce(gbps, op=MPI.SUM, root=0)
        if rank == 0:
            unique = o.prompts * o.layers
            asked = node.hits + node.owner_loads + node.waits
            print("ucm_demo summary (node 0 unless said):")
            print("  prefill: %.3f s, %d shards written through once per node (%.0f unique)"
                  % (prefill_s, node.dumps, unique))
            print("  decode:  %d tasks per rank in %.3f s, hit rate %.1f%%, waits %d, evictions %d, "
                  "prealloc %d made / %d used"
                  % (tasks, decode_s, 100.0 * node.hits / asked if asked else 0.0, node.waits, node.evictions,
                     node.prealloc_made, node.prealloc_used))
            print("  backend loads per unique shard per node: %.2f (%d loads over %d nodes)"
                  % (loads_all / leaders / unique, loads_all, leaders))
            print("  copy bandwidth: %.2f GB/s per rank, %.2f GB/s all ranks" % (gbps, gbps_all))
            print("  task latency: p50 <= %d us, p90 <= %d us, p99 <= %d us"
                  % (node.latency_p50_us, node.latency_p90_us, node.latency_p99_us))
            print("  verification: %s (%d bad shards)" % ("every byte right" if bad_all == 0 else "FAILED", bad_all),
                  flush=True)
        bad_any = comm.allreduce(bad, op=MPI.SUM)
    return 0 if bad_any == 0 else 1


if __name__ == "__main__":
    try:
        code = main()
    except ucmcache.UcmError as e:
        print("ucmcache.demo rank %d: %s: %s" % (MPI.COMM_WORLD.Get_rank(), type(e).__name__, e), file=sys.stderr)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        code = 1
    sys.exit(code)
