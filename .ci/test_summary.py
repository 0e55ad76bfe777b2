#!/usr/bin/env python3
"""run.sh's test summary: test cases, not test programs, from meson's testlog.json.

usage: test_summary.py STAGE=TESTLOG_JSON...

For each stage prints one line, then one closing line over all of them:

    run.sh: asan: 412 passed, 0 failed, 3 skipped (cases); programs: 19 ok, 0 failed, 0 skipped
    run.sh: 1203 passed, 0 failed, 7 skipped (test cases); programs: 70 ok, 0 failed, 0 skipped

A test program's cases come from its own output (meson's testlog.json keeps
each test's stdout and stderr):
  GoogleTest  every `[       OK ] Suite.Name (N ms)` is a passed case,
              `[  FAILED  ] ... (N ms)` a failed one, `[  SKIPPED ] ... (N ms)`
              (GTEST_SKIP) a skipped one; a `[ RUN      ]` with no result line
              (the program crashed, hung or was killed inside it) is failed.
              Under mpirun only rank 0 prints (tests/mpi/mpi_main.cpp).
  pytest      rank 0's closing line (`==== 12 passed, 1 skipped in 3.1s ====`);
              without one, its `-v` lines (`file.py::test PASSED`).
  others      a script or program that prints neither is one case, its
              meson result.
A program that failed although none of its cases did (a leak check at exit,
a crash after the last case, no closing summary) adds one failed case, so
that `0 failed` always means every program passed too. A stage whose log is
missing (its build failed, or meson test never ran) is one failed program.
After the stage lines, each failed program gets a line naming it, its
result and its failed cases, and a few lines of what it printed about the
first of them (CI shows the end of run.sh's output: that must say what
failed, not only how many):

    run.sh: ci: FAILED mpi-np2 (FAIL): Hang.Finalize, Boot.Shares
    run.sh:   | tests/mpi/hang_test.cpp:40: Failure
Exit status 0; the counts are the output.
"""
import json
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GTEST_RUN = re.compile(r"^\[ RUN      \] (\S+)")
GTEST_END = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?),?(?: where \S+ = .*)? \(\d+ ms\)$")
PYTEST_CLOSE = re.compile(r"^=+ (.*\d+ \w+.*) in [0-9.]+s(?: \([^)]*\))? =+$")
PYTEST_CASE = re.compile(r"^\S+::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
PYTEST_WORD = {
    "passed": "passed", "xfailed": "passed", "xpassed": "passed",
    "failed": "failed", "error": "failed", "errors": "failed",
    "skipped": "skipped",
}
PYTEST_CASE_WORD = {"PASSED": "passed", "XFAIL": "passed", "XPASS": "passed",
                    "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped"}
OK_RESULTS = ("OK", "EXPECTEDFAIL")
PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)")
DETAIL_LINES = 8   # lines of a failed program's output in the summary
NAMED_CASES = 6    # failed cases named per program


class Counts:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.prog_ok = self.prog_failed = self.prog_skipped = 0

    def add(self, other):
        for f in vars(self):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def line(self, what="cases"):
        return ("%d passed, %d failed, %d skipped (%s); programs: %d ok, %d failed, %d skipped"
                % (self.passed, self.failed, self.skipped, what,
                   self.prog_ok, self.prog_failed, self.prog_skipped))


def gtest_cases(lines):
    """(passed, failed, skipped) from GoogleTest's per-case lines, or None."""
    counts = {"OK": 0, "FAILED": 0, "SKIPPED": 0}
    running = None
    seen = False
    for line in lines:
        m = GTEST_RUN.match(line)
        if m:
            if running is not None:  # a case that started and never ended
                counts["FAILED"] += 1
            running, seen = m.group(1), True
            continue
        m = GTEST_END.match(line)
        if m and running is not None and m.group(2) == running:
            counts[m.group(1)] += 1
            running = None
    if not seen:
        return None
    if running is not None:
        counts["FAILED"] += 1
    return counts["OK"], counts["FAILED"], counts["SKIPPED"]


