#!/usr/bin/env bash
# Suite `slurm`: a private Slurm cluster on this machine runs the batch scripts
# of slurm/ end to end.
#
#   slurm_test.sh SOURCE_ROOT BUILD_ROOT
#
# It installs munge and Slurm with apt when they are missing (as root; otherwise
# exit 77, a skip), then, in a fresh temporary directory: starts its own munged
# (own key and socket), writes a slurm.conf (free ports, every state, spool, pid
# and log path inside the directory), starts slurmctld and slurmd, and submits
# slurm/tp_sweep.sbatch with `sbatch --wait`: TP=2, then TP=4 in a job of 2
# tasks, so that TP=4 runs as `srun --mpi=pmix -n 4 -O`. For each TP it checks
# that ucm_info printed TP rank lines, each with local_size=TP and node=0/1,
# all with one control_inode (one shared region), and that ucm_demo verified
# every byte, and that the study (ucm_bench, cold scenario, small) wrote
# bench-tp<N>.json with every byte verified and one backend load per unique
# shard.
#
# Then a second cluster of two pretend nodes (slurmd -N n1, -N n2 on this
# machine) runs slurm/multinode.sbatch with 2 ranks per node: two caches,
# node=0/2 and node=1/2, two distinct control_inode values; the study's
# bench.json has, for every cold mode, an entry for node 0 and node 1 (distinct
# Slurm node names), each with one backend load per unique shard.
# UCM_SLURM_TEST_MULTINODE=0 leaves that part out.
#
# Everything it started (daemons, and any step or task left by a failed job) is
# stopped by pid on exit, and the directory removed, pass or fail.
# UCM_SLURM_TEST_KEEP=1 keeps the directory (logs, outputs) for a look.
set -uo pipefail

src=${1:?usage: slurm_test.sh SOURCE_ROOT BUILD_ROOT}
build=${2:?usage: slurm_test.sh SOURCE_ROOT BUILD_ROOT}
src=$(readlink -f "$src")
build=$(readlink -f "$build")
t0=$SECONDS

say() { printf 'slurm_test: %s\n' "$*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
elapsed() { printf '%ds' $((SECONDS - t0)); }

for exe in "$build/apps/ucm_info" "$build/apps/ucm_demo" "$build/bench/ucm_bench"; do
  [[ -x "$exe" ]] || fail "$exe is not built (ninja -C $build)"
done

# ---- munge and Slurm -------------------------------------------------------

need=(munged munge sbatch srun sinfo scontrol slurmctld slurmd)
missing() {
  local c
  for c in "${need[@]}"; do
    PATH=$PATH:/usr/sbin command -v "$c" >/dev/null || return 0
  done
  return 1
}
if missing; then
  ((EUID == 0)) || skip "munge/Slurm are not installed and we are not root to install them (apt-get install slurm-wlm munge)"
  command -v apt-get >/dev/null || skip "munge/Slurm are not installed and there is no apt-get"
  say "installing slurm-wlm munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q slurm-wlm munge >/tmp/ucm-slurm-apt.log 2>&1; then
    apt-get update -q >>/tmp/ucm-slurm-apt.log 2>&1
    apt-get install -y -q slurm-wlm munge >>/tmp/ucm-slurm-apt.log 2>&1 ||
      skip "apt-get install slurm-wlm munge failed: $(tail -n 3 /tmp/ucm-slurm-apt.log | tr '\n' ' ')(log: /tmp/ucm-slurm-apt.log)"
  fi
  missing && skip "slurm-wlm and munge installed, but a command is still missing (${need[*]})"
  say "installed ($(elapsed))"
fi
export PATH=$PATH:/usr/sbin
# Run inside a job of a real cluster (CI under Slurm), the client commands
# would read its job's variables and site options: leave them all out.
for v in $(compgen -e); do
  case $v in SLURM_* | SBATCH_* | SALLOC_* | SRUN_* | SQUEUE_* | SINFO_* | PMIX_* | PMI_*) unset "$v" ;; esac
