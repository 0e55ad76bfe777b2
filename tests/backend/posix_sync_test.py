#!/usr/bin/env python3
"""posix_sync_test.py STRACE PROBE: with sync=1, a dump that returned OK is durable.

Runs posix_sync_probe (dumps shard 0 and 1 of a new block, then shard 0 again,
through a posix store with sync=1) under strace and checks, for each dump, the
system calls its I/O thread made before the dump was reported done:
  1. the shard's bytes written, then fdatasync'd (the data is on disk),
  2. the header written after that, then synced itself (the header is what
     says the shard exists: without a sync a power cut can lose it after OK),
  3. for the dump that created the block's file, the directory fsync'd after
     the file's sync (a new name is durable only once its directory is).
It checks the syscalls, not a power cut: that needs a device it cannot have.
"""
import os
import re
import subprocess
import sys
import tempfile

LINE = re.compile(r"^(\d+)\s+(\w+)\((\d+)<([^>]*)>(.*)$")


def parse(path):
    """Each traced call on an fd: (name, fd path, rest of the line), in order."""
    calls = []
    with open(path) as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if m:
                calls.append((m.group(2), m.group(4), m.group(5)))
    return calls


def split_by_marker(calls):
    """The calls between each 'dump shard N' marker written to stdout and the next."""
    parts, cur, label = [], None, None
    for name, fdpath, rest in calls:
        if name == "write" and ('"dump shard' in rest or '"ok' in rest):
            if cur is not None:
                parts.append((label, cur))
            label, cur = rest, []
            continue
        if cur is not None:
            cur.append((name, fdpath, rest))
    return parts


def check_dump(label, calls, store, created):
    errors = []
    names = [(n, p, r) for n, p, r in calls if p.startswith(store + "/")]
    if not names:
        return [f"{label}: no calls on a file under {store}"]
    block = names[0][1]
    seq = [(n, r) for n, p, r in names if p == block]
    writes = [i for i, (n, _) in enumerate(seq) if n in ("pwrite64", "pwrite")]
    syncs = [i for i, (n, _) in enumerate(seq) if n in ("fdatasync", "fsync")]
    if len(writes) < 2:
        return [f"{label}: expected a data and a header write on {block}, saw {seq}"]
    data_w, header_w = writes[0], writes[-1]
    if not any(data_w < s < header_w for s in syncs):
        errors.append(f"{label}: the shard's bytes are not synced before its header is written: {seq}")
    if not any(s > header_w for s in syncs):
        errors.append(f"{label}: the header is written but never synced before the dump is done: {seq}")
    if created:
        last_file_sync = max(syncs) if syncs else -1
        # Position of the directory sync relative to the file's calls, in the whole list.
        file_idx = [i for i, (n, p, r) in enumerate(calls) if p == block]
        dir_syncs = [i for i, (n, p, r) in enumerate(calls) if p == store and n in ("fsync", "fdatasync")]
        after = file_idx[[i for i, (n, _) in enumerate(seq)].index(last_file_sync)] if syncs else -1
        if not any(d > after for d in dir_syncs):
            errors.append(f"{label}: the block file {block} was created but its directory {store} "
                          f"is never fsync'd before the dump is done")
    return errors


def main():
    strace, probe = sys.argv[1], sys.argv[2]
    if not strace:
        print("SKIP: strace is not installed (run.sh installs it): the syncs cannot be observed")
        return 77
    with tempfile.TemporaryDirectory(prefix="ucm-sync-") as tmp:
        store = os.path.join(tmp, "store")
        os.mkdir(store, 0o700)
        trace = os.path.join(tmp, "trace")
        cmd = [strace, "-f", "-qq", "-y", "-s", "16", "-o", trace,
               "-e", "trace=openat,pwrite64,fdatasync,fsync,write", probe, store]
        # LeakSanitizer cannot run under ptrace: in an ASan build the probe
        # runs without its leak check (the unit suite checks that code for leaks).
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        if p.returncode != 0:
            print(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}{p.stderr}")
            return 1
        store = os.path.realpath(store)
        parts = split_by_marker(parse(trace))
        dumps = [(label, calls) for label, calls in parts if '"dump shard' in label]
        if len(dumps) != 3:
            print(f"FAIL: expected 3 dumps in the trace, found {len(dumps)}")
            return 1
        errors = []
        for i, (label, calls) in enumerate(dumps):
            errors += check_dump(label.split(",")[1].strip(), calls, store, created=(i == 0))
        for e in errors:
            print("FAIL:", e)
        if errors:
            return 1
        print("ok: 3 sync dumps: data synced before the header, the header synced, the new name's directory synced")
        return 0


if __name__ == "__main__":
    sys.exit(main())
