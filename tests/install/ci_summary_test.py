#!/usr/bin/env python3
"""run.sh's summary (.ci/test_summary.py) counts test cases from fixture logs.

Each fixture is one line of meson's testlog.json as meson 1.0 writes it (name,
result, stdout, stderr): GoogleTest programs that pass, skip (GTEST_SKIP),
fail a case, crash inside a case (no closing summary) or fail at exit after
all their cases passed; pytest's closing line and its -v lines without one;
plain scripts; and a stage whose log is missing. The summary names each failed
program, its failed cases and a few lines of their output.

usage: ci_summary_test.py SOURCE_ROOT
"""
import importlib.util
import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stdout

src = sys.argv[1]
spec = importlib.util.spec_from_file_location("test_summary", os.path.join(src, ".ci", "test_summary.py"))
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)

failures = []


def check(what, got, want):
    if got != want:
        failures.append("%s: got %r, want %r" % (what, got, want))


def entry(name, result, stdout, stderr=None):
    e = {"name": name, "result": result, "stdout": stdout, "duration": 1.0, "returncode": 0}
    if stderr is not None:
        e["stderr"] = stderr
    return e


def counts(e):
    c = ts.test_counts(e)
    return (c.passed, c.failed, c.skipped, c.prog_ok, c.prog_failed, c.prog_skipped)


GTEST_PASS = """Running main() from gtest_main.cc
[==========] Running 4 tests from 2 test suites.
[ RUN      ] Cache.HitIsAHit
[       OK ] Cache.HitIsAHit (0 ms)
[ RUN      ] Cache.MissEvicts
[       OK ] Cache.MissEvicts (12 ms)
[ RUN      ] Posix.DirectOn
/src/tests/backend/posix_backend_test.cpp:10: Skipped
the filesystem refuses O_DIRECT
[  SKIPPED ] Posix.DirectOn (1 ms)
[ RUN      ] Store/Conformance/0.Loads
[       OK ] Store/Conformance/0.Loads (3 ms)
[==========] 4 tests from 2 test suites ran. (16 ms total)
[  PASSED  ] 3 tests.
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] Posix.DirectOn
"""
check("gtest: 3 pass, 1 GTEST_SKIP", counts(entry("unit", "OK", GTEST_PASS)), (3, 0, 1, 1, 0, 0))

GTEST_FAIL = """[==========] Running 3 tests from 1 test suite.
[ RUN      ] Queue.Rotates
[       OK ] Queue.Rotates (5 ms)
[ RUN      ] Typed/0.Contract
/src/x.cpp:3: Failure
Expected equality of these values
[  FAILED  ] Typed/0.Contract, where TypeParam = ucm::SimStore (2 ms)
[ RUN      ] Queue.Waits
[       OK ] Queue.Waits (1 ms)
[==========] 3 tests from 1 test suite ran. (8 ms total)
[  PASSED  ] 2 tests.
[  FAILED  ] 1 test, listed below:
[  FAILED  ] Typed/0.Contract, where TypeParam = ucm::SimStore

 1 FAILED TEST
"""
check("gtest: a failed case", counts(entry("mp", "FAIL", GTEST_FAIL)), (2, 1, 0, 0, 1, 0))

# mpirun's rank 0, colored, killed inside its third case by mpirun --timeout:
# no result line, no closing summary.
GTEST_CRASH = ("\x1b[0;32m[==========] \x1b[mRunning 9 tests from 2 test suites.\n"
               "\x1b[0;32m[ RUN      ] \x1b[mBoot.Shares\n"
               "\x1b[0;32m[       OK ] \x1b[mBoot.Shares (30 ms)\n"
               "\x1b[0;32m[ RUN      ] \x1b[mBoot.Skips\n"
               "\x1b[0;32m[  SKIPPED ] \x1b[mBoot.Skips (0 ms)\n"
               "\x1b[0;32m[ RUN      ] \x1b[mHang.Finalize\n"
               "--------------------------------------------------------------------------\n"
               "The user-provided time limit for job execution has been reached:\n")
check("gtest: killed inside a case", counts(entry("mpi-np2", "TIMEOUT", GTEST_CRASH)), (1, 1, 1, 0, 1, 0))

# Every case passed, then the leak check at exit failed the program.
GTEST_LEAK = GTEST_PASS
LEAK_ERR = "==1234==ERROR: LeakSanitizer: detected memory leaks\n"
check("gtest: fails at exit after its cases", counts(entry("unit", "FAIL", GTEST_LEAK, LEAK_ERR)), (3, 1, 1, 0, 1, 0))

PYTEST = """============================= test session starts ==============================
tests/python/test_cache.py::test_load PASSED                              [ 50%]
tests/python/test_cache.py::test_gpu SKIPPED (no GPU)                     [100%]
........s.
10 passed, 1 skipped in 2.95s
=========== 12 passed, 1 skipped, 1 xfailed, 3 warnings in 3.10s ============
run_pytest: 4 ranks, worst pytest exit code 0
"""
check("pytest: closing line", counts(entry("python", "OK", PYTEST)), (13, 0, 1, 1, 0, 0))

