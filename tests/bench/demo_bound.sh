#!/usr/bin/env bash
# ucm_demo prints and writes its own bound (issue 15, goal 2): run it tiny
# with 1 rank, then with 2 ranks given the 1-rank count, and check that the
# bound is there and sane. Outcomes only: no time is compared with a number,
# only the fraction with its possible range (a decode cannot beat what the
# store and the cache allow by half again, and it took some time).
# Then the decode pipeline (--window): every window verifies every byte and
# keeps at most its window in flight; a byte flipped in a store file makes
# the run report bad shards and exit non-zero, with any window; bad --window
# and --kv-layers values are refused, naming the value.
# The cpu bound (the copies into the KV buffers at the run's memcpy rate) is
# there beside the store's, and the binding one is the larger.
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
need(d["pipeline"]["failed_tasks"] == 0, "no load task failed")
need(d["bad_shards"] == 0, "every byte verified")
need(isinstance(d["no_space"], int) and d["no_space"] >= 0, "no_space (retries of a get() that found no free slot) counted")
# Prefill: every rank dumps every shard; the node writes each at least once,
# and again only when it was evicted before a slower rank dumped it.
need(d["unique_shards"] <= d["prefill_writes"] <= d["unique_shards"] * d["local_size"], "unique <= prefill writes <= ranks x unique")
if np == 1:
    need(d["prefill_writes"] == d["unique_shards"], "1 rank: each shard written once")
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
# The cpu bound beside the store's: every shard asked for is copied once, on
# min(local ranks, cpus) cores at the memcpy rate measured in this run.
need(b["memcpy_error"] == "" and b["memcpy_best_GBps"] > 0 and b["memcpy_passes"] >= 2, "a memcpy rate was measured")
need(b["cpu_copy_cores"] == min(d["local_size"], d["pipeline"]["cpus"]) == b["memcpy_threads"],
     "the copies' cores = min(local ranks, cpus), measured on as many threads")
need(b["cpu_copy_bytes_per_rank"] == d["tasks_per_rank"] * d["prompts"] * d["shard_bytes"], "copy bytes = every shard asked for")
need(b["cpu_bound_s"] > 0, "a cpu bound")
need(b["binding"] == ("cpu" if b["cpu_bound_s"] > b["achievable_s"] else "store"), "the binding bound is the larger")
need(b["fraction"] <= b["fraction_binding"] <= 1.5, "fraction <= fraction_binding <= 1.5")
need(d["pipeline"]["verify_GBps_per_core"] > 0, "a verification rate")
print("np %d: loads %d, MIN %d, 1-rank %d, fraction %.3f" % (np, d["loads"], b["min_loads"], b["one_rank_loads"], b["fraction"]))
PY
}

"$mpirun" --oversubscribe --timeout 100 -np 1 "$demo" "${args[@]}" --json "$out/demo-np1.json" > "$out/demo-np1.txt"
for line in "bound: min loads" "bound: raw read" "bound: achievable decode" "bound, the issue's count (the loads 1 rank" \
  "bound, cpu: each rank copies" "bound, binding: the " "  verifying: " " write-throughs for 256 unique shards (1.00 per unique shard"; do
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

# ---- the pipeline: windows 1 (the old demo), 2 (the default) and 9, deeper
# than a decode step (8 layers): every byte checked, the window honoured, a
# KV part per task in flight that never receives the layer it held.
for np in 1 2; do
  for w in 1 2 9; do
    j=$out/demo-w$w-np$np.json
    "$mpirun" --oversubscribe --timeout 100 -np $np "$demo" "${args[@]}" --raw-passes 1 --window $w --json "$j" \
      > "$out/demo-w$w-np$np.txt" || { echo "np $np window $w failed:"; cat "$out/demo-w$w-np$np.txt"; exit 1; }
    grep -qF "  result: window $w: reached " "$out/demo-w$w-np$np.txt" \
      || { echo "np $np window $w: no result line:"; cat "$out/demo-w$w-np$np.txt"; exit 1; }
    "$python" - "$j" $w $np <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); w = int(sys.argv[2]); np = int(sys.argv[3]); p = d["pipeline"]
