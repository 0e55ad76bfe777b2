#!/usr/bin/env bash
# ucm_demo prints and writes its own bound (issue 15, goal 2): run it tiny
# with 1 rank, then with 2 ranks given the 1-rank count, and check that the
# bound is there and sane. Outcomes only: no time is compared with a number,
# only the fraction with its possible range (a decode cannot beat what the
# store and the cache allow by half again, and it took some time).
# Usage: demo_bound.sh MPIRUN UCM_DEMO PYTHON OUTDIR
set -euo pipefail
mpirun=$1 demo=$2 python=$3 out=$4
mkdir -p "$out"
# 256 shards of 16 KiB through a cache of 64 + 64 slots: eviction, reloads.
args=(--prompts 32 --layers 8 --shard-kib 16 --cache-mib 1 --steps 2 --raw-passes 2)

check() {  # check JSON NP: the bound's fields, printed as the checks see them
  "$python" - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); np = int(sys.argv[2]); b = d["bound"]
def need(ok, what):
    if not ok:
        sys.exit("demo bound check failed: %s in %s" % (what, json.dumps(d, indent=1)))
need(d["ranks"] == np, "ranks == %d" % np)
need(d["bad_shards"] == 0, "every byte verified")
need(b["raw_error"] == "", "a raw read rate was measured")
need(b["raw_bytes_per_pass"] > 0 and b["raw_best_GBps"] > 0, "the raw read read something")
need(b["capacity_slots"] == 128, "capacity = regular + reserved slots (64 + 64)")
# Belady's MIN: no fewer than the shards not resident at start, no more than made.
need(d["unique_shards"] - b["resident_at_start"] <= b["min_loads"] <= d["loads"], "compulsory <= MIN <= loads")
need(0 < b["fraction"] <= 1.5, "fraction in (0, 1.5]")
need(0 < b["fraction_in_tasks"] <= 1.5, "fraction_in_tasks in (0, 1.5]")
need(b["one_rank_loads"] is not None, "the 1-rank count is known")
need(b["min_loads"] <= b["one_rank_loads"], "MIN <= the 1-rank count")
need(0 < b["fraction_one_rank"] <= 1.5, "fraction_one_rank in (0, 1.5]")
if np == 1:
    need(b["one_rank_loads"] == d["loads"], "1 rank: its own loads are the 1-rank count")
print("np %d: loads %d, MIN %d, 1-rank %d, fraction %.3f" % (np, d["loads"], b["min_loads"], b["one_rank_loads"], b["fraction"]))
PY
}

"$mpirun" --oversubscribe --timeout 100 -np 1 "$demo" "${args[@]}" --json "$out/demo-np1.json" > "$out/demo-np1.txt"
for line in "bound: min loads" "bound: raw read" "bound: achievable decode" "bound, the issue's count (the loads 1 rank"; do
  grep -qF "$line" "$out/demo-np1.txt" || { echo "np 1: no '$line' in the summary:"; cat "$out/demo-np1.txt"; exit 1; }
done
check "$out/demo-np1.json" 1
one=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["loads"])' "$out/demo-np1.json")

# Without the 1-rank count, a 2-rank run says it does not know it.
"$mpirun" --oversubscribe --timeout 100 -np 2 "$demo" "${args[@]}" --json "$out/demo-np2-alone.json" > "$out/demo-np2-alone.txt"
grep -qF "bound, the issue's count: not known with 2 ranks per node" "$out/demo-np2-alone.txt" \
  || { echo "np 2: the unknown 1-rank count is not said:"; cat "$out/demo-np2-alone.txt"; exit 1; }
"$mpirun" --oversubscribe --timeout 100 -np 2 "$demo" "${args[@]}" --one-rank-loads "$one" \
  --json "$out/demo-np2.json" > "$out/demo-np2.txt"
check "$out/demo-np2.json" 2
echo "demo bound: ok"
