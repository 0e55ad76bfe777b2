#!/usr/bin/env bash
# devcheck.sh OUT: everything a developer runs when a GPU machine is lent, in
# one call, within 8 minutes on one GPU: installs what is missing (Debian apt,
# if reachable), builds what the device checks need, runs the `gpu` suite,
# ucm_info (registration seconds per GiB, 1 and 4 processes) and the H2D
# benchmark (--quick; 1, 2 and 4 processes; hugepage and ordinary segments).
# Every log and JSON goes under OUT; OUT/summary.txt says what ran, what
# passed, what could not run and why. Without a device it says so and exits 0.
set -u
OUT=${1:?usage: tools/devcheck.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${DEVCHECK_BUILD:-$ROOT/build-devcheck}
BUDGET_S=${DEVCHECK_BUDGET_S:-470}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "devcheck: $*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
# Runs "$@" with at most $1 seconds (and never past the budget), logging to $OUT/$2.log.
step() {
  local limit=$1 name=$2; shift 2
  local l; l=$(left)
  ((l < limit)) && limit=$l
  if ((limit <= 5)); then say "$name: SKIPPED (out of time)"; return 124; fi
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  say "$name: rc=$rc in $(( $(date +%s) - t0 )) s (log: $name.log)"
  return $rc
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export PATH=/usr/local/cuda/bin:$PATH

# ---- 1. the machine ----------------------------------------------------------
{ uname -a; nproc; free -g; cat /proc/driver/nvidia/version 2>&1; nvidia-smi 2>&1; nvcc --version 2>&1;
  ls /usr/local/cuda/lib64/libcudart* 2>&1; cat /proc/sys/vm/nr_hugepages; } >"$OUT/machine.txt" 2>&1
have_gpu=false
if nvidia-smi -L >/dev/null 2>&1; then have_gpu=true; say "device: $(nvidia-smi -L | head -1)"
else say "device: NONE (nvidia-smi does not answer; see machine.txt): the gpu suite will skip"; fi

# ---- 2. tools: apt for what is missing -------------------------------------------
need=()
command -v meson >/dev/null || need+=(meson)
command -v ninja >/dev/null || need+=(ninja-build)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v mpirun >/dev/null || need+=(openmpi-bin libopenmpi-dev)
[ -e /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -e /usr/include/hwloc.h ] || need+=(libhwloc-dev)
command -v g++ >/dev/null || need+=(g++)
if ((${#need[@]})); then
  say "missing: ${need[*]}; trying apt-get"
  step 60 apt-update apt-get update
  step 150 apt-install env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi
missing=()
for t in meson ninja mpirun g++; do command -v $t >/dev/null || missing+=($t); done
[ -e /usr/include/gtest/gtest.h ] || missing+=(gtest)
if ((${#missing[@]})); then say "COULD NOT GET: ${missing[*]}"; fi
if ! command -v meson >/dev/null || ! command -v ninja >/dev/null || ! command -v g++ >/dev/null; then
  say "RESULT: cannot build without meson, ninja and g++"; exit 1
fi
tests=true; [ -e /usr/include/gtest/gtest.h ] || tests=false

# ---- 3. build only what the device checks need --------------------------------
if [ ! -f "$BUILD/build.ninja" ]; then
  step 90 setup meson setup "$BUILD" "$ROOT" -Dnccl=disabled -Dtests=$tests || { say "RESULT: meson setup failed"; exit 1; }
fi
grep -A8 "Optional stacks" "$OUT/setup.log" 2>/dev/null | tee -a "$SUMMARY" >/dev/null
targets=(apps/ucm_info bench/ucm_h2d_bench)
$tests && targets+=(tests/gpu/ucm_gpu_tests tests/gpu/ucm_gpu_api_tests tests/ucm_unit_tests)
step 240 build ninja -C "$BUILD" -j"$(nproc)" "${targets[@]}" || { say "RESULT: build failed (build.log)"; exit 1; }

# ---- 4. the gpu suite, and the engine's CPU tests -------------------------------
if $tests; then
  step 150 gpu-suite meson test -C "$BUILD" --suite gpu --no-rebuild --print-errorlogs
  cp "$BUILD/meson-logs/testlog.json" "$OUT/gpu-suite.json" 2>/dev/null
  grep -hE "SKIPPED|FAILED|Skipped" "$BUILD/meson-logs/testlog.txt" 2>/dev/null | sort | uniq -c | head -20 >>"$SUMMARY"
  step 60 device-unit "$BUILD/tests/ucm_unit_tests" --gtest_filter='AsyncTestEngine.*:EngineChoice.*:RegisterSegments.*:CopierWithAsyncEngine.*' \
    --gtest_output=json:"$OUT/device-unit.json"
fi

if ! $have_gpu; then
  step 30 h2d-nodevice mpirun --oversubscribe --timeout 25 -np 1 "$BUILD/bench/ucm_h2d_bench" --quick --json "$OUT/h2d-nodevice.json"
  say "no device: registration and benchmark runs skipped"
  grep -q "rc=[1-9]" "$SUMMARY" && { say "RESULT: some steps failed (see above)"; exit 1; }
  say "RESULT: ok, but NO DEVICE: nothing device-side was measured"; exit 0
fi

# ---- 5. registration seconds per GiB, 1 and 4 processes ---------------------------
for np in 1 4; do
  step 60 "register-np$np" env UCM_BACKEND=sim:latency_us=0 UCM_CACHE_BYTES=8G UCM_SHARD_BYTES=1M \
    UCM_COPY_ENGINE=cuda UCM_HUGEPAGES=off mpirun --oversubscribe --timeout 55 -np $np "$BUILD/apps/ucm_info"
  grep -o "register=[^ ]* [^ ]* [^ ]*" "$OUT/register-np$np.log" | head -4 | sed "s/^/  np$np /" >>"$SUMMARY"
done

# ---- 6. the H2D benchmark: ordinary, then hugepage segments ----------------------
for np in 1 2 4; do
  step 60 "h2d-np$np-ordinary" mpirun --oversubscribe --timeout 55 -np $np "$BUILD/bench/ucm_h2d_bench" --quick \
    --hugepages off --json "$OUT/h2d-np$np-ordinary.json"
done
nr_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
restore() { [ -w /proc/sys/vm/nr_hugepages ] && echo "$nr_before" >/proc/sys/vm/nr_hugepages; }
trap restore EXIT
if [ -w /proc/sys/vm/nr_hugepages ] && echo $((nr_before + 1024)) >/proc/sys/vm/nr_hugepages 2>/dev/null &&
   (( $(cat /proc/sys/vm/nr_hugepages) >= nr_before + 512 )); then
  for np in 1 4; do
    step 60 "h2d-np$np-hugepages" mpirun --oversubscribe --timeout 55 -np $np "$BUILD/bench/ucm_h2d_bench" --quick \
      --hugepages on --json "$OUT/h2d-np$np-hugepages.json"
  done
else
  say "h2d hugepages: SKIPPED (could not reserve 2 MiB pages in /proc/sys/vm/nr_hugepages)"
fi
restore
for f in "$OUT"/h2d-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; cat "$f"; } >>"$OUT/h2d-tables.txt"; done
say "done in $(( $(date +%s) - START )) s; logs and JSON in $OUT"
grep -q "rc=[1-9]" "$SUMMARY" && { say "RESULT: some steps failed (see above)"; exit 1; }
say "RESULT: ok"