def need(ok, what):
    if not ok:
        sys.exit("window %d, np %d: %s in %s" % (w, np, what, json.dumps(d, indent=1)))
need(d["bad_shards"] == 0 and p["failed_tasks"] == 0, "every byte right, no task failed")
need(d["tasks_per_rank"] == d["steps"] * d["layers"], "one task per layer per step")
need(p["window"] == w and p["flight_max"] == min(w, d["tasks_per_rank"]), "the window in flight at most, and reached")
need(p["kv_layers"] >= w and p["kv_layers"] % d["layers"] != 0, "a KV part per task in flight, never the same layer twice")
need(p["cpu_s_sum"] > 0 and p["cpus"] >= 1, "cpu time counted")
print("window %d, np %d: loads %d, kv_layers %d: ok" % (w, np, d["loads"], p["kv_layers"]))
PY
  done
done

# ---- bad options: refused before any work, naming the value ---------------
refused() {  # refused WHAT ARGS...: the demo exits non-zero and its stderr names WHAT
  local what=$1; shift
  # A singleton (no mpirun): the options are refused on one rank before any
  # work, and mpirun's own start cost 2 s a case, 21 cases, in a serial test.
  if timeout 60 "$demo" "${args[@]}" "$@" > "$out/refused.txt" 2>&1; then
    echo "ucm_demo $* was accepted:"; cat "$out/refused.txt"; exit 1
  fi
  grep -qF -- "$what" "$out/refused.txt" || { echo "ucm_demo $*: the error does not name '$what':"; cat "$out/refused.txt"; exit 1; }
}
refused "--window 0: at least 1" --window 0
refused "--window -3: at least 1" --window -3
refused "--window two: not a whole number" --window two
refused "--window 3 is larger than the KV buffer allows: --kv-layers 2" --window 3 --kv-layers 2
refused "--kv-layers -1: at least 1" --kv-layers -1
refused "--window 100000: at most 256" --window 100000
refused "--decode-only needs the store" --decode-only
# The sim store makes up every shard's bytes from its key: what the demo
# dumps is never what it loads, so every run "FAILED" its verification.
refused "--backend sim:latency_us=0: the sim store does not keep what is dumped" --backend sim:latency_us=0
refused "--layers 65537: at most 65536" --layers 65537
# Every number flag: a value that is not a whole number, or out of its range,
# is refused naming the flag and the value (atoi once read "x" as 0).
refused "--prompts x: not a whole number" --prompts x
refused "--prompts 0: at least 1" --prompts 0
refused "--layers 3x: not a whole number" --layers 3x
refused "--shard-kib 2: at least 4" --shard-kib 2
refused "--shard-kib -16: at least 4" --shard-kib -16
refused "--cache-mib 0: at least 1" --cache-mib 0
refused "--steps 1.5: not a whole number" --steps 1.5
refused "--hot -1: at least 0" --hot -1
refused "--hot 40: at most --prompts 32" --prompts 32 --hot 40
refused "--raw-passes 101: at most 100" --raw-passes 101
refused "--one-rank-loads many: not a whole number" --one-rank-loads many
refused "--one-rank-loads 99999999999999999999: not a whole number that fits" --one-rank-loads 99999999999999999999
# --json is written after the run: a path that cannot be written is refused
# before it (the run's result was lost after it), and no file is left.
refused "--json $out/no-such-dir/demo.json: cannot write it: No such file or directory" --json "$out/no-such-dir/demo.json"
mkdir -p "$out/a-dir.json"
refused "--json $out/a-dir.json: cannot write it" --json "$out/a-dir.json"
"$mpirun" --oversubscribe --timeout 100 -np 2 "$demo" "${args[@]}" --json "$out/no-such-dir/demo.json" > "$out/refused-np2.txt" 2>&1 \
  && { echo "np 2: an unwritable --json was accepted:"; cat "$out/refused-np2.txt"; exit 1; }