done
((EUID == 0)) || skip "Slurm daemons for the test need root (SlurmUser=root, slurmd starts jobs as any user)"
say "$(slurmctld -V), $(munged -V 2>&1 | head -n 1)"

# ---- the temporary directory and cleanup -------------------------------------

tmp=$(mktemp -d /tmp/ucm-slurm-test.XXXXXX) || fail "mktemp -d failed"
chmod 755 "$tmp"  # munged's socket must be reachable (jobs run as root here anyway)
tag="UCM_SLURM_TEST_TAG=$tmp"
export UCM_SLURM_TEST_TAG=$tmp  # inherited by the daemons, steps and tasks: see ours()
daemon_pids=()  # slurmctld, slurmd(s) of the current cluster
munged_pid=

# ours: every process started by this test that is still running, by pid: the
# daemons, and whatever a failed job left behind. slurmstepd clears its
# environment, but holds its log file (in $tmp) open; the tasks carry our tag
# in their environment. Nothing else does either. Builtins only for the scan of
# environments, so that no helper process of ours is listed.
ours() {
  local d pid e envs
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    mapfile -d '' envs 2>/dev/null <"$d/environ" || continue
    for e in "${envs[@]}"; do
      if [[ "$e" == "$tag" ]]; then
        echo "$pid"
        break
      fi
    done
  done
  find /proc/[0-9]*/fd /proc/[0-9]*/cwd -maxdepth 1 -lname "$tmp/*" 2>/dev/null |
    sed -n 's|^/proc/\([0-9]*\)/.*|\1|p'
}

