"""Runs pytest on every rank of an mpirun job (suite `python`).

    mpirun -np 4 /usr/bin/python3 run_pytest.py TESTDIR [pytest args...]

Every rank runs the same tests in the same order (the collective ones step
together). Rank 0 prints the report, the others only their failures. Exit
code 5 (no tests collected) is a failure, and every rank exits with the
worst code of all ranks, so mpirun and meson see a failure on any rank.
"""
import os
import sys

import pytest
from mpi4py import MPI


def main():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    testdir, extra = sys.argv[1], sys.argv[2:]
    args = [testdir, "-p", "no:cacheprovider", "--tb=short", "--color=no"]
    args += ["-v", "-rs"] if rank == 0 else ["-q", "--no-header", "-rfE"]
    rc = int(pytest.main(args + extra))
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: rank %d collected no tests: that is a failure" % rank, file=sys.stderr)
        rc = 1
    worst = comm.allreduce(rc, op=MPI.MAX)
    if rank == 0:
        print("run_pytest: %d ranks, worst pytest exit code %d" % (comm.Get_size(), worst))
    sys.stdout.flush()
    return worst


if __name__ == "__main__":
    sys.exit(main())
