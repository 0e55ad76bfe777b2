#!/usr/bin/env bash
# measure_e2e.sh OUTDIR: issue 15's end-to-end measurements, in one call, on a
# quiet machine. Builds a release build directory, then runs every issue-15
# benchmark there is, in sequence and quietly (each run's output goes to a
# log under OUTDIR), E2E_REPS times (5) with the repetitions outermost, so
# that a drift in the machine's load hits every mode alike. Every number kept
# is a ratio measured side by side in one run; OUTDIR/summary.md (and
# summary.json) gives each ratio's median and range over the repetitions,
# with its target. docs/results.md, "End to end", says how to read it.
#
#   tools/measure_e2e.sh docs/data/e2e                 # the measurement
#   E2E_SIZE=smoke E2E_REPS=1 tools/measure_e2e.sh /tmp/e2e   # the smallest sizes: checks it works
#
# Variables: E2E_REPS (5), E2E_SIZE (full | smoke), E2E_MODES (the modes to
# run, default every mode below), E2E_DEMO_WINDOW (2: the demo's pipeline
# window, run beside window 1), E2E_BUILD (build-e2e), UCM_JOBS (2: the
# build's parallelism), E2E_PREFIX (a command put before each benchmark, such
# as "chrt -f 10"). Outputs stay small (well under 200 KB): per-run JSON and
# the tail of each log, never raw samples.
#
# Adding a mode (the other parts of issue 15): write `mode_NAME REP` below,
# which runs its benchmark once through `run LOG cmd...` and records each of
# its ratios with `ratio MODE METRIC REP VALUE TARGET`; add NAME to ALL_MODES
# and its targets to the table in docs/results.md. The places are marked
# "ADD A MODE HERE".
set -euo pipefail

out=${1:?usage: tools/measure_e2e.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
REPS=${E2E_REPS:-5}
SIZE=${E2E_SIZE:-full}
BUILD=${E2E_BUILD:-$root/build-e2e}
JOBS=${UCM_JOBS:-2}
DEMO_WINDOW=${E2E_DEMO_WINDOW:-2}
# ADD A MODE HERE (1/3): its name, in the order the modes run within a rep.
ALL_MODES="demo cachebench"
MODES=${E2E_MODES:-$ALL_MODES}
read -r -a PREFIX <<<"${E2E_PREFIX:-}"
case $SIZE in full | smoke) ;; *) echo "measure_e2e: E2E_SIZE=$SIZE: full or smoke" >&2; exit 2 ;; esac
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "measure_e2e: E2E_REPS=$REPS: a count >= 1" >&2; exit 2; }
[[ $DEMO_WINDOW =~ ^[1-9][0-9]*$ ]] || { echo "measure_e2e: E2E_DEMO_WINDOW=$DEMO_WINDOW: a window >= 1" >&2; exit 2; }
for m in $MODES; do
  [[ " $ALL_MODES " == *" $m "* ]] || { echo "measure_e2e: unknown mode $m (modes: $ALL_MODES)" >&2; exit 2; }
done

mkdir -p "$out/logs" "$out/json"
out=$(cd "$out" && pwd)
tsv=$out/ratios.tsv
printf 'mode\tmetric\trep\tvalue\ttarget\n' >"$tsv"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
say() { echo "measure_e2e: $*"; }

# ---- the machine and the build ----------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "size: $SIZE, reps: $REPS, modes: $MODES, demo window: $DEMO_WINDOW (and 1), prefix: ${E2E_PREFIX:-none}"
  echo "host: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "hugepages: $(cat /proc/sys/vm/nr_hugepages) (2 MiB), THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo n/a)"
} >"$out/machine.txt"

say "build $BUILD (release)"
if [[ -f $BUILD/meson-private/coredata.dat ]]; then
  meson setup --reconfigure "$BUILD" "$root" -Dbuildtype=release -Dtests=false >"$out/logs/build.log" 2>&1
else
  meson setup "$BUILD" "$root" -Dbuildtype=release -Dtests=false >"$out/logs/build.log" 2>&1
