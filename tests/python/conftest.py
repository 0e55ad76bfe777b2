"""Fixtures for suite `python`: every test runs on every rank of one
`mpirun -np 4` job; fixtures that build a cache are collective."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import ucmcache

SOURCE_ROOT = os.environ.get("UCM_PY_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_ROOT = os.environ.get("UCM_PY_BUILD_ROOT", "")
SHARD = 16 << 10


@pytest.fixture(scope="session")
def comm():
    return MPI.COMM_WORLD


@pytest.fixture
def store(comm):
    """A fresh posix store directory, made by rank 0, removed after the test."""
    d = tempfile.mkdtemp(prefix="ucm_pytest.") if comm.Get_rank() == 0 else None
    d = comm.bcast(d, root=0)
    yield d
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(d, ignore_errors=True)


def base_config(backend, **over):
    c = dict(shard_bytes=SHARD, shards_per_block=16, cache_bytes=8 << 20, reserved_slots=16,
             copy_engine="host", backend=backend, timeout_ms=20000)
    c.update(over)
    return c


@pytest.fixture
def cache(comm, store):
    """A 4-rank cache on a posix store, 16 KiB shards, host copies."""
    c = ucmcache.Cache(comm, **base_config("posix:" + store))
    yield c
    comm.Barrier()
    c.close()


def keys_of(tag, n, shard=0):
    """n distinct keys whose block ids encode `tag` (the same on every rank)."""
    return [(ucmcache.block_id(tag * 100003 + i), shard) for i in range(n)]


def pattern(key, nbytes=SHARD):
    """A shard's content: a function of its key, so any rank can check it."""
    seed = int.from_bytes(key[0][:8], "little") ^ (key[1] << 40)
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def clean_env():
    """The environment for a nested mpirun: none of this job's MPI/PMIx variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HYDRA_", "PMI_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,vader",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def mpirun(np_, argv, timeout=120, env=None, **kw):
    """A nested job of np_ ranks (from one rank of this one), bounded twice."""
    cmd = [os.environ.get("UCM_PY_MPIRUN", "mpirun"), "--oversubscribe", "--timeout", str(timeout),
           "-np", str(np_)] + argv
    return subprocess.run(cmd, env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout + 30, **kw)


@pytest.fixture
def rank0(comm):
    """Runs the test body on rank 0 only (the others skip); no collective inside."""
    if comm.Get_rank() != 0:
        pytest.skip("rank 0 runs this one")
