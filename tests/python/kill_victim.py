"""A job in which one rank is SIGKILLed while the node's cache is up
(test_tools.test_sigkill_leaves_nothing runs it in private namespaces).

    mpirun --enable-recovery -np 3 python3 kill_victim.py STORE_DIR

Every rank brings the cache up and dumps; after a barrier the last rank
kills itself with SIGKILL. The survivors then close the cache: the dead peer
never comes, so close raises PeerDeadError, which each survivor prints. They
leave with os._exit (MPI_Finalize would wait for the dead rank)."""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import ucmcache

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cache = ucmcache.Cache(comm, shard_bytes=4096, cache_bytes=1 << 20, reserved_slots=8, copy_engine="host",
                       backend="posix:" + sys.argv[1], timeout_ms=10000, liveness_ms=20)
keys = [(ucmcache.block_id(1000 * rank + i), 0) for i in range(4)]
cache.dump(keys, np.full((4, 4096), rank, np.uint8)).wait()
print("rank %d: cache up" % rank, flush=True)
comm.Barrier()
if rank == size - 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    cache.close()
    print("rank %d: close returned without an error" % rank, flush=True)
except ucmcache.PeerDeadError as e:
    print("rank %d: PeerDeadError: %s" % (rank, e), flush=True)
except ucmcache.UcmError as e:
    print("rank %d: %s: %s" % (rank, type(e).__name__, e), flush=True)
os._exit(0)
