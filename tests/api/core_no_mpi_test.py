#!/usr/bin/env python3
"""The cache core never sees <mpi.h>.

For every source of the core layers (common, sync, ctrl, data, cache) in the
build's compile_commands.json, rerun its compile command as `-E -dM` (macros
only) and fail if any MPI header's macro is defined: the file, or a header it
includes, reached <mpi.h>.

usage: core_no_mpi_test.py BUILD_ROOT SOURCE_ROOT
"""
import json
import os
import shlex
import subprocess
import sys

CORE = ("common", "sync", "ctrl", "data", "cache")
MPI_MACROS = ("MPI_VERSION", "OMPI_MAJOR_VERSION", "MPICH_VERSION")


def main():
    build, source = sys.argv[1], os.path.realpath(sys.argv[2])
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    checked, bad = 0, []
    for c in commands:
        src = os.path.normpath(os.path.join(c["directory"], c["file"]))
        # lib/<layer>/... under the source root: the folders above it may be
        # named anything (a checkout at /work/tests, or in a folder called lib).
        parts = os.path.relpath(os.path.realpath(src), source).split(os.sep)
        if len(parts) < 3 or parts[0] != "lib" or parts[1] not in CORE:
            continue
        argv = shlex.split(c["command"])
        out = []
        skip = False
        for a in argv:  # drop the object output and dependency-file options
            if skip:
                skip = False
                continue
            if a in ("-o", "-MF", "-MQ", "-MT"):
                skip = True
                continue
            if a in ("-c", "-MD", "-MMD"):
                continue
            out.append(a)
        res = subprocess.run(out + ["-E", "-dM"], cwd=c["directory"], capture_output=True, text=True)
        if res.returncode != 0:
            bad.append(f"{src}: preprocessing failed: {res.stderr.strip()[:400]}")
            continue
        defined = [m for m in MPI_MACROS if f"#define {m} " in res.stdout]
        if defined:
            bad.append(f"{src}: sees <mpi.h> ({', '.join(defined)} defined)")
        checked += 1
    if checked == 0:
        print("core_no_mpi_test: FAIL: no core source found in compile_commands.json")
        return 1
    for b in bad:
        print("core_no_mpi_test: FAIL:", b)
    print(f"core_no_mpi_test: {checked} core sources checked, {len(bad)} see MPI")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
