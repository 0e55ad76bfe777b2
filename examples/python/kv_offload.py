"""An inference engine's KV offloading connector, on ucmcache.

    mpirun -np 4 /usr/bin/python3 examples/python/kv_offload.py [--torch] [--small]

The engine keeps a paged KV tensor per layer: kv[layer] has shape
(num_pages, 2, page_tokens, heads, head_dim) (K and V of every page). A page
of a prompt is identified by a chained hash of its tokens (the prefix hash of
vLLM and SGLang): block id = blake2b(parent id + tokens, 16 bytes). The cache
shards a block by layer: key (block id, layer) holds kv[layer][page], so a
decode step can load one layer while the previous one computes.

  prefill  the engine computes the KV of each prompt's pages (random here),
           then dumps every (block, layer) shard: one task per layer, its
           sources views of kv[layer]
  offload  the pages are freed (the GPU memory reused: zeroed here)
  decode   a request for the same prompts finds its blocks (lookup), and
           loads them back layer by layer into newly allocated pages: the
           load of layer l + 1 is submitted before layer l is waited for,
           as a connector overlaps loading with attention

Every rank of a node runs the same prompts (tensor parallel ranks share the
prefix): each shard is read from the store once per node. numpy by default;
--torch uses torch tensors (CPU) when torch is installed, through DLPack.
"""

import argparse
import hashlib
import shutil
import sys
import tempfile

import numpy as np
from mpi4py import MPI

import ucmcache


def block_ids(tokens, page_tokens):
    """The chained hash of each full page of a prompt's tokens."""
    ids, parent = [], b""
    for p in range(len(tokens) // page_tokens):
        page = np.asarray(tokens[p * page_tokens:(p + 1) * page_tokens], np.int32).tobytes()
        parent = hashlib.blake2b(parent + page, digest_size=16).digest()
        ids.append(parent)
    return ids


class PagedKV:
    """One paged KV tensor per layer, numpy or torch."""

    def __init__(self, layers, pages, page_tokens, heads, head_dim, use_torch):
        shape = (pages, 2, page_tokens, heads, head_dim)
        if use_torch:
            import torch
            self.kv = [torch.zeros(shape, dtype=torch.float16) for _ in range(layers)]
        else:
            self.kv = [np.zeros(shape, np.float16) for _ in range(layers)]
        self.torch = use_torch
        self.page_bytes = 2 * page_tokens * heads * head_dim * 2

    def pages_of(self, layer, page_ids):
        """The pages as buffers of one shard each (views: no copy)."""
        return [self.kv[layer][p] for p in page_ids]

    def as_numpy(self, layer):
        return self.kv[layer].numpy() if self.torch else self.kv[layer]

    def fill_random(self, layer, page_ids, rng):
        a = self.as_numpy(layer)
        for p in page_ids:
            a[p] = rng.standard_normal(a[p].shape).astype(np.float16)

    def clear(self):
        for layer in range(len(self.kv)):
            self.as_numpy(layer)[:] = 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", action="store_true", help="torch tensors (CPU) instead of numpy arrays")
    ap.add_argument("--small", action="store_true", help="a tiny model (tests)")
    ap.add_argument("--store", default="", help="posix store directory (default: a fresh temporary one)")
    o = ap.parse_args(argv)
    if o.torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("kv_offload: --torch needs torch (python3-torch); it is not installed", file=sys.stderr)
            return 2
    layers, heads, head_dim, page_tokens, prompts, prompt_pages = (4, 2, 16, 16, 3, 4) if o.small else \
        (16, 8, 64, 16, 8, 16)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    store = (o.store or tempfile.mkdtemp(prefix="kv_offload.")) if rank == 0 else None
    store = comm.bcast(store, root=0)

    pages = prompts * prompt_pages
    kv = PagedKV(layers, pages, page_tokens, heads, head_dim, o.torch)
    # Every rank sees the same prompts (same seed): tensor-parallel ranks.
    rng = np.random.default_rng(7)
    requests = [rng.integers(0, 32000, prompt_pages * page_tokens) for _ in range(prompts)]
    blocks = [b for tokens in requests for b in block_ids(tokens, page_tokens)]
    page_of_block = list(range(pages))  # the page each block sits in during prefill
    ok = True
    try:
        with ucmcache.Cache(comm, shard_bytes=kv.page_bytes, shards_per_block=layers,
                            cache_bytes=max(8 << 20, 2 * pages * layers * kv.page_bytes), copy_engine="host",
                            backend="posix:" + store) as cache:
            # ---- prefill: compute, then dump each layer's pages -------------
            saved = []
            for layer in range(layers):
                kv.fill_random(layer, page_of_block, np.random.default_rng(100 + layer))
                saved.append(kv.as_numpy(layer).copy())
            dumps = [cache.dump([(b, layer) for b in blocks], kv.pages_of(layer, page_of_block))
                     for layer in range(layers)]
            for t in dumps:
                t.wait()
            comm.Barrier()

            # ---- offload: the pages are reused -------------------------------
            kv.clear()

            # ---- decode: find the blocks, load layer by layer ----------------
            keys = ucmcache.make_keys(blocks, 0)
            where = cache.lookup(keys)
            assert (where != ucmcache.WHERE_NONE).all(), "a dumped block is missing"
            new_pages = list(reversed(range(pages)))  # a different page for each block now
            cache.touch(blocks)
            pending = cache.load([(b, 0) for b in blocks], kv.pages_of(0, new_pages))
            for layer in range(layers):
                nxt = None
                if layer + 1 < layers:  # overlap: the next layer's load is in flight
                    nxt = cache.load([(b, layer + 1) for b in blocks], kv.pages_of(layer + 1, new_pages))
                pending.wait()
                got = kv.as_numpy(layer)
                for i, b in enumerate(blocks):  # "attention" on layer `layer`
                    if not np.array_equal(got[new_pages[i]].view(np.uint16), saved[layer][page_of_block[i]].view(np.uint16)):
                        ok = False
                pending = nxt
            node = cache.stats(node=True)
            if rank == 0:
                print("kv_offload: %d ranks, %d layers x %d blocks of %d KiB (%s), node: %d loads from the store, "
                      "%d hits" % (comm.Get_size(), layers, len(blocks), kv.page_bytes >> 10,
                                   "torch" if o.torch else "numpy", node.owner_loads, node.hits))
    finally:
        comm.Barrier()
        if rank == 0 and not o.store:
            shutil.rmtree(store, ignore_errors=True)
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print("kv_offload: every layer of every block came back byte for byte" if ok else "kv_offload: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
