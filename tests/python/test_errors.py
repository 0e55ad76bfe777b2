"""Every bad input raises its exception class, names the bad value, and
leaves the cache usable (never a crash)."""
import asyncio
import os
import signal

import numpy as np
import pytest

import ucmcache
from ucmcache import errors
from conftest import SHARD, base_config, keys_of, pattern


def test_wrong_buffer_size_names_index_and_sizes(comm, cache):
    keys = keys_of(100 + comm.Get_rank(), 3)
    dsts = [np.zeros(SHARD, np.uint8), np.zeros(100, np.uint8), np.zeros(SHARD, np.uint8)]
    with pytest.raises(ucmcache.BufferSizeError) as e:
        cache.load(keys, dsts)
    assert "dsts[1] is 100 bytes; shard_bytes is 16384" in str(e.value)
    assert e.value.result == errors.ERR_INVALID_ARG and isinstance(e.value, ValueError)
    with pytest.raises(ucmcache.BufferSizeError) as e:
        cache.load(keys, np.zeros((2, SHARD), np.uint8))
    assert "32768 bytes for 3 keys" in str(e.value)
    with pytest.raises(ucmcache.InvalidArgumentError, match="2 buffers for 3 keys"):
        cache.dump(keys, dsts[:2])
    with pytest.raises(ucmcache.BufferSizeError, match=r"srcs\[0\] is 5 bytes"):
        cache.dump(keys[:1], [b"short"])


def test_read_only_destination_is_refused(comm, cache):
    keys = keys_of(110 + comm.Get_rank(), 2)
    cache.dump(keys, [pattern(k) for k in keys]).wait()
    ro = np.zeros((2, SHARD), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ucmcache.ReadOnlyBufferError, match="read-only"):
        cache.load(keys, ro)
    with pytest.raises(ucmcache.ReadOnlyBufferError, match=r"dsts\[1\] \(bytes\) is read-only"):
        cache.load(keys, [np.zeros(SHARD, np.uint8), bytes(SHARD)])
    from test_cache import CudaArrayInterface
    with pytest.raises(ucmcache.ReadOnlyBufferError):
        cache.load(keys[:1], [CudaArrayInterface(np.zeros(SHARD, np.uint8), readonly=True)])
    assert not ro.any()  # nothing was written


def test_not_a_buffer_and_not_contiguous(comm, cache):
    keys = keys_of(120 + comm.Get_rank(), 2)
    with pytest.raises(ucmcache.BufferTypeError, match=r"dsts\[0\] is a float"):
        cache.load(keys, [1.5, np.zeros(SHARD, np.uint8)])
    with pytest.raises(ucmcache.InvalidArgumentError, match="NULL"):
        cache.load(keys[:1], [(0, SHARD)])
    with pytest.raises(ucmcache.BufferTypeError, match="dsts is a NoneType"):
        cache.load(keys, None)

    class Malformed:
        __cuda_array_interface__ = {"shape": (SHARD,), "typestr": "|u1"}  # no "data"

    with pytest.raises(ucmcache.InvalidArgumentError, match="malformed"):
        cache.load(keys[:1], [Malformed()])
    strided = np.zeros((2, SHARD * 2), np.uint8)[:, ::2]
    with pytest.raises(ucmcache.BufferLayoutError, match="not C-contiguous"):
        cache.load(keys, strided)