fi
# ADD A MODE HERE (2/3): the targets its benchmark needs.
targets=(apps/ucm_demo bench/ucm_cachebench)
if ! ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" >>"$out/logs/build.log" 2>&1; then
  tail -n 30 "$out/logs/build.log"; say "build failed (log: logs/build.log)"; exit 1
fi
tail -n 5 "$out/logs/build.log" >"$out/logs/build.log.tail" && mv "$out/logs/build.log.tail" "$out/logs/build.log"

# run LOG cmd...: runs one benchmark quietly, its output in logs/LOG.log (the
# last 60 lines kept); a failed run stops the measurement, since its ratios
# would be missing.
run() {
  local log=$out/logs/$1.log; shift
  local t0=$SECONDS rc=0
  "${PREFIX[@]}" "$@" >"$log.full" 2>&1 || rc=$?
  tail -n 60 "$log.full" >"$log"
  rm -f "$log.full"
  if ((rc != 0)); then
    tail -n 20 "$log"; say "FAILED (exit $rc): $* (log: logs/$(basename "$log"))"; exit 1
  fi
  say "  $(basename "$log" .log): $((SECONDS - t0)) s"
}

# ratio MODE METRIC REP VALUE TARGET: one measured ratio (TARGET: "<= 1.05",
# ">= 0.8", or "-" for a number kept to read the others by).
ratio() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$tsv"; }

# json FILE EXPR [ARG...]: a value from a JSON file (EXPR in Python over d, the
# file's object, and a, the ARGs); null for a value the run could not know.
json() {
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); a = sys.argv[3:]; v = eval(sys.argv[2]); print("null" if v is None else v)' "$@"
}

