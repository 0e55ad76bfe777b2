#!/usr/bin/env bash
# tools/measure_e2e.sh at its smoke size, 1 repetition, on this build (no
# build of its own: E2E_NO_BUILD), for the modes given: each benchmark runs
# once, tiny, with its outcome checks (--check where it has one), and the
# script parses its output. Checked: the run succeeds, the summary has every
# mode's ratios (the ones each goal is judged by, by name), the counts that
# do not depend on the clock are sane, every plot the modes draw is there and
# is well-formed SVG, the outputs stay small, and the machine's hugepage
# count is what it was. Never a time.
# Usage: e2e_smoke.sh MEASURE_E2E BUILD_ROOT PYTHON OUTDIR MODES...
set -euo pipefail
measure=$1 build=$2 python=$3 out=$4
shift 4
modes="$*"
rm -rf "$out"
hp_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo none)
# E2E_HUGEPAGES=0: a test leaves the machine's hugepages alone (the script
# reserves some for the full measurement, and restores them).
E2E_SIZE=smoke E2E_REPS=1 E2E_NO_BUILD=1 E2E_BUILD=$build E2E_HUGEPAGES=0 E2E_MODES=$modes E2E_PYTHON=$python \
  bash "$measure" "$out" >"$out.log" 2>&1 || { tail -n 40 "$out.log"; echo "e2e-smoke: measure_e2e.sh failed"; exit 1; }
hp_after=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo none)
[[ $hp_before == "$hp_after" ]] || { echo "e2e-smoke: nr_hugepages $hp_before before, $hp_after after"; exit 1; }

"$python" - "$out" $modes <<'PY'
import json, os, re, sys
import xml.etree.ElementTree as ET
out, modes = sys.argv[1], sys.argv[2:]
s = json.load(open(os.path.join(out, "summary.json")))
ratios = s["ratios"]
bad = []
def need(ok, what):
    if not ok:
        bad.append(what)
# The ratios each goal is judged by, by name (a renamed or lost line fails here).
expected = {
    "demo": [r"loads, 4 ranks / 1 rank, window 1", r"fraction of achievable, 4 ranks, window \d+ \(Belady's MIN\)"],
    "cachebench": [r"/v1m: .*hit"],
    "drift": [r"loads per unique shard, 1 rank alone, lag 0 tasks", r"loads 4 ranks / 1 rank, with protection, lag \d+ tasks",
              r"loads 4 ranks / 1 rank, without protection, lag \d+ tasks", r"owner loads max/min, with protection, lag \d+ tasks"],
    "taskcost": [r"task time above its memcpy \(us\), inline, 1 x 16 KiB, 1 rank", r"fraction of memcpy, inline, 64 x 16 KiB, 1 rank",
                 r"fraction of memcpy, inline, 64 x 16 KiB, 2 ranks"],
    "miss": [r"slowest / median miss after a fill, \d+ slots", r"miss's slowest/median over the control's",
             r"most CLOCK positions in one lock hold / its bound"],
    "hit4k512k": [r"hit overhead above memcpy, 4 KiB pages, 4096-byte shards, \d+ slots / \d+ slots",
                  r"hit overhead above memcpy, (2 MiB hugetlb pages|THP hint only|mixed pages), 4096-byte shards, \d+ slots / \d+ slots",
                  r"memcpy alone, 4096-byte shards, \d+ slots / \d+ slots, beside 4 KiB pages",
                  r"hit overhead's growth over memcpy's growth, 4 KiB pages, 4096-byte shards, \d+ slots / \d+ slots",
                  r"hit overhead above memcpy \(ns\), 4 KiB pages, 1024-byte shards, \d+ slots"],
    "fill": [r"first fill fresh / warm, populated at init", r"first fill fresh / warm, not populated .*"],
    "finalize": [r"finalize, \d+ ranks / 1 rank, .* by the most CPU of a rank", r"finalize, \d+ ranks / 1 rank, .* by the slowest rank's wall"],
    "defer": [r"rank 0's CPU time / wall time while deferring", r"wakes by the bell / sleeps"],
}
for m in modes:
    mine = [r for r in ratios if r["mode"] == m]
    need(mine, "mode %s: no ratio in the summary" % m)
    for pat in expected.get(m, []):
        hit = [r for r in mine if re.fullmatch(pat, r["metric"])]
        need(hit, "mode %s: no ratio named /%s/" % (m, pat))
        need(all(r["n"] == 1 and r["median"] is not None for r in hit), "mode %s: /%s/ has no value" % (m, pat))
    need(all(r["n"] == 1 for r in mine), "mode %s: a ratio without its one value" % m)
val = lambda m, pat: [r["median"] for r in ratios if r["mode"] == m and re.fullmatch(pat, r["metric"])]
# Counts (not times): every unique shard was loaded at least once; a deferring
# rank was woken by the bell; one lock hold stays within its bound.
if "drift" in modes:
    need(all(v >= 1.0 for v in val("drift", r"loads per unique shard, .*")), "drift: a mode loaded fewer than the unique shards")
if "defer" in modes:
    need(val("defer", r"wakes by the bell / sleeps") and val("defer", r"wakes by the bell / sleeps")[0] > 0, "defer: never woken by the bell")
# Goal 5 is judged by the overhead's growth over memcpy's own growth, never
# by the raw growth (which memcpy's growth alone can push past 1.2).
if "hit4k512k" in modes:
    need(all(r["target"] == "-" for r in ratios if r["mode"] == "hit4k512k" and not r["metric"].startswith("hit overhead's growth")),
         "hit4k512k: a target on a raw growth, not on the growth over memcpy's")
if "miss" in modes:
    need(0 < val("miss", r"most CLOCK positions in one lock hold / its bound")[0] <= 1, "miss: a lock hold over its bound")
# The plots: there for the modes that draw them, and well-formed SVG with a curve.
plots = {"drift": ["drift.svg", "drift_owners.svg"], "hit4k512k": ["hit_slots.svg", "hit_shards.svg"]}
for m in modes:
    for name in plots.get(m, []):
        path = os.path.join(out, "plots", name)
        if not os.path.exists(path):
            bad.append("no plots/%s" % name)
            continue
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            bad.append("plots/%s is not well-formed XML: %s" % (name, e))
            continue
        ns = "{http://www.w3.org/2000/svg}"
        need(root.tag == ns + "svg", "plots/%s: the root is %s, not svg" % (name, root.tag))
        need(root.findall(".//%spolyline" % ns), "plots/%s: no curve" % name)
total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
need(total < 200 * 1024, "outputs are %d bytes, over 200 KB" % total)
need(os.path.exists(os.path.join(out, "summary.md")), "no summary.md")
if bad:
    sys.exit("e2e-smoke: " + "\n  ".join([""] + bad))
print("e2e-smoke: %d ratios from modes %s, %d bytes of output; plots well-formed" % (len(ratios), " ".join(modes), total))
PY