class LyingCai:
    """__cuda_array_interface__ over a real shard of host memory whose typestr,
    shape or strides do not describe it."""

    def __init__(self, a, typestr, shape, strides=None):
        self.a = a
        self.__cuda_array_interface__ = {"data": (a.ctypes.data, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


@pytest.mark.parametrize("typestr,shape,strides,says", [
    ("<fX", (SHARD,), None, r"typestr '<fX'"),
    ("<f99999999999999999999", (SHARD,), None, r"typestr '<f99999999999999999999'"),
    ("<u0", (SHARD,), None, r"typestr '<u0'"),
    ("|u1", (-1, -SHARD), None, r"shape \(-1, -16384\)"),  # the product is SHARD
    ("<u4", (2**62 + SHARD // 4,), None, r"shape \(4611686018427392000,\)"),  # wraps to SHARD bytes
    ("|u1", (2**62, 4, 1), None, r"shape \(4611686018427387904, 4, 1\)"),
    ("|u1", (2, 4, SHARD // 8), (SHARD // 8,), r"1 strides for the 3 dimensions of shape \(2, 4, 2048\)"),
])
def test_a_cuda_array_interface_that_lies_names_its_bad_field(comm, cache, typestr, shape, strides, says):
    # Before: ValueError/IndexError 'stoull' for the typestrs, and the shapes
    # were taken (a negative or wrapped product of SHARD) and copied into.
    k = keys_of(125 + comm.Get_rank(), 1)
    cache.dump(k, [pattern(k[0])]).wait()
    a = np.zeros(SHARD, np.uint8)
    with pytest.raises(ucmcache.InvalidArgumentError, match=says) as e:
        cache.load(k, [LyingCai(a, typestr, shape, strides)])
    assert e.value.result == errors.ERR_INVALID_ARG
    assert not a.any()  # nothing was copied


@pytest.mark.parametrize("keys,says", [
    (5, "keys is a int"),
    ("abc", "keys is a str"),
    ([b"0123456789abcdef"], r"keys\[0\] is a bytes"),
    ([("0123456789abcdef", 0)], r"keys\[0\]: the block is a str"),
    ([(b"short", 0)], "5 bytes, not 16"),
    ([(b"0123456789abcdef", "1")], "the shard is a str"),
    ([(b"0123456789abcdef", 1.0)], "the shard is a float"),
    (np.zeros(1, np.uint64), "keys need ucmcache.KEY_DTYPE"),
    ([(b"0123456789abcdef", True)], "the shard is a bool"),
    ([(np.zeros(8, np.uint8), 0)], "8 bytes, not 16"),
    ({"a": 1}, "keys is a dict"),
])
def test_wrong_key_type(cache, keys, says):
    with pytest.raises(ucmcache.KeyTypeError, match=says) as e:
        cache.load(keys, np.zeros(SHARD, np.uint8))
    assert isinstance(e.value, TypeError)


def test_keys_the_library_refuses(comm, cache):
    k = keys_of(130 + comm.Get_rank(), 1)[0]
    buf = np.zeros((2, SHARD), np.uint8)
    cases = [
        ([(k[0], 16)], buf[:1], errors.ERR_OUT_OF_RANGE, "16"),  # shards_per_block is 16
        ([(k[0], -1)], buf[:1], errors.ERR_OUT_OF_RANGE, "-1"),
        ([k, k], buf, errors.ERR_DUPLICATE_KEY, ""),
        ([], np.zeros(0, np.uint8), errors.ERR_EMPTY, ""),
    ]
    for keys, dsts, result, says in cases:
        with pytest.raises(ucmcache.InvalidArgumentError) as e:
            cache.load(keys, dsts)
        assert e.value.result == result, str(e.value)
        assert says in str(e.value)
    bad = ucmcache.make_keys([k[0]], 0)
    bad["reserved"] = 1
    with pytest.raises(ucmcache.InvalidArgumentError, match="reserved"):
        cache.load(bad, buf[:1])
    with pytest.raises(ucmcache.InvalidArgumentError) as e:
        cache.load(ucmcache.make_keys([k[0]] * 5000, 0), np.zeros((5000, SHARD), np.uint8))
    assert e.value.result == errors.ERR_TOO_LARGE
    # The cache is still fine.
    cache.dump([k], [pattern(k)]).wait()
    cache.load([k], buf[:1]).wait()
    assert np.array_equal(buf[0], pattern(k))


def test_closed_cache(comm, store):
    c = ucmcache.Cache(comm, **base_config("posix:" + store))
    k = keys_of(140 + comm.Get_rank(), 1)
    c.dump(k, [pattern(k[0])]).wait()
    t = c.load(k, np.zeros(SHARD, np.uint8))
    t.wait()
    c.close()
    for call in (lambda: c.load(k, np.zeros(SHARD, np.uint8)), lambda: c.dump(k, [pattern(k[0])]),
                 lambda: c.touch([k[0][0]]), lambda: c.lookup(k), c.stats, c.info):
        with pytest.raises(ucmcache.ClosedError, match="closed") as e:
            call()
        assert e.value.result == errors.ERR_FINALIZED and isinstance(e.value, ucmcache.StateError)


def test_task_waited_twice(comm, cache):
    k = keys_of(150 + comm.Get_rank(), 2)
    t = cache.dump(k, [pattern(x) for x in k])
    t.wait()
    assert t.done and t.test()
    with pytest.raises(ucmcache.UnknownTaskError, match="already waited") as e:
        t.wait()
    assert e.value.result == errors.ERR_UNKNOWN_TASK
    t2 = cache.load(k, np.zeros((2, SHARD), np.uint8))
    while not t2.test():
        pass
    t2.wait()  # test() saw it done; the first wait still delivers the outcome
    with pytest.raises(ucmcache.UnknownTaskError):
        t2.wait(timeout=1)


def test_bad_timeouts(comm, cache):
    k = keys_of(160 + comm.Get_rank(), 1)
    t = cache.dump(k, [pattern(k[0])])
    with pytest.raises(ucmcache.InvalidArgumentError, match="timeout"):
        t.wait(-1)
    with pytest.raises(ucmcache.InvalidArgumentError, match="timeout is a str"):
        t.wait("soon")
    for b in (True, False):  # a bool is no number of seconds (True was 1 s)
        with pytest.raises(ucmcache.InvalidArgumentError, match="timeout is a bool"):
            t.wait(b)
    t.wait(30)


def test_bench_loads_go_to_each_keys_own_buffer(comm, cache):
    # bench/python_overhead.py's C loop: a list of separate buffers is one
    # buffer per key (it wrote every key after the first past buffer 0's end),
    # and no keys is the library's empty-task error (it read probe[0]).
    k = keys_of(170 + comm.Get_rank(), 3)
    cache.dump(k, [pattern(x) for x in k]).wait()
    dsts = [np.zeros(SHARD, np.uint8) for _ in k]
    assert cache._native._bench_c_loads(k, dsts, 2) >= 0
    for x, d in zip(k, dsts):
        assert np.array_equal(d, pattern(x))
    with pytest.raises(ucmcache.InvalidArgumentError, match="n is 0"):
        cache._native._bench_c_loads([], np.zeros(SHARD, np.uint8), 1)
    with pytest.raises(ucmcache.InvalidArgumentError, match="iters -1"):
        cache._native._bench_c_loads(k, dsts, -1)


def test_a_forked_child_is_refused_and_leaves_the_cache_alone(comm, cache):
    # A DataLoader-style worker forked from a rank inherits the cache object
    # but none of the library's threads: every call, close and the exit-time
    # close included, is a StateError at once (a load waited for a dispatcher
    # that is not there, and close hung), and the parent's cache goes on.
    k = keys_of(180 + comm.Get_rank(), 2)
    cache.dump(k, [pattern(x) for x in k]).wait()

    async def awaited():  # starts the cache's waiter thread, which the child lacks
        await cache.load(k, np.zeros((2, SHARD), np.uint8))

    asyncio.run(awaited())
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a child that hangs ends, and fails the test below
        ok = True
        for call in (lambda: cache.load(k, np.zeros((2, SHARD), np.uint8)), cache.close, ucmcache._close_at_exit):
            try:
                call()
                ok = ok and call is ucmcache._close_at_exit  # it swallows the error, as at exit
            except ucmcache.StateError as e:
                ok = ok and "forked child" in str(e)
            except BaseException:
                ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    out = np.zeros((2, SHARD), np.uint8)
    cache.load(k, out).wait()
    assert all(np.array_equal(out[i], pattern(x)) for i, x in enumerate(k))


def test_not_a_communicator(comm):
    with pytest.raises(ucmcache.ConfigError, match="mpi4py communicator"):
        ucmcache.Cache("COMM_WORLD", backend="sim:")


def test_every_result_has_a_class():
    for code in range(1, 25):
        cls = errors.BY_RESULT[code]
        assert issubclass(cls, ucmcache.UcmError)
        e = cls("x")
        assert e.result_name.startswith("UCM_ERR_")