def pytest_cases(lines):
    """(passed, failed, skipped) from pytest's closing line or its -v lines, or None."""
    close = None
    for line in lines:
        m = PYTEST_CLOSE.match(line)
        if m:
            close = m.group(1)  # the last one: rank 0's (the others print -q lines)
    if close is not None:
        got = {"passed": 0, "failed": 0, "skipped": 0}
        for n, word in re.findall(r"(\d+) (\w+)", close):
            if word in PYTEST_WORD:
                got[PYTEST_WORD[word]] += int(n)
        return got["passed"], got["failed"], got["skipped"], True
    got = {"passed": 0, "failed": 0, "skipped": 0}
    seen = False
    for line in lines:
        m = PYTEST_CASE.match(line)
        if m:
            got[PYTEST_CASE_WORD[m.group(1)]] += 1
            seen = True
    if not seen:
        return None
    return got["passed"], got["failed"], got["skipped"], False


def output_lines(entry):
    text = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
    return [ANSI.sub("", l).rstrip("\r") for l in text.splitlines()]


def gtest_failed(lines):
    """Names of GoogleTest's failed (or never ended) cases, and the first one's output."""
    names, detail, running, since = [], [], None, 0
    for i, line in enumerate(lines):
        m = GTEST_RUN.match(line)
        end = GTEST_END.match(line)
        if m:
            if running is not None:
                names.append(running)
                detail = detail or lines[since:i]
            running, since = m.group(1), i + 1
        elif end and running is not None and end.group(2) == running:
            if end.group(1) == "FAILED":
                names.append(running)
                detail = detail or lines[since:i]
            running = None
    if running is not None:
        names.append(running)
        detail = detail or lines[since:]
    return names, detail


def failure_lines(stage, entry):
    """The summary's lines for one failed program: its name and cases, then some output."""
    lines = output_lines(entry)
    names, detail = gtest_failed(lines)
    if not names:
        names = [m.group(1) for m in map(PYTEST_FAILED.match, lines) if m]
        detail = []
    if not detail:
        detail = [l for l in lines if l.strip()][-DETAIL_LINES:]
    detail = [l for l in detail if l.strip()][:DETAIL_LINES]
    more = " (+%d more)" % (len(names) - NAMED_CASES) if len(names) > NAMED_CASES else ""
    head = "run.sh: %s: FAILED %s (%s)" % (stage, entry.get("name", "?"), entry.get("result", "ERROR"))
    if names:
        head += ": " + ", ".join(names[:NAMED_CASES]) + more
    return [head] + ["run.sh:   | " + l[:200] for l in detail]


def test_counts(entry):
    """Counts of one test program (one line of testlog.json)."""
    c = Counts()
    result = entry.get("result", "ERROR")
    lines = output_lines(entry)
    if result == "SKIP":
        c.prog_skipped = 1
    elif result in OK_RESULTS:
        c.prog_ok = 1
    else:
        c.prog_failed = 1
    cases = gtest_cases(lines)
    complete = True
    if cases is None:
        py = pytest_cases(lines)
        if py is not None:
            cases, complete = py[:3], py[3]
    if cases is None:  # neither: the program is its one case
        if c.prog_ok:
            c.passed = 1
        elif c.prog_skipped:
            c.skipped = 1
        else:
            c.failed = 1
        return c
    c.passed, c.failed, c.skipped = cases
    if (c.prog_failed or not complete) and c.failed == 0:
        c.failed = 1  # the program failed outside its cases, or never reached its summary
    return c


def stage_counts(stage, path):
    """(counts, found, lines about the failed programs) of one stage's log."""
    total, failed = Counts(), []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for raw in f:
                raw = raw.strip()
                if raw:
                    entry = json.loads(raw)
                    c = test_counts(entry)
                    total.add(c)
                    if c.prog_failed:
                        failed += failure_lines(stage, entry)
    except (OSError, ValueError):
        missing = Counts()
        missing.failed = missing.prog_failed = 1
        return missing, False, []
    return total, True, failed


def main(argv):
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        sys.stderr.write(__doc__)
        return 2
    grand, failed = Counts(), []
    for arg in argv[1:]:
        stage, path = arg.split("=", 1)
        c, found, lines = stage_counts(stage, path)
        note = "" if found else " (no %s: the stage's tests did not run)" % (path or "test log")
        print("run.sh: %s: %s%s" % (stage, c.line(), note))
        grand.add(c)
        failed += lines
    for line in failed:
        print(line)
    print("run.sh: " + grand.line("test cases"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
