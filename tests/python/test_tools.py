"""The demo, the example and the benchmark run (tiny), a rank's SIGKILL
leaves nothing behind, and torch tensors work when torch is installed."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ucmcache
import ucmcache.demo
from conftest import SHARD, SOURCE_ROOT, keys_of, mpirun, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = ["ucm_demo summary (node 0 unless said):", "  prefill: ", "  decode:  ",
           "  backend loads per unique shard per node: ", "  copy bandwidth: ", "  task latency: ",
           "  verification: every byte right (0 bad shards)"]
SMALL = ["--prompts", "6", "--layers", "3", "--shard-kib", "4", "--cache-mib", "1", "--steps", "2", "--hot", "2"]


def test_demo_in_this_job(comm, capsys):
    assert ucmcache.demo.main(SMALL, comm) == 0
    out = capsys.readouterr().out
    if comm.Get_rank() == 0:
        lines = out.splitlines()
        for want in SUMMARY:
            assert any(l.startswith(want) for l in lines), (want, out)
        assert "4 ranks (4 per node, 1 nodes)" in out


def test_demo_module_under_mpirun(rank0):
    r = mpirun(2, [sys.executable, "-m", "ucmcache.demo"] + SMALL)
    assert r.returncode == 0, r.stdout
    assert "verification: every byte right" in r.stdout and "2 ranks" in r.stdout


def test_demo_kv_content_is_ucm_demos():
    # apps/demo_kv.h's words, by a pure-Python reference and by the values
    # tests/bench/demo_bound_test.cpp pins for the C++ (KvGolden).
    w = ucmcache.demo.kv_words(3, 5, 4)
    z = lambda b, l, i: ucmcache.demo.kv_word(b, l, i)
    assert [int(x) for x in w] == [z(3, 5, i) for i in range(4)]
    m = (1 << 64) - 1

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    def ref(block, layer, i):
        return mix((1 << 63) | (block << 16) | layer) ^ mix(i)

    assert [int(x) for x in w] == [ref(3, 5, i) for i in range(4)]
    assert [int(x) for x in w] == [0x77f34b4a4fa65212, 0x21615d575fad57f7, 0xac2173dd758d4698, 0x69a015a7acb27ae2]
    assert z(31, 15, 32767) == 0x65028904d3d80fea
    assert ucmcache.demo.block_of(7) == (0x9a4b96a6b983944b).to_bytes(8, "little") + (0x9321b6d61d2851a5).to_bytes(8, "little")


def test_example_runs(rank0):
    ex = os.path.join(SOURCE_ROOT, "examples", "python", "kv_offload.py")
    r = mpirun(2, [sys.executable, ex, "--small"])
    assert r.returncode == 0, r.stdout
    assert "kv_offload: every layer of every block came back byte for byte" in r.stdout


def test_benchmark_runs_tiny(rank0):
    b = os.path.join(SOURCE_ROOT, "bench", "python_overhead.py")
    r = mpirun(1, [sys.executable, b, "--tiny"])
    assert r.returncode == 0, r.stdout
    assert re.search(r"batch\s+64:.* ratio python/c \d+\.\d+", r.stdout), r.stdout


def test_sigkill_leaves_nothing(rank0):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for private namespaces")
    r = subprocess.run(["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "bash",
                        os.path.join(HERE, "kill_in_namespace.sh"), os.environ.get("UCM_PY_MPIRUN", "mpirun"),
                        sys.executable, os.path.join(HERE, "kill_victim.py")],
                       env=__import__("conftest").clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=150)
    out = r.stdout
    assert "SETUP:" not in out, out
    assert out.count("cache up") == 3, out
    assert "rank 0: PeerDeadError" in out and "rank 1: PeerDeadError" in out, out
    assert "rank(s) 2 died" in out, out  # the dead peer is named
    for what in ("SHM", "TMP", "SOCKETS", "PROCS"):
        m = re.search(r"^%s:\[(.*)\]$" % what, out, re.M)
        assert m is not None, out
        assert m.group(1).strip() == "", "%s left behind: %s\n%s" % (what, m.group(1), out)


def torch_or_skip():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (python3-torch is optional: it pulls ~446 packages)")
    import torch
    return torch


def test_torch_tensors(comm, cache):
    torch = torch_or_skip()
    keys = keys_of(700 + comm.Get_rank(), 3)
    src = [torch.from_numpy(pattern(k)) for k in keys]
    cache.dump(keys, src).wait()
    out = torch.zeros((3, SHARD), dtype=torch.uint8)
    cache.load(keys, [out[i] for i in range(3)]).wait()
    for i, k in enumerate(keys):
        assert np.array_equal(out[i].numpy(), pattern(k))
    f16 = torch.zeros(SHARD // 2, dtype=torch.float16)
    cache.load(keys[:1], [f16]).wait()
    assert np.array_equal(f16.numpy().view(np.uint8), pattern(keys[0]))


def test_example_runs_with_torch(rank0):
    torch_or_skip()
    ex = os.path.join(SOURCE_ROOT, "examples", "python", "kv_offload.py")
    r = mpirun(2, [sys.executable, ex, "--small", "--torch"])
    assert r.returncode == 0, r.stdout
    assert "(torch)" in r.stdout and "came back byte for byte" in r.stdout