PYTEST_FAIL = "============ 1 failed, 11 passed, 1 error in 4.00s ============\n"
check("pytest: failed and error", counts(entry("python", "FAIL", PYTEST_FAIL)), (11, 2, 0, 0, 1, 0))

PYTEST_DIED = """============================= test session starts ==============================
tests/python/test_cache.py::test_load PASSED                              [ 33%]
tests/python/test_cache.py::test_gpu SKIPPED (no GPU)                     [ 66%]
Fatal Python error: Segmentation fault
"""
check("pytest: never reached its summary", counts(entry("python", "FAIL", PYTEST_DIED)), (1, 1, 1, 0, 1, 0))

check("script: ok", counts(entry("install", "OK", "installed: /usr/local/lib/pkgconfig/ucmcache.pc\n")),
      (1, 0, 0, 1, 0, 0))
check("script: skip", counts(entry("symbols", "SKIP", "no UCX here\n")), (0, 0, 1, 0, 0, 1))
check("script: fail", counts(entry("man", "FAIL", "", "man_test: FAIL: no UCM_LOG\n")), (0, 1, 0, 0, 1, 0))
check("script: timeout", counts(entry("slurm", "TIMEOUT", "")), (0, 1, 0, 0, 1, 0))

# A stage's log and main()'s lines: per stage, then the closing line over all.
with tempfile.TemporaryDirectory() as d:
    log = os.path.join(d, "testlog.json")
    with open(log, "w") as f:
        for e in (entry("unit", "OK", GTEST_PASS), entry("mp", "FAIL", GTEST_FAIL),
                  entry("install", "OK", "done\n")):
            f.write(json.dumps(e) + "\n")
    out = io.StringIO()
    with redirect_stdout(out):
        rc = ts.main(["test_summary.py", "core=" + log, "asan=" + os.path.join(d, "missing.json")])
    lines = out.getvalue().splitlines()
    check("main: exit status", rc, 0)
    check("main: line count", len(lines), 6)
    if len(lines) == 6:
        check("main: stage line", lines[0],
              "run.sh: core: 6 passed, 1 failed, 1 skipped (cases); programs: 2 ok, 1 failed, 0 skipped")
        check("main: a missing log is a failed stage", lines[1].split(" (no ")[0],
              "run.sh: asan: 0 passed, 1 failed, 0 skipped (cases); programs: 0 ok, 1 failed, 0 skipped")
        check("main: the failed program and case are named", lines[2:5],
              ["run.sh: core: FAILED mp (FAIL): Typed/0.Contract",
               "run.sh:   | /src/x.cpp:3: Failure",
               "run.sh:   | Expected equality of these values"])
        check("main: closing line", lines[5],
              "run.sh: 6 passed, 2 failed, 1 skipped (test cases); programs: 2 ok, 2 failed, 0 skipped")


def failed(e):
    return ts.failure_lines("ci", e)


# CI shows the end of run.sh's output: the summary names what failed.
check("failed: a case killed inside it, with what it printed",
      failed(entry("mpi-np2", "TIMEOUT", GTEST_CRASH)),
      ["run.sh: ci: FAILED mpi-np2 (TIMEOUT): Hang.Finalize",
       "run.sh:   | " + "-" * 74,
       "run.sh:   | The user-provided time limit for job execution has been reached:"])
check("failed: at exit, no case failed: its last lines",
      failed(entry("unit", "FAIL", GTEST_LEAK, LEAK_ERR))[0:1] + failed(entry("unit", "FAIL", GTEST_LEAK, LEAK_ERR))[-1:],
      ["run.sh: ci: FAILED unit (FAIL)", "run.sh:   | " + LEAK_ERR.strip()])
PYTEST_NAMED = ("=========================== short test summary info ============================\n"
                "FAILED tests/python/test_api.py::test_lookup - AssertionError: 3 != 2\n"
                "ERROR tests/python/test_api.py::test_setup\n"
                "============ 1 failed, 11 passed, 1 error in 4.00s ============\n")
check("failed: pytest's failed tests named",
      failed(entry("python", "FAIL", PYTEST_NAMED))[0],
      "run.sh: ci: FAILED python (FAIL): tests/python/test_api.py::test_lookup, tests/python/test_api.py::test_setup")
many = "".join("[ RUN      ] S.T%d\n[  FAILED  ] S.T%d (1 ms)\n" % (i, i) for i in range(9))
check("failed: at most %d cases named" % ts.NAMED_CASES, failed(entry("unit", "FAIL", many))[0],
      "run.sh: ci: FAILED unit (FAIL): S.T0, S.T1, S.T2, S.T3, S.T4, S.T5 (+3 more)")
check("failed: a script's last lines", failed(entry("man", "FAIL", "", "man_test: FAIL: no UCM_LOG\n")),
      ["run.sh: ci: FAILED man (FAIL)", "run.sh:   | man_test: FAIL: no UCM_LOG"])

if failures:
    print("ci_summary_test: FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("ci_summary_test: every fixture counted as expected")