# ---- mode demo: the main job, 1 rank vs 4 ranks, and its bound (goals 1, 2) --
# One node, posix store in a fresh directory each run. Each rep runs the demo
# with the default pipeline window (E2E_DEMO_WINDOW, 2: that many layer tasks
# in flight, as an engine prefetches) and with window 1 (submit, wait, verify,
# next: the demo before the window), the same sizes and cache. The 1-rank
# run's loads are the issue's count of the fewest loads; the 4-rank run of
# the same window gets them. Ranks are not bound to cores (--bind-to none:
# Open MPI binds a lone rank to one core, which is not what the machine
# allows). The fraction is the demo's "result:" line.
mode_demo() {
  local rep=$1 args=() w one j1 j4
  # smoke: 256 shards of 16 KiB through 64 + 64 slots, so that it evicts and reloads.
  [[ $SIZE == smoke ]] && args=(--prompts 32 --layers 8 --shard-kib 16 --cache-mib 1 --steps 2 --raw-passes 1)
  for w in "$DEMO_WINDOW" 1; do
    j1=$out/json/demo-w$w-np1-rep$rep.json j4=$out/json/demo-w$w-np4-rep$rep.json
    run "demo-w$w-np1-rep$rep" mpirun --oversubscribe --bind-to none --timeout 900 -np 1 "$BUILD/apps/ucm_demo" \
      "${args[@]}" --window "$w" --json "$j1"
    one=$(json "$j1" 'd["loads"]')
    run "demo-w$w-np4-rep$rep" mpirun --oversubscribe --bind-to none --timeout 900 -np 4 "$BUILD/apps/ucm_demo" \
      "${args[@]}" --window "$w" --one-rank-loads "$one" --json "$j4"
  done
  local wj1=$out/json/demo-w$DEMO_WINDOW-np1-rep$rep.json wj4=$out/json/demo-w$DEMO_WINDOW-np4-rep$rep.json
  local oj1=$out/json/demo-w1-np1-rep$rep.json oj4=$out/json/demo-w1-np4-rep$rep.json
  local W="window $DEMO_WINDOW"
  ratio demo "fraction of achievable, 4 ranks, $W (1-rank count)" "$rep" "$(json "$wj4" 'd["bound"]["fraction_one_rank"]')" ">= 0.8"
  ratio demo "fraction of achievable, 4 ranks, $W (Belady's MIN)" "$rep" "$(json "$wj4" 'd["bound"]["fraction"]')" ">= 0.8"
  # The stricter count for the window: what 1 rank loads with window 1 (a window
  # makes the cache load more, and its own 1-rank count grows with it).
  ratio demo "fraction of achievable, 4 ranks, $W (window 1's 1-rank count)" "$rep" \
    "$(json "$wj4" 'd["bound"]["achievable_one_rank_s"] / d["bound"]["one_rank_loads"] * json.load(open(a[0]))["loads"] / d["decode_s"]' "$oj1")" "-"
  ratio demo "fraction of achievable, 1 rank, $W (1-rank count)" "$rep" "$(json "$wj1" 'd["bound"]["fraction_one_rank"]')" "-"
  ratio demo "fraction of achievable, 1 rank, $W (Belady's MIN)" "$rep" "$(json "$wj1" 'd["bound"]["fraction"]')" "-"
  ratio demo "fraction of achievable, 4 ranks, window 1 (1-rank count)" "$rep" "$(json "$oj4" 'd["bound"]["fraction_one_rank"]')" "-"
  ratio demo "fraction of achievable, 4 ranks, window 1 (Belady's MIN)" "$rep" "$(json "$oj4" 'd["bound"]["fraction"]')" "-"
  ratio demo "fraction of achievable, 1 rank, window 1 (1-rank count)" "$rep" "$(json "$oj1" 'd["bound"]["fraction_one_rank"]')" "-"
  ratio demo "decode time, 4 ranks, $W / window 1" "$rep" "$(json "$wj4" 'd["decode_s"] / json.load(open(a[0]))["decode_s"]' "$oj4")" "-"
  ratio demo "decode time, 1 rank, $W / window 1" "$rep" "$(json "$wj1" 'd["decode_s"] / json.load(open(a[0]))["decode_s"]' "$oj1")" "-"
  ratio demo "fraction, 4 ranks, $W, time in the cache's calls (Belady's MIN)" "$rep" "$(json "$wj4" 'd["bound"]["fraction_in_tasks"]')" "-"
  ratio demo "cpu time over cpus / achievable, 4 ranks, $W" "$rep" "$(json "$wj4" 'd["pipeline"]["cpu_s_sum"] / d["pipeline"]["cpus"] / d["bound"]["achievable_s"]')" "-"
  ratio demo "cpu time over cpus / achievable, 1 rank, $W" "$rep" "$(json "$wj1" 'd["pipeline"]["cpu_s_sum"] / d["pipeline"]["cpus"] / d["bound"]["achievable_s"]')" "-"
  ratio demo "loads, 4 ranks / 1 rank, $W" "$rep" "$(json "$wj4" 'd["loads"] / max(1, json.load(open(a[0]))["loads"])' "$wj1")" "<= 1.05"
  ratio demo "loads, 4 ranks / 1 rank, window 1" "$rep" "$(json "$oj4" 'd["loads"] / max(1, json.load(open(a[0]))["loads"])' "$oj1")" "<= 1.05"
  ratio demo "owner loads max/min, 4 ranks, $W" "$rep" "$(json "$wj4" 'd["owner_loads_max_over_min"]')" "<= 1.5"
  ratio demo "owner loads max/min, 4 ranks, window 1" "$rep" "$(json "$oj4" 'd["owner_loads_max_over_min"]')" "-"
  ratio demo "loads, 1 rank, $W / window 1" "$rep" "$(json "$wj1" 'd["loads"] / max(1, json.load(open(a[0]))["loads"])' "$oj1")" "-"
  ratio demo "loads per unique shard, 1 rank, window 1" "$rep" "$(json "$oj1" 'd["loads_per_unique"]')" "-"
  ratio demo "loads per unique shard, 4 ranks, window 1" "$rep" "$(json "$oj4" 'd["loads_per_unique"]')" "-"
  ratio demo "Belady's MIN / 1-rank loads, window 1" "$rep" "$(json "$oj1" 'd["bound"]["min_loads"] / max(1, d["loads"])')" "-"
  ratio demo "Belady's MIN / 1-rank loads, $W" "$rep" "$(json "$wj1" 'd["bound"]["min_loads"] / max(1, d["loads"])')" "-"
}

