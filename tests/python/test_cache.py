"""The collective cache from Python: init and close, config, byte-exact
loads, keys and buffer kinds, lifetimes, touch/lookup/stats/info."""
import gc
import os
import re
import subprocess
import weakref

import numpy as np
import pytest

import ucmcache
from conftest import BUILD_ROOT, SHARD, base_config, keys_of, pattern


def test_init_is_collective_and_close_finalizes(comm, store):
    c = ucmcache.Cache(comm, **base_config("posix:" + store))
    info = c.info()
    assert (info.rank, info.size) == (comm.Get_rank(), comm.Get_size())
    assert info.local_size == comm.Get_size() and info.node_count == 1
    assert info.copy_engine == "host" and info.shard_bytes == SHARD
    assert c.shard_bytes == SHARD and not c.closed
    c.close()
    assert c.closed
    c.close()  # a second close does nothing
    with ucmcache.Cache(comm, **base_config("posix:" + store)) as c2:
        assert not c2.closed
    assert c2.closed


def test_unknown_keyword_fails_on_every_rank_naming_it(comm, store):
    cfg = base_config("posix:" + store)
    if comm.Get_rank() == 1:
        cfg["shard_byte"] = 4096  # a typo on one rank only
    with pytest.raises(ucmcache.ConfigError) as e:
        ucmcache.Cache(comm, **cfg)
    if comm.Get_rank() == 1:
        assert "unknown configuration keyword 'shard_byte'" in str(e.value)
        assert "shard_bytes" in str(e.value)  # the keywords are listed
    else:
        assert "rank 1" in str(e.value) and "shard_byte" in str(e.value)
    # Nobody is left inside ucm_cache_init: the next cache works.
    with ucmcache.Cache(comm, **base_config("posix:" + store)) as c:
        assert c.info().size == comm.Get_size()


@pytest.mark.parametrize("name,value,says", [
    ("shard_bytes", "12x", "not a size"),
    ("shard_bytes", 1.5, "an int or a size string"),
    ("order", "sideways", "rotate|natural"),
    ("max_task_entries", -1, "out of range"),
    ("backend", 7, "is a str"),
    ("device_id", "gpu0", "'auto'"),
])
def test_bad_config_value_is_named(comm, store, name, value, says):
    cfg = base_config("posix:" + store)
    cfg[name] = value
    with pytest.raises(ucmcache.ConfigError) as e:
        ucmcache.Cache(comm, **cfg)
    assert name in str(e.value) and says in str(e.value)


def test_library_check_fails_every_rank(comm, store):
    # A value of the right type the library refuses: ucm_cache_init fails on
    # every rank with the library's message.
    with pytest.raises(ucmcache.InvalidArgumentError) as e:
        ucmcache.Cache(comm, **base_config("posix:" + store, shard_bytes=1000))
    assert "shard_bytes" in str(e.value)


def test_keywords_and_variables_map_to_the_config(comm, store, monkeypatch):
    monkeypatch.setenv("UCM_LOAD_RETRIES", "5")
    monkeypatch.setenv("UCM_IO_DEPTH", "3")
    with ucmcache.Cache(comm, **base_config("posix:" + store, io_depth=7, shard_bytes="16K")) as c:
        assert c.config["load_retries"] == 5  # from UCM_LOAD_RETRIES
        assert c.config["io_depth"] == 7      # the keyword wins over UCM_IO_DEPTH
        assert c.config["shard_bytes"] == 16384 and c.config["copy_engine"] == "host"


def test_keywords_are_the_librarys_table(rank0):
    """The binding's keywords are exactly ucm_info's tunables (the library's
    one table), so a field added there cannot be missing here."""
    exe = os.path.join(BUILD_ROOT, "apps", "ucm_info")
    if not os.path.exists(exe):
        pytest.skip("ucm_info is not built at %s" % exe)
    out = subprocess.run([exe, "-f", "--parsable"], stdout=subprocess.PIPE, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("UCM_")}).stdout
    fields = [line.split(":", 3)[3] for line in out.splitlines() if line.startswith("tunable:") and ":field:" in line]
    assert len(fields) > 10, out
    assert fields == ucmcache.config_keywords()


def test_loads_are_byte_exact_into_numpy(comm, cache):
    r, n = comm.Get_rank(), comm.Get_size()
    mine = keys_of(10 + r, 8)
    cache.dump(mine, [pattern(k) for k in mine]).wait()
    comm.Barrier()
    every = [k for q in range(n) for k in keys_of(10 + q, 8)]
    out = np.zeros((len(every), SHARD), np.uint8)  # one buffer cut into shards
    cache.load(every, out).wait()
    for i, k in enumerate(every):
        assert np.array_equal(out[i], pattern(k)), "shard %d of rank %d" % (i, r)
    per = [np.zeros(SHARD, np.uint8) for _ in every]  # one buffer per key
    cache.load(every, per).wait()
    assert all(np.array_equal(per[i], pattern(k)) for i, k in enumerate(every))


