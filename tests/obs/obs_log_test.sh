#!/usr/bin/env bash
# UCM_LOG prints the bootstrap's decisions once per node, as NCCL_DEBUG=INFO
# does, and nothing at the default level on success.
#
# Runs obs_probe (init, a dump, a load, touch, finalize) with 4 ranks: at the
# default level, then with UCM_LOG=info on one node and on two pretend nodes
# (UCM_RANKS_PER_NODE=2), then UCM_LOG=debug. Every INFO line has a kind (its
# message up to the first ':'); each kind must appear once per node, except
# "device and placement", once per rank. The kinds the bootstrap must print
# are listed below; a kind this test does not know is held to the same rule.
#
# usage: obs_log_test.sh MPIRUN OBS_PROBE
set -euo pipefail
mpirun=$1 probe=$2
np=4
fail() { echo "obs_log_test: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset UCM_LOG UCM_LOG_SUBSYS UCM_RANKS_PER_NODE NVTX_INJECTION64_PATH

node_kinds=("node split" "effective configuration" "control region" "data plane" "registration" "store")
rank_kind="device and placement"

# run NAME RANKS_PER_NODE LEVEL: stdout to NAME.out, the ranks' stderr to NAME.err
run() {
  local name=$1 rpn=$2 level=$3 env=()
  [[ -n "$level" ]] && env+=(-x "UCM_LOG=$level")
  [[ "$rpn" != 0 ]] && env+=(-x "UCM_RANKS_PER_NODE=$rpn")
  "$mpirun" --oversubscribe --timeout 100 -np "$np" "${env[@]}" "$probe" nvtx=skip hang_ms=0 \
    > "$tmp/$name.out" 2> "$tmp/$name.err" || fail "$name: the probe failed: $(cat "$tmp/$name.out" "$tmp/$name.err")"
  grep -qx ok "$tmp/$name.out" || fail "$name: the probe did not print ok: $(cat "$tmp/$name.out")"
}

# kinds FILE LEVEL: "count<TAB>kind" for every LEVEL line of FILE.
kinds() {
  awk -v lvl="$2" '$0 ~ (" " lvl " [^ ]+:[0-9]+ ") {
      sub(".* " lvl " [^ ]+:[0-9]+ ", ""); sub(/:.*/, ""); n[$0]++ }
    END { for (k in n) printf "%d\t%s\n", n[k], k }' "$1" | sort -t$'\t' -k2
}

count_of() {  # count_of KINDS_FILE KIND
  awk -F'\t' -v k="$2" '$2 == k { print $1; found = 1 } END { if (!found) print 0 }' "$1"
}

# check NAME NODES: the INFO lines of NAME.err, for a job of NODES nodes.
check() {
  local name=$1 nodes=$2 k n
  kinds "$tmp/$name.err" INFO > "$tmp/$name.kinds"
  echo "--- $name: INFO lines by kind (count, kind) for $nodes node(s) of $np ranks"
  cat "$tmp/$name.kinds"
  for k in "${node_kinds[@]}"; do
    n=$(count_of "$tmp/$name.kinds" "$k")
    [[ "$n" == "$nodes" ]] || fail "$name: \"$k\" printed $n times, not once per node ($nodes)"
  done
  n=$(count_of "$tmp/$name.kinds" "$rank_kind")
  [[ "$n" == "$np" ]] || fail "$name: \"$rank_kind\" printed $n times, not once per rank ($np)"
  while IFS=$'\t' read -r n k; do
    [[ "$k" == "$rank_kind" || "$n" == "$nodes" ]] \
      || fail "$name: \"$k\" printed $n times: neither once per node ($nodes) nor the per-rank line"
  done < "$tmp/$name.kinds"
  # Each rank's line names it once.
  for ((r = 0; r < np; ++r)); do
    n=$(grep -c " $rank_kind: .*, rank $r of $np)" "$tmp/$name.err" || true)
    [[ "$n" == 1 ]] || fail "$name: rank $r has $n \"$rank_kind\" lines"
  done
}

# Default level: nothing at all on stderr.
run quiet 0 ""
[[ ! -s "$tmp/quiet.err" ]] || fail "the default level printed on success: $(cat "$tmp/quiet.err")"
echo "--- quiet: stderr empty"

run info1 0 info
check info1 1
grep -q " node split: node 0 of 1 on .*: $np local rank(s) (ranks 0,1,2,3 of $np)" "$tmp/info1.err" \
  || fail "info1: the node split line does not show one node of $np ranks: $(grep 'node split' "$tmp/info1.err")"

run info2 2 info
check info2 2
for id in 0 1; do
  n=$(grep -c " node split: node $id of 2 on .*: 2 local rank(s) .*ranks_per_node=2 (pretend nodes)" "$tmp/info2.err" || true)
  [[ "$n" == 1 ]] || fail "info2: node $id of 2 has $n node split lines: $(grep 'node split' "$tmp/info2.err")"
done

# debug: the same INFO lines; the other ranks' view of a node decision at DEBUG.
run debug1 0 debug
check debug1 1
kinds "$tmp/debug1.err" DEBUG > "$tmp/debug1.dkinds"
n=$(count_of "$tmp/debug1.dkinds" registration)
[[ "$n" == $((np - 1)) ]] || fail "debug1: $n DEBUG registration lines, not one per rank but local rank 0 ($((np - 1)))"
echo "obs_log_test: ok"
