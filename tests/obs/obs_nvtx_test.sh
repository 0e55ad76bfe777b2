#!/usr/bin/env bash
# NVTX ranges of a task, counted per rank by an injection library: with
# NVTX_INJECTION64_PATH every named range of the ucmcache domain appears and
# pushes equal pops (obs_probe nvtx=on checks it on each rank); without it the
# same library, linked but never initialized by NVTX, counts nothing.
#
# usage: obs_nvtx_test.sh MPIRUN OBS_PROBE LIBNVTX_COUNT
set -euo pipefail
mpirun=$1 probe=$2 tool=$3
fail() { echo "obs_nvtx_test: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset NVTX_INJECTION64_PATH UCM_LOG

"$mpirun" --oversubscribe --timeout 100 -np 2 -x NVTX_INJECTION64_PATH="$tool" "$probe" nvtx=on > "$tmp/on" 2>&1 \
  || fail "nvtx=on: $(cat "$tmp/on")"
cat "$tmp/on"
[[ $(grep -c "nvtx on: .* pushes == pops" "$tmp/on") == 2 ]] || fail "not both ranks checked their ranges"

"$mpirun" --oversubscribe --timeout 100 -np 2 "$probe" nvtx=off > "$tmp/off" 2>&1 || fail "nvtx=off: $(cat "$tmp/off")"
cat "$tmp/off"
[[ $(grep -c "nvtx off: nothing counted" "$tmp/off") == 2 ]] || fail "not both ranks checked that nothing was counted"
echo "obs_nvtx_test: ok"