# ---- mode cachebench: the core against the v1 model, same run (bench-core.md)
# Each ucmcache line's median per-rep ratio to the v1 model (/v1m), with the
# same-run target where it has one. Only rep 1's JSON is kept.
mode_cachebench() {
  local rep=$1 args=()
  local j=$out/json/cachebench-rep$rep.json
  [[ $SIZE == smoke ]] && args=(--quick --reps 1 --ms 5 --futex-iters 5 --poll-iters 2)
  run "cachebench-rep$rep" "$BUILD/bench/ucm_cachebench" "${args[@]}" --json "$j"
  python3 - "$j" "$rep" >>"$tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["get_release"]:
    if c.get("index") != "ucmcache" or c.get("ratio_to_v1_model") is None:
        continue
    t = c.get("same_run_target_ratio")
    print("cachebench\t/v1m: %s\t%s\t%s\t%s" % (" ".join(c["case"].split()), sys.argv[2], c["ratio_to_v1_model"],
                                               "<= %.2f" % t if t else "-"))
PY
  ((rep == 1)) || rm -f "$j"
}

# ADD A MODE HERE (3/3): mode_NAME REP, for instance
#   drift      loads per unique shard against rank drift, with and without the
#              protection (goal 1)
#   miss512k   the slowest miss after a fill over the median miss, 512k slots (goal 4)
#   hit4k512k  the per-shard hit overhead at 512k over 4k slots, against memcpy's (goal 5)
#   firstfill  a fresh cache's first fill over a warm one's (goal 6)

# ---- the runs: repetitions outermost -----------------------------------------
t_all=$SECONDS
for ((rep = 1; rep <= REPS; ++rep)); do
  say "rep $rep/$REPS: $MODES"
  for m in $MODES; do "mode_$m" "$rep"; done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg), runs took $((SECONDS - t_all)) s" >>"$out/machine.txt"

# ---- the summary: median and range of each ratio ----------------------------
python3 - "$tsv" "$out" <<'PY'
import json, statistics, sys
tsv, out = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(tsv)][1:]
order, vals, targets = [], {}, {}
for mode, metric, rep, value, target in rows:
    k = (mode, metric)
    if k not in vals:
        order.append(k); vals[k] = []; targets[k] = target
    if value not in ("null", "None", ""):
        vals[k].append(float(value))
def verdict(t, med):
    if med is None or t == "-": return ""
    op, x = t.split(); x = float(x)
    return "met" if (med <= x if op == "<=" else med >= x) else "missed"
summary = []
for k in order:
    v = sorted(vals[k]); med = statistics.median(v) if v else None
    summary.append({"mode": k[0], "metric": k[1], "n": len(v), "median": med,
                    "min": v[0] if v else None, "max": v[-1] if v else None,
                    "target": targets[k], "verdict": verdict(targets[k], med)})
machine = open(out + "/machine.txt").read()
json.dump({"machine": machine.splitlines(), "ratios": summary}, open(out + "/summary.json", "w"), indent=1)
f = lambda x: "n/a" if x is None else "%.3f" % x
with open(out + "/summary.md", "w") as o:
    o.write("# issue 15, end to end: tools/measure_e2e.sh\n\n```\n" + machine + "```\n\n")
    o.write("| mode | ratio | median | range | n | target | verdict |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    for s in summary:
        o.write("| %s | %s | %s | %s-%s | %d | %s | %s |\n" % (s["mode"], s["metric"], f(s["median"]), f(s["min"]),
                                                          f(s["max"]), s["n"], s["target"], s["verdict"]))
PY
cat "$out/summary.md"
say "done: $out/summary.md ($(du -sk --apparent-size "$out" | cut -f1) KB in $out)"