def test_structured_keys_go_straight_to_c(comm, cache):
    blocks = np.random.default_rng(1000 + comm.Get_rank()).integers(0, 256, (32, 16), dtype=np.uint8)
    keys = ucmcache.make_keys(blocks, np.arange(32) % 16)
    assert keys.dtype == ucmcache.KEY_DTYPE and keys.itemsize == 24
    src = np.random.default_rng(comm.Get_rank()).integers(0, 256, (32, SHARD), dtype=np.uint8)
    cache.dump(keys, src).wait()
    assert (cache.lookup(keys) == ucmcache.WHERE_CACHE).all()
    out = np.zeros_like(src)
    cache.load(keys, out).wait()
    assert np.array_equal(out, src)
    pairs = [(bytes(b), int(s)) for b, s in zip(keys["block"], keys["shard"])]
    out[:] = 0
    cache.load(pairs, out).wait()
    assert np.array_equal(out, src)
    # Blocks as any 16-byte buffer, shards as numpy integers.
    loose = [(memoryview(b.copy()), s) for b, s in zip(keys["block"], keys["shard"])]
    out[:] = 0
    cache.load(loose, out).wait()
    assert np.array_equal(out, src)


class DLPackOnly:
    """An object with __dlpack__ only (as a torch CPU tensor is to us)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**{k: v for k, v in kw.items() if k == "stream"})

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class CudaArrayInterface:
    """__cuda_array_interface__ over host memory: the host engine copies into
    it as into any pointer, which checks the interface's parsing here."""

    def __init__(self, a, readonly=False, stream=None):
        self.a = a
        self.__cuda_array_interface__ = {"data": (a.ctypes.data, readonly), "shape": a.shape,
                                         "typestr": a.dtype.str, "strides": None, "version": 3}
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


def test_every_buffer_kind(comm, cache):
    keys = keys_of(40 + comm.Get_rank(), 6)
    cache.dump(keys, [pattern(k) for k in keys]).wait()
    arrays = [np.zeros(SHARD, np.uint8) for _ in keys]
    ba, mv = bytearray(SHARD), memoryview(bytearray(SHARD))
    dsts = [arrays[0], ba, mv, (arrays[3].ctypes.data, SHARD), DLPackOnly(arrays[4]),
            CudaArrayInterface(arrays[5])]
    cache.load(keys, dsts).wait()
    got = [arrays[0], np.frombuffer(ba, np.uint8), np.frombuffer(mv, np.uint8), arrays[3], arrays[4], arrays[5]]
    for k, g in zip(keys, got):
        assert np.array_equal(g, pattern(k))
    # Read-only sources are fine for a dump: bytes, a read-only array.
    ro = pattern(keys[0]).copy()
    ro.flags.writeable = False
    cache.dump(keys[:2], [ro, bytes(pattern(keys[1]))]).wait()


def test_buffers_live_until_the_task_ends(comm, cache):
    keys = keys_of(50 + comm.Get_rank(), 4)
    cache.dump(keys, np.zeros((4, SHARD), np.uint8)).wait()
    out = np.ones((4, SHARD), np.uint8)
    alive = weakref.ref(out)
    t = cache.load(keys, out)
    del out
    gc.collect()
    assert alive() is not None  # the task holds it
    t.wait()
    gc.collect()
    assert alive() is None      # and lets it go at its end
    # A task dropped unwaited keeps its buffers until the library is done
    # with it (reaped at a later call, or at close).
    out = np.ones((4, SHARD), np.uint8)
    alive = weakref.ref(out)
    cache.load(keys, out)
    del out
    gc.collect()
    assert alive() is not None
    comm.Barrier()
    cache.close()
    gc.collect()
    assert alive() is None


def test_touch_lookup_stats_info_version(comm, cache):
    keys = keys_of(60 + comm.Get_rank(), 3)
    cache.dump(keys, [pattern(k) for k in keys]).wait()
    cache.touch([k[0] for k in keys])
    cache.touch(np.frombuffer(b"".join(k[0] for k in keys), np.uint8).reshape(-1, 16))
    cache.touch([])
    never = keys_of(61 + comm.Get_rank() + 1000, 2)
    where = cache.lookup(keys + never)
    assert where.dtype == np.uint8
    assert list(where) == [ucmcache.WHERE_CACHE] * 3 + [ucmcache.WHERE_NONE] * 2
    s, node = cache.stats(), cache.stats(node=True)
    assert isinstance(s, ucmcache.Stats) and s.ranks == 1 and s.dumps >= 3 and node.ranks == comm.Get_size()
    assert isinstance(cache.info(), ucmcache.Info)
    assert re.fullmatch(r"\d+\.\d+\.\d+", ucmcache.version) and ucmcache.__version__ == ucmcache.version
    want = os.environ.get("UCM_PY_VERSION")
    if want:
        assert ucmcache.version == want
