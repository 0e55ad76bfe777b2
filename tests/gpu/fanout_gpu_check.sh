#!/usr/bin/env bash
# Fan-out over NCCL on a lent GPU machine, in one short run: builds what it
# needs (if no build dir came along), then runs the gpu suite's fan-out tests
# with one rank per visible GPU (at least 1: a 1-rank communicator), and
# ucm_fanout_bench --mode nccl (read ratio and warm time, NCCL against
# per-rank copies). Prints everything; exits non-zero on any failure.
#
# usage: tests/gpu/fanout_gpu_check.sh [BUILD_DIR]   (from the repository root)
set -euo pipefail
build=${1:-build-gpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
nvidia-smi -L || true
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
(( gpus >= 1 )) || { echo "fanout_gpu_check: no GPU visible"; exit 2; }
if [[ ! -f "$build/build.ninja" ]]; then
  nccl_prefix=${NCCL_PREFIX:-/usr/local/cuda}
  meson setup "$build" -Dnccl_prefix="$nccl_prefix" -Dbuildtype=release
fi
ninja -C "$build" tests/gpu/ucm_fanout_gpu_tests bench/ucm_fanout_bench
out=${OUT:-/tmp}
for np in 1 "$gpus"; do
  echo "== fan-out gpu tests, $np rank(s)"
  mpirun --oversubscribe --timeout 300 -np "$np" "$build/tests/gpu/ucm_fanout_gpu_tests" \
    --gtest_output="xml:$out/fanout_gpu_np$np.xml"
done
echo "== ucm_fanout_bench --mode nccl, $gpus ranks"
mpirun --oversubscribe --timeout 300 -np "$gpus" "$build/bench/ucm_fanout_bench" --mode nccl \
  --keys 256 --shard-bytes 4M --reps 5 --json "$out/fanout_bench_nccl.json"
echo "fanout_gpu_check: ok"