stop_pids() {  # stop_pids PID...: TERM, wait up to 5 s, then KILL
  local pid left i
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null
  for ((i = 0; i < 50; i++)); do
    left=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    ((${#left[@]})) || return 0
    sleep 0.1
  done
  say "killing (SIGKILL) ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null
}

# stop_cluster: cancel the jobs and wait for them to end (while slurmctld,
# slurmd and munged can still end them cleanly), then stop slurmctld and the
# slurmd(s) of the current cluster by pid; munged stays.
stop_cluster() {
  local i
  ((${#daemon_pids[@]})) || return 0
  if squeue -h >/dev/null 2>&1; then
    scancel --quiet --user=root >/dev/null 2>&1
    for ((i = 0; i < 100; i++)); do
      [[ -z "$(squeue -h 2>/dev/null)" ]] && break
      sleep 0.2
    done
    ((i < 100)) || say "jobs still listed after 20 s: $(squeue -h 2>&1 | tr '\n' ';')"
  fi
  stop_pids "${daemon_pids[@]}"
  daemon_pids=()
}

cleanup() {
  local rc=$? pid found=() left=()
  local -A seen=()
  trap - EXIT INT TERM
  stop_cluster
  # Then anything of ours still running (a stuck slurmstepd, an orphaned rank).
  mapfile -t found < <(ours)
  for pid in "${found[@]}"; do
    [[ "$pid" == "$munged_pid" || -n "${seen[$pid]:-}" ]] && continue
    seen[$pid]=1
    left+=("$pid")
  done
  if ((${#left[@]})); then
    say "stopping leftover processes: ${left[*]}"
    ps -o pid=,args= -p "${left[@]}" | sed 's/^/  /'
    stop_pids "${left[@]}"
  fi
  [[ -n "$munged_pid" ]] && stop_pids "$munged_pid"
  if ((rc != 0 && rc != 77)); then
    local f
    for f in "$tmp"/*.log "$tmp"/*/*.log; do
      [[ -s "$f" ]] || continue
      echo "---- tail of $f"
      tail -n 25 "$f"
    done
  fi
  if [[ "${UCM_SLURM_TEST_KEEP:-0}" == 1 ]]; then
    say "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  say "done in $(elapsed), exit $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- munged: our own, with its own key and socket -----------------------------

sock=$tmp/munge.sock
head -c 1024 /dev/urandom >"$tmp/munge.key" && chmod 400 "$tmp/munge.key"
munged -F -f -S "$sock" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
  --seed-file="$tmp/munged.seed" --log-file="$tmp/munged.log" >"$tmp/munged.log" 2>&1 &
munged_pid=$!
for ((i = 0; i < 100; i++)); do
  munge -S "$sock" -n 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 && break
  kill -0 "$munged_pid" 2>/dev/null || fail "munged exited: $(cat "$tmp/munged.log")"
  sleep 0.05
done
((i < 100)) || fail "munged does not answer on $sock"

# ---- free TCP ports -----------------------------------------------------------

# free_ports N: N ports nobody listens on now (bound and released by Python).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# ---- a cluster: slurm.conf, slurmctld, slurmd(s) ------------------------------

host=$(hostname -s)
# write_conf DIR NODE_LINES CTLD_PORT: a slurm.conf for a cluster whose state lives in DIR.
#
# Everything named after host, job and step is made per cluster and per node:
# two clusters on one host (this test run twice at once) and two pretend nodes
# of one cluster would otherwise share Open MPI's session directory and its
# shared-memory segment files (ranks crash in the vader BTL), and Slurm's PMIx
# directories. The spool and TmpFS paths take %n (the node name); the
# TaskProlog gives each task a TMPDIR and a vader backing directory of its
# node's own; job ids start at a random number.
write_conf() {
  local dir=$1 nodes=$2 ctld_port=$3
  mkdir -p "$dir/state"
  printf '%s\n' '#!/bin/sh' \
    "echo \"export TMPDIR=$dir/tmp-\$SLURMD_NODENAME\"" \
    "echo \"export OMPI_MCA_btl_vader_backing_directory=$dir/tmp-\$SLURMD_NODENAME\"" \
    >"$dir/task_prolog.sh"
  chmod 755 "$dir/task_prolog.sh"
  cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/slurm_test.sh for one test run.
ClusterName=ucmtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
ReturnToService=2
MaxJobCount=1000
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$dir/tmp-%n
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=2
MailProg=/bin/true
KillWait=5
FirstJobId=$((1000 + RANDOM * 30))
TaskProlog=$dir/task_prolog.sh
$nodes
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# start_cluster DIR NODE...: slurmctld, one slurmd per node name given (none:
# one slurmd for this host), then wait until every node is idle.
start_cluster() {
  local dir=$1; shift
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
  daemon_pids+=($!)
  local n
  if (($# == 0)); then
    mkdir -p "$dir/spool-$host" "$dir/tmp-$host"
    slurmd -D -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &
    daemon_pids+=($!)
  else
    for n in "$@"; do
      mkdir -p "$dir/spool-$n" "$dir/tmp-$n"
      slurmd -D -N "$n" -f "$SLURM_CONF" >"$dir/slurmd-$n.out" 2>&1 &
      daemon_pids+=($!)
    done
  fi
  local want=$(($# == 0 ? 1 : $#)) idle i
  for ((i = 0; i < 300; i++)); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    ((idle == want)) && return 0
    sleep 0.1
  done
  sinfo -N 2>&1
  fail "the nodes did not become idle in 30 s"
}

# submit NAME SCRIPT [sbatch options]: sbatch --wait, output to $dir/NAME.out.
submit() {
  local name=$1 script=$2; shift 2
  local dir=${SLURM_CONF%/*} start=$SECONDS rc
  say "sbatch --wait $* $script"
  # In the background, so that a signal to this script is handled at once.
  timeout 150 sbatch --wait --quiet --time=2 -D "$dir" -o "$dir/$name.out" -e "$dir/$name.out" \
    "$@" "$script" &
  wait $!
  rc=$?
  say "$name: sbatch exit $rc in $((SECONDS - start)) s"
  sed 's/^/  | /' "$dir/$name.out"
  return "$rc"
}

# ---- single node: the TP sweep, TP=2 and TP=4 -----------------------------------------

# Open MPI's shared-memory transport only; no warnings about missing fabrics.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export UCM_ROOT=$src UCM_BUILD_DIR=$build
# The study in both scripts: the cold scenario, small (about a second a run).
export UCM_BENCH_SCENARIOS=cold
export UCM_BENCH_ARGS="--reps 1 --skew-us 0 --shards-per-rank 4 --latency-us 1000"

# check_bench JSON NODES: the study verified every byte, and (NODES > 1) every
# cold mode has one entry per node id 0..NODES-1, with distinct names, each
# with one backend load per unique shard (NODES = 1: the node's own count).
check_bench() {
  python3 - "$1" "$2" <<'EOF2'
import json, sys
path, nodes = sys.argv[1], int(sys.argv[2])
try:
    d = json.load(open(path))
except Exception as e:
    sys.exit(f"{path}: not readable JSON: {e}")
if d.get("verification") != "every byte right":
    sys.exit(f"{path}: verification {d.get('verification')!r}")
cold = d.get("cold")
if not cold or not cold.get("modes"):
    sys.exit(f"{path}: no cold scenario results")
if not cold.get("one_load_per_unique_shard"):
    sys.exit(f"{path}: one_load_per_unique_shard is not true")
for m in cold["modes"]:
    if nodes == 1:
        if "per_node" in m or m["node_loads"] != m["unique_shards"]:
            sys.exit(f"{path}: mode {m['name']!r}: per_node on one node, or loads != unique")
        continue
    pn = m.get("per_node", [])
    if sorted(e["node"] for e in pn) != list(range(nodes)):
        sys.exit(f"{path}: mode {m['name']!r}: per_node has nodes {[e['node'] for e in pn]}, not 0..{nodes - 1}")
    if len({e["name"] for e in pn}) != nodes:
        sys.exit(f"{path}: mode {m['name']!r}: node names not distinct: {[e['name'] for e in pn]}")
    for e in pn:
        if e["node_loads"] != e["unique_shards"] or e["unique_shards"] == 0:
            sys.exit(f"{path}: mode {m['name']!r}: node {e['node']} ({e['name']}): "
                     f"{e['node_loads']} loads for {e['unique_shards']} unique shards")
print(f"{len(cold['modes'])} cold modes" + (f", nodes {', '.join(e['name'] for e in cold['modes'][0]['per_node'])}"
      if nodes > 1 else ""))
EOF2
}

one=$tmp/one
read -r p_ctld p_slurmd < <(free_ports 2)
write_conf "$one" "NodeName=$host NodeAddr=127.0.0.1 CPUs=4 Port=$p_slurmd State=UNKNOWN" "$p_ctld"
start_cluster "$one"
say "single-node cluster up ($(elapsed))"
srun --mpi=list 2>&1 | grep -qw pmix ||
  skip "this Slurm has no mpi/pmix plugin (srun --mpi=list: $(srun --mpi=list 2>&1 | tr '\n' ' '))"

# The sweep TP=2 then TP=4 in a job of 2 tasks: TP=4 runs overcommitted, as
# `srun --mpi=pmix -n 4 -O`, the path a sweep larger than its job takes.
submit tp_sweep "$src/slurm/tp_sweep.sbatch" -n 2 \
  "--export=ALL,UCM_TP_SIZES=2 4,UCM_CPU_BIND=none,UCM_RESULTS_DIR=$one/results" || fail "tp_sweep job failed"
grep -q 'TP=4 is more than the job.s 2 tasks: overcommitting' "$one/tp_sweep.out" ||
  fail "TP=4 did not run overcommitted (srun -O)"
# check_single DIR TP: TP rank lines, each local_size TP and node 0/1, one
# control_inode (one shared region), and the demo verified every byte.
check_single() {
  local dir=$1 tp=$2 info lines inodes
  info=$dir/tp$tp-info.txt
  [[ -f "$info" ]] || fail "no ucm_info output for TP=$tp ($info)"
  lines=$(grep -c '^rank ' "$info")
  ((lines == tp)) || fail "TP=$tp: ucm_info printed $lines rank lines, not $tp"
  grep '^rank ' "$info" | grep -v " local_size=$tp " && fail "TP=$tp: a rank did not see local_size=$tp"
  grep '^rank ' "$info" | grep -v ' node=0/1 ' && fail "TP=$tp: a rank is not on node 0/1"
  inodes=$(grep -o ' control_inode=[0-9]*' "$info" | sort -u | wc -l)
  ((inodes == 1)) || fail "TP=$tp: $inodes control regions (control_inode values), not one shared region"
  grep -q 'verification: every byte right' "$dir/tp$tp-demo.txt" ||
    fail "TP=$tp: ucm_demo did not verify every byte"
  [[ -s "$dir/bench-tp$tp.txt" ]] || fail "TP=$tp: no study table ($dir/bench-tp$tp.txt)"
  check_bench "$dir/bench-tp$tp.json" 1 >/dev/null || fail "TP=$tp: study output wrong (above)"
}
sweep=$(echo "$one"/results/tp_sweep-*)
check_single "$sweep" 2
check_single "$sweep" 4
say "single node: ok: TP=2 and TP=4 (overcommitted): every rank local_size=TP, node 0/1," \
  "one control region; demo verified; study ran (bench-tp2/4.json) ($(elapsed))"

# ---- two pretend nodes: the multi-node script -----------------------------------

if [[ "${UCM_SLURM_TEST_MULTINODE:-1}" == 0 ]]; then
  say "PASS ($(elapsed)); multi-node part left out (UCM_SLURM_TEST_MULTINODE=0)"
  exit 0
fi
stop_cluster
two=$tmp/two
# Two slurmd on one host: write_conf makes their directories per node.
read -r p_ctld p_n1 p_n2 < <(free_ports 3)
write_conf "$two" "NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p_n1 CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p_n2 CPUs=2 State=UNKNOWN" "$p_ctld"
start_cluster "$two" n1 n2
say "two-node cluster up ($(elapsed))"

# Ranks on two pretend nodes are "remote" to Open MPI: they talk over TCP, here
# on the loopback interface.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
submit multinode "$src/slurm/multinode.sbatch" -N 2 --ntasks-per-node=2 \
  --export=ALL,UCM_CPU_BIND=none,UCM_RESULTS_DIR="$two/results" || fail "multinode job failed"
info=$(echo "$two"/results/multinode-*/info.txt)
[[ -f "$info" ]] || fail "no ucm_info output ($info)"
lines=$(grep -c '^rank ' "$info")
((lines == 4)) || fail "ucm_info printed $lines rank lines, not 4"
grep '^rank ' "$info" | grep -v ' local_size=2 ' && fail "a rank did not see local_size=2"
for id in 0 1; do
  n=$(grep -c " node=$id/2 " "$info")
  ((n == 2)) || fail "$n ranks on node=$id/2, not 2"
  inodes=$(grep " node=$id/2 " "$info" | grep -o ' control_inode=[0-9]*' | sort -u | wc -l)
  ((inodes == 1)) || fail "node $id: $inodes control regions, not one"
done
inodes=$(grep -o ' control_inode=[0-9]*' "$info" | sort -u | wc -l)
((inodes == 2)) || fail "$inodes distinct control regions over two nodes, not two"
grep -q 'verification: every byte right' "$two"/results/multinode-*/demo.txt ||
  fail "ucm_demo did not verify every byte"
bench=$(echo "$two"/results/multinode-*/bench.json)
[[ -s "${bench%.json}.txt" ]] || fail "no study table (${bench%.json}.txt)"
verdict=$(check_bench "$bench" 2) || fail "multi-node study output wrong (above)"
say "two pretend nodes: ok: node=0/2 and node=1/2, 2 ranks each, two control regions, demo verified;" \
  "study: $verdict, one load per unique shard on each ($(elapsed))"

say "PASS ($(elapsed))"
