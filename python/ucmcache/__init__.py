"""ucmcache: a node-shared host-memory cache of KV-cache shards, from Python.

    from mpi4py import MPI
    import numpy as np
    import ucmcache

    with ucmcache.Cache(MPI.COMM_WORLD, shard_bytes="16K", backend="posix:/tmp/kv") as cache:
        keys = [(block_id, layer) for layer in range(4)]       # (bytes of 16, int)
        cache.dump(keys, [kv[layer] for layer in range(4)]).wait()
        out = np.empty((4, 16384), np.uint8)
        cache.load(keys, out).wait()                            # or: await cache.load(...)

The package is a thin layer over the compiled module ``ucmcache._native``,
which calls the public C API (ucm.h). Use Debian's interpreter
(/usr/bin/python3): it is the one that sees python3-mpi4py and python3-numpy.
"""

import asyncio
import atexit
import dataclasses
import threading

import numpy as np
from mpi4py import MPI

from . import _native
from .errors import *  # noqa: F401,F403  (the exception classes are part of the package)
from .errors import ConfigError, UcmError, error_classes

__all__ = [
    "Cache", "Task", "Stats", "Info", "KEY_DTYPE", "make_keys", "block_id", "version", "__version__",
    "WHERE_NONE", "WHERE_BACKEND", "WHERE_CACHE", "WHERE_ERROR", "config_keywords",
] + [n for n in error_classes() if n != "by_result"]

# A key as C lays it out (ucm_key_t): 16 bytes of block id, the shard index,
# a reserved word that must be 0. An array of it goes to C as is.
KEY_DTYPE = np.dtype([("block", np.uint8, (16,)), ("shard", "<u4"), ("reserved", "<u4")], align=False)
assert KEY_DTYPE.itemsize == 24

_native.set_error_classes(error_classes())
_native.set_key_dtype(KEY_DTYPE)

WHERE_NONE = _native.WHERE_NONE
WHERE_BACKEND = _native.WHERE_BACKEND
WHERE_CACHE = _native.WHERE_CACHE
WHERE_ERROR = _native.WHERE_ERROR

#: The library's version ("MAJOR.MINOR.PATCH"), from ucm_version_string().
version = _native.version()
__version__ = version
VERSION_CODE = _native.VERSION_CODE


def config_keywords():
    """The keywords Cache() takes: the fields of ucm_config_t."""
    return list(_native.Config.names())


def block_id(data):
    """A 16-byte block id from bytes (the first 16, zero-padded) or an int."""
    if isinstance(data, int):
        return data.to_bytes(16, "little")
    b = bytes(data)[:16]
    return b + bytes(16 - len(b))


def make_keys(blocks, shards):
    """A KEY_DTYPE array: ``blocks`` a sequence of bytes of 16 or an (n, 16)
    uint8 array; ``shards`` an int (the same for every block) or one per block.
    """
    if isinstance(blocks, np.ndarray):
        b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, 16)
    else:
        b = np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(-1, 16) if len(blocks) else np.empty((0, 16), np.uint8)
    keys = np.zeros(len(b), KEY_DTYPE)
    keys["block"] = b
    keys["shard"] = shards
    return keys


@dataclasses.dataclass(frozen=True)
class Stats:
    """ucm_stats_t: a rank's counters, or the node's sum (ranks > 1)."""

    ranks: int
    tasks: int
    shards: int
    hits: int
    owner_loads: int
    load_failures: int
    waits: int
    wait_ns: int
    takeovers: int
    evictions: int
    no_space: int
    prealloc_made: int
    prealloc_used: int
    failed_shards: int
    bytes_from_backend: int
    bytes_to_device: int
    dumps: int
    bytes_dumped: int
    latency_p50_us: int
    latency_p90_us: int
    latency_p99_us: int
    latency_max_us: int
    direct_fallbacks: int
    inline_tasks: int
    protect_overrides: int


