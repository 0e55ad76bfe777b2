"""ucmcache's exceptions: one class per family of ucm_result_t.

Every exception is a UcmError with ``.result`` (the ucm_result_t value) and
``.result_name`` ("UCM_ERR_NO_SPACE"); its message is the result's name and
the library's ucm_last_error text. The families also derive from the builtin
exception that a Python caller expects (bad input is a ValueError, a timeout
a TimeoutError), so ``except ValueError`` works.
"""

# ucm_result_t values (ucm_base.h; ABI, never renumbered).
OK = 0
ERR_INVALID_ARG = 1
ERR_NO_MEMORY = 2
ERR_NO_SPACE = 3
ERR_TIMEOUT = 4
ERR_BACKEND = 5
ERR_NOT_FOUND = 6
ERR_BAD_STATE = 7
ERR_CORRUPT = 8
ERR_ABI_MISMATCH = 9
ERR_CONFIG_MISMATCH = 10
ERR_SYSTEM = 11
ERR_PEER_DEAD = 12
ERR_UNSUPPORTED = 13
ERR_BUSY = 14
ERR_FINALIZED = 15
ERR_BAD_HANDLE = 16
ERR_DUPLICATE_KEY = 17
ERR_DEVICE = 18
ERR_INTERNAL = 19
ERR_NULL_POINTER = 20
ERR_OUT_OF_RANGE = 21
ERR_EMPTY = 22
ERR_TOO_LARGE = 23
ERR_UNKNOWN_TASK = 24

RESULT_NAMES = {v: "UCM_" + k for k, v in globals().items() if k.startswith(("OK", "ERR_")) and isinstance(v, int)}


class UcmError(Exception):
    """A failed ucmcache call. ``result``: the ucm_result_t value."""

    result = ERR_INTERNAL

    @property
    def result_name(self):
        return RESULT_NAMES.get(self.result, "UCM_ERR_%d" % self.result)


# ---- bad input ------------------------------------------------------------
class InvalidArgumentError(UcmError, ValueError):
    """A bad argument (INVALID_ARG, NULL_POINTER, OUT_OF_RANGE, EMPTY,
    TOO_LARGE, DUPLICATE_KEY); the message names the bad value."""

    result = ERR_INVALID_ARG


class ConfigError(InvalidArgumentError):
    """An unknown configuration keyword, or a value of the wrong type."""


class KeyTypeError(InvalidArgumentError, TypeError):
    """Keys or blocks that are not (bytes of 16, int) pairs / KEY_DTYPE."""


class BufferTypeError(InvalidArgumentError, TypeError):
    """An object that is no buffer (no buffer protocol, DLPack, CUDA array
    interface, and not (ptr, nbytes))."""


class BufferSizeError(InvalidArgumentError):
    """A buffer whose size is not shard_bytes (the message names the index
    and both sizes)."""


class BufferLayoutError(InvalidArgumentError):
    """A buffer that is not C-contiguous."""


class ReadOnlyBufferError(InvalidArgumentError):
    """A read-only buffer given as a load destination."""


# ---- resources, time --------------------------------------------------------
class ResourceError(UcmError):
    """NO_MEMORY, NO_SPACE (every slot pinned), BUSY (too many tasks wait)."""

    result = ERR_NO_SPACE


class UcmTimeoutError(UcmError, TimeoutError):
    """A bounded wait ran out; a task that timed out is still valid. From a
    lookup it has ``where``, ``keys`` and ``indexes`` as BackendError does
    (the keys the store did not answer in time)."""

    result = ERR_TIMEOUT
    keys = ()
    indexes = ()


# ---- the store and the shared data -----------------------------------------
class BackendError(UcmError):
    """The store failed a load, dump or lookup. ``keys``: the failing keys as
    (bytes, int) pairs (the library names the first 16 of a task), and
    ``indexes`` their positions in the call; a lookup also has ``where``."""

    result = ERR_BACKEND
    keys = ()
    indexes = ()


class NotFoundError(UcmError, LookupError):
    result = ERR_NOT_FOUND


class CorruptError(UcmError):
    """CORRUPT or ABI_MISMATCH: a shared region, message or stored copy
    failed validation."""

    result = ERR_CORRUPT


class ConfigMismatchError(UcmError):
    """Ranks of a node disagree on a layout field (the message names it)."""

    result = ERR_CONFIG_MISMATCH


# ---- state --------------------------------------------------------------------
class StateError(UcmError):
    """BAD_STATE, BAD_HANDLE: the call is not valid now."""

    result = ERR_BAD_STATE


class ClosedError(StateError):
    """The cache is closed (FINALIZED)."""

    result = ERR_FINALIZED


class UnknownTaskError(StateError):
    """Not a task of this cache, or one already waited for."""

    result = ERR_UNKNOWN_TASK


# ---- the system ----------------------------------------------------------------
class SystemCallError(UcmError):
    """A system call failed (SYSTEM); errno is in the message."""

    result = ERR_SYSTEM


class PeerDeadError(UcmError):
    """A peer process of this node died."""

    result = ERR_PEER_DEAD


class UnsupportedError(UcmError):
    result = ERR_UNSUPPORTED


class DeviceError(UcmError):
    """The CUDA layer failed."""

    result = ERR_DEVICE


class InternalError(UcmError):
    result = ERR_INTERNAL


BY_RESULT = {
    ERR_INVALID_ARG: InvalidArgumentError,
    ERR_NULL_POINTER: InvalidArgumentError,
    ERR_OUT_OF_RANGE: InvalidArgumentError,
    ERR_EMPTY: InvalidArgumentError,
    ERR_TOO_LARGE: InvalidArgumentError,
    ERR_DUPLICATE_KEY: InvalidArgumentError,
    ERR_NO_MEMORY: ResourceError,
    ERR_NO_SPACE: ResourceError,
    ERR_BUSY: ResourceError,
    ERR_TIMEOUT: UcmTimeoutError,
    ERR_BACKEND: BackendError,
    ERR_NOT_FOUND: NotFoundError,
    ERR_CORRUPT: CorruptError,
    ERR_ABI_MISMATCH: CorruptError,
    ERR_CONFIG_MISMATCH: ConfigMismatchError,
    ERR_BAD_STATE: StateError,
    ERR_BAD_HANDLE: StateError,
    ERR_FINALIZED: ClosedError,
    ERR_UNKNOWN_TASK: UnknownTaskError,
    ERR_SYSTEM: SystemCallError,
    ERR_PEER_DEAD: PeerDeadError,
    ERR_UNSUPPORTED: UnsupportedError,
    ERR_DEVICE: DeviceError,
    ERR_INTERNAL: InternalError,
}


def error_classes():
    """The table the compiled module raises from: every class by name, and
    ``by_result``."""
    d = {name: cls for name, cls in globals().items() if isinstance(cls, type) and issubclass(cls, UcmError)}
    d["by_result"] = dict(BY_RESULT)
    return d
