#!/usr/bin/env python3
"""Print the ninja targets that the tests of some suites need, one a line.

usage: suite_targets.py BUILD_DIR SUITE...

A stage that runs only some suites builds only what their tests run: each
test's own program and its `depends` (meson introspect --tests), plus every
installed target, since test `install` runs `meson install --no-rebuild`,
which copies all of them. Benchmarks, and the test programs of suites the
stage does not run, are left unbuilt. Outputs are paths relative to
BUILD_DIR, as ninja names them.
"""
import json
import os
import subprocess
import sys


def introspect(build_dir, what):
    out = subprocess.run(["meson", "introspect", build_dir, "--" + what],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def targets_for(tests, targets, build_dir, suites):
    """The output files (relative to build_dir) the named suites' tests need."""
    by_id = {t["id"]: t for t in targets}
    by_file = {os.path.realpath(f): t for t in targets for f in t["filename"]}
    wanted = set()
    want_suites = {"ucmcache:" + s for s in suites} | set(suites)
    for test in tests:
        if not want_suites & set(test["suite"]):
            continue
        wanted.update(test["depends"])
        for word in test["cmd"]:  # the program itself, and any built file it is given
            t = by_file.get(os.path.realpath(word))
            if t is not None:
                wanted.add(t["id"])
    wanted.update(t["id"] for t in targets if t.get("installed"))
    root = os.path.realpath(build_dir)
    files = set()
    for tid in wanted:
        for f in by_id[tid]["filename"]:
            files.add(os.path.relpath(os.path.realpath(f), root))
    return sorted(files)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    build_dir, suites = argv[1], argv[2:]
    tests = introspect(build_dir, "tests")
    known = {s.split(":")[-1] for t in tests for s in t["suite"]}
    bad = [s for s in suites if s not in known]
    if bad:
        sys.stderr.write("suite_targets.py: no such suite in %s: %s (known: %s)\n"
                         % (build_dir, " ".join(bad), " ".join(sorted(known))))
        return 2
    for f in targets_for(tests, introspect(build_dir, "targets"), build_dir, suites):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