@dataclasses.dataclass(frozen=True)
class Info:
    """ucm_cache_info_t: what this rank got at init (plus shard_bytes)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_id: int
    node_count: int
    device_id: int
    scheduler: bool
    hugetlb: bool
    cuda_built: bool
    nccl_built: bool
    hwloc_built: bool
    visible_devices: int
    threads_bound: bool
    regular_slots: int
    reserved_slots: int
    segments: int
    control_bytes: int
    data_bytes: int
    control_inode: int
    host: str
    copy_engine: str
    binding: str
    register_seconds: float
    register_threads: int
    device_choice: str
    pages: str
    shard_bytes: int


class Task:
    """A submitted load or dump. ``wait(timeout=None)`` returns once it is done
    (or raises its failure; UcmTimeoutError leaves it running), ``test()`` and
    ``done`` never block, and ``await task`` waits from asyncio without
    blocking the loop. A task's outcome is delivered once: a second wait
    raises UnknownTaskError. Its buffers are kept alive until it ends."""

    __slots__ = ("_t", "_cache", "__weakref__")

    def __init__(self, native, cache):
        self._t = native
        self._cache = cache

    def wait(self, timeout=None):
        """Blocks (without the GIL) up to ``timeout`` seconds (None: no bound)."""
        self._t.wait(timeout)

    def test(self):
        """True once the task is done (then wait() returns at once)."""
        return self._t.test()

    @property
    def done(self):
        return self._t.test()

    @property
    def id(self):
        return self._t.id

    def __repr__(self):
        return "<ucmcache.Task %s %d%s>" % (self._t.kind, self._t.id, " done" if self._t.test() else "")

    def __await__(self):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def finished():  # on the cache's waiter thread, with the GIL
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:  # the loop was closed meanwhile
                pass

        self._cache._native.watch(self._t, finished)
        yield from fut.__await__()
        return self._t.wait(0)


def _settle(fut):
    if not fut.done():
        fut.set_result(None)


# Every open cache, held (not weakly): one that a program drops without close
# stays up until exit, where it is closed collectively, rather than being
# freed under its threads or finalized on one rank only.
_open_caches = set()
_open_lock = threading.Lock()


@atexit.register
def _close_at_exit():
    # A cache still open at exit is closed collectively (as every rank exits),
    # before mpi4py finalizes MPI and before the interpreter goes away under
    # the waiter thread.
    with _open_lock:
        caches = list(_open_caches)
    for c in caches:
        try:
            c.close()
        except UcmError:
            pass


class Cache:
    """The node's cache: ``Cache(comm, **config)`` is collective over the
    mpi4py communicator ``comm`` (ucm_cache_init); ``close()`` is
    ucm_cache_finalize, also collective; ``with Cache(...) as c:`` closes.

    Keywords are the fields of ucm_config_t (see config_keywords()); values
    start from their defaults and UCM_* variables, as ucm_config_init gives
    them. Sizes take ints or strings such as "16K"; enums their names
    ("rotate", "host"); device_id an int or "auto". An unknown keyword is a
    ConfigError naming it, on every rank: the ranks agree before the library
    is entered, so none waits for a rank that failed.
    """

    def __init__(self, comm, **config):
        if not isinstance(comm, MPI.Comm):
            raise ConfigError("comm is a %s: Cache needs an mpi4py communicator (MPI.Comm)" % type(comm).__name__)
        error = None
        cfg = None
        try:
            cfg = _native.Config()
            for name, value in config.items():
                cfg.set(name, value)
        except UcmError as e:
            error = e
        # Collective agreement on the Python-side checks: a rank with a bad
        # keyword would otherwise never reach ucm_cache_init and leave the
        # others waiting there until timeout_ms.
        errors = comm.allgather(None if error is None else (type(error).__name__, str(error)))
        bad = [(r, e) for r, e in enumerate(errors) if e is not None]
        if bad:
            if error is not None:
                raise error
            r, (cls, msg) = bad[0]
            raise ConfigError("rank %d failed before ucm_cache_init: %s" % (r, msg))
        self._native = _native.Cache.init(comm, cfg)
        self._config = {n: cfg.get(n) for n in _native.Config.names()}
        self.shard_bytes = self._native.shard_bytes
        with _open_lock:
            _open_caches.add(self)

    # ---- lifetime ----
    def close(self):
        """ucm_cache_finalize (collective over the node's ranks). Waits blocked
        in a task end with ClosedError; a second close does nothing."""
        with _open_lock:
            _open_caches.discard(self)
        self._native.close()

    @property
    def closed(self):
        return self._native.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- tasks ----
    def load(self, keys, dsts):
        """Loads ``keys`` into ``dsts``: one writable buffer of shard_bytes per
        key (a list or tuple), or one buffer of len(keys) x shard_bytes. Keys:
        (bytes of 16, int) pairs, or a KEY_DTYPE array (see make_keys)."""
        return Task(self._native.load(keys, dsts), self)

    def dump(self, keys, srcs):
        """Stores ``srcs`` under ``keys`` (buffers as for load; read-only is fine)."""
        return Task(self._native.dump(keys, srcs), self)

    def touch(self, blocks):
        """Marks every resident shard of each block recently used."""
        self._native.touch(blocks)

    def lookup(self, keys):
        """A numpy uint8 array: WHERE_NONE, WHERE_BACKEND or WHERE_CACHE per key.
        A key the store cannot answer for raises BackendError; one it holds
        past timeout_ms, UcmTimeoutError. Either has ``where`` (WHERE_ERROR
        at the keys not answered), and ``keys`` and ``indexes`` of those."""
        return self._native.lookup(keys)

    def stats(self, node=False):
        """This rank's counters (node=True: the sum over the node's ranks)."""
        mine, nodes = self._native.stats()
        return Stats(**(nodes if node else mine))

    def info(self):
        return Info(**self._native.info())

    @property
    def config(self):
        """The configuration given to ucm_cache_init, by keyword."""
        return dict(self._config)

    def __repr__(self):
        return "<ucmcache.Cache shard_bytes=%d%s>" % (self.shard_bytes, " closed" if self.closed else "")