grep -qF "cannot write it" "$out/refused-np2.txt" || { echo "np 2: the --json error is not said:"; cat "$out/refused-np2.txt"; exit 1; }
if grep -qF "summary" "$out/refused-np2.txt"; then echo "np 2: the run went on before --json was refused:"; cat "$out/refused-np2.txt"; exit 1; fi
echo "bad options: refused, each naming its value"

# ---- a corrupt shard in the store: reported, counted, exit non-zero --------
# Prefill into a store of our own, check that decoding it again from a fresh
# cache (--decode-only: every shard from the store) is right, flip one byte
# of one shard in one block file, and decode it again with several windows.
store=$out/store
rm -rf "$store"; mkdir -m 700 "$store"
"$mpirun" --oversubscribe --timeout 100 -np 1 "$demo" "${args[@]}" --raw-passes 1 --store "$store" > "$out/store-prefill.txt" \
  || { echo "prefill into $store failed:"; cat "$out/store-prefill.txt"; exit 1; }
"$mpirun" --oversubscribe --timeout 100 -np 1 "$demo" "${args[@]}" --raw-passes 1 --store "$store" --decode-only \
  --json "$out/decode-only.json" > "$out/decode-only.txt" \
  || { echo "decode-only of a good store failed:"; cat "$out/decode-only.txt"; exit 1; }
"$python" - "$out/decode-only.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if d["bad_shards"] != 0 or d["bound"]["resident_at_start"] != 0 or d["loads"] < d["unique_shards"]:
    sys.exit("decode-only: every shard loaded from the store, every byte right: %s" % json.dumps(d, indent=1))
PY
"$python" - "$store" <<'PY'
import os, sys
files = sorted(f for f in os.listdir(sys.argv[1]) if f.endswith(".ucmblk"))
path = os.path.join(sys.argv[1], files[0])
with open(path, "r+b") as f:  # byte 1000 of layer 3's shard of this block (16 KiB shards)
    f.seek(3 * 16384 + 1000); b = f.read(1); f.seek(3 * 16384 + 1000); f.write(bytes([b[0] ^ 0x5A]))
print("flipped a byte of layer 3 in", path)
PY
for run in "1 1" "1 2" "1 4" "2 2" "2 1"; do
  read -r np w <<<"$run"
  t=$out/corrupt-w$w-np$np
  if "$mpirun" --oversubscribe --timeout 100 -np $np "$demo" "${args[@]}" --raw-passes 1 --store "$store" --decode-only \
    --window $w --json "$t.json" > "$t.txt" 2> "$t.err"; then
    echo "np $np window $w: a corrupt shard, and the demo exited 0:"; cat "$t.txt" "$t.err"; exit 1
  fi
  grep -qF "verification: FAILED" "$t.txt" || { echo "np $np window $w: no FAILED verification:"; cat "$t.txt" "$t.err"; exit 1; }
  grep -qF "load task failed: UCM_ERR_CORRUPT" "$t.err" || { echo "np $np window $w: the failure is not named:"; cat "$t.err"; exit 1; }
  "$python" - "$t.json" $np $w <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); np = int(sys.argv[2])
# The flipped shard is asked for in each step, by every rank.
if not (d["bad_shards"] >= d["steps"] * np and d["pipeline"]["failed_tasks"] >= d["steps"] * np):
    sys.exit("corrupt shard: a bad shard and a failed task per step per rank: %s" % json.dumps(d, indent=1))
print("corrupt shard, np %d window %s: %d bad shards, %d failed tasks: caught" % (np, sys.argv[3], d["bad_shards"], d["pipeline"]["failed_tasks"]))
PY
done
echo "demo bound: ok"
