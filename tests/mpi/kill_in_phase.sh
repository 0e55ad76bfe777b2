#!/usr/bin/env bash
# A rank SIGKILLed inside ucm_cache_init (while local rank 0 builds the
# planes, during the fd exchange, entering each MPI call), inside ucm_cache_finalize, and during
# a dump's write-through to a posix store: every survivor's call ends within
# its bound with a clear result, and the keys load right afterwards (also in
# a fresh job over the same store). See kill_in_phase.c.
# usage: kill_in_phase.sh MPIRUN PROGRAM
set -u
mpirun=$1 prog=$2
fail=0
job_env=()  # VAR=VALUE for every job run starts
# run NP EXPECTED_OKS ARGS...: --enable-recovery keeps the survivors running.
run() {
  local np=$1 want=$2
  shift 2
  local out oks
  out=$(env ${job_env[@]+"${job_env[@]}"} "$mpirun" --oversubscribe --enable-recovery --timeout 60 -np "$np" "$prog" "$@" 2>&1 </dev/null)
  echo "$out" | grep -E "^rank [0-9]+: (init|finalize|re-dump|keys|ok|WRONG|HANG)" | cut -c1-240
  oks=$(echo "$out" | grep -c "^rank [0-9]*: ok$")
  if [ "$oks" -ne "$want" ]; then
    echo "FAIL: $*: $oks of $want survivors right; the job's last lines:"
    echo "$out" | tail -n 20 | sed 's/^/    /'
    fail=1
  fi
}
for when in planes socket socket+2000; do
  for victim in 0 3; do run 4 3 init "$when" "$victim"; done
done
# A death entering each MPI call of init, found by tracing one init. The
# node split and the gather of the node's pids come first and cannot be
# watched (MPI has no nonblocking split; no pid is known before the
# gather): a death there still waits in MPI, as any collective of the app
# would. Every call after them is killed in, by local rank 0 or 2 in turn.
# kill_each_call MIN_CALLS [ENV=VALUE]: the pass, with the cache's config from
# that environment (UCM_FANOUT=mpi adds the fan-out's communicator to init).
# Calls that begin the previous pass's trace the same way were killed in
# there, on the same code: a later pass kills from where its trace differs.
previous=""
kill_each_call() {
  local min=$1
  shift
  local trace unwatched calls=0 victim=0 name nth same=0
  local out
  job_env=("$@")
  out=$(env "$@" "$mpirun" --oversubscribe --timeout 60 -np 3 "$prog" init mpitrace -1 2>&1 </dev/null)
  trace=$(echo "$out" | sed -n 's/^rank 1: mpi-call //p')
  # The trace is of an init that succeeded, on every rank: else it stops early.
  if [ "$(echo "$out" | grep -c '^rank [0-9]*: init=UCM_OK')" -ne 3 ]; then
    echo "FAIL: $*: the traced init did not succeed on all 3 ranks; its last lines:"
    echo "$out" | tail -n 20 | sed 's/^/    /'
    fail=1
  fi
  unwatched=$(echo "$trace" | sed -n '1,/^MPI_Allgather 1$/p' | tr '\n' ' ')
  if [ "$unwatched" != "MPI_Comm_dup 1 MPI_Comm_split_type 1 MPI_Comm_split 1 MPI_Allgather 1 " ]; then
    echo "FAIL: $*: init's MPI calls begin \"$unwatched\", not the split and the pid gather; the trace:"
    echo "$trace" | sed 's/^/    /'
    fail=1
  fi
  local watched
  watched=$(echo "$trace" | sed '1,/^MPI_Allgather 1$/d')
  if [ -n "$previous" ]; then
    # diff's first hunk, "15c15,20" or "15a16,19": its line in this trace.
    same=$(diff <(echo "$previous") <(echo "$watched") | sed -n '1s/^[0-9,]*[acd]\([0-9]*\).*/\1/p')
    same=$(( ${same:-$(echo "$watched" | wc -l)} - 1 ))
  fi
  while read -r name nth; do
    run 3 2 init "mpi:$name:$nth" "$victim"
    calls=$((calls + 1)) victim=$((2 - victim))
  done < <(echo "$watched" | tail -n +$((same + 1)))
  if [ "$calls" -lt "$min" ]; then
    echo "FAIL: $*: only $calls MPI calls of init to kill in after the pid gather (at least $min)"
    fail=1
  fi
  echo "$*: killed a rank entering each of $calls MPI calls of init (the $same before them as in the last pass)"
  previous=$watched
  job_env=()
}
kill_each_call 10 UCM_FANOUT=off
kill_each_call 3 UCM_FANOUT=mpi
for delay in 0 1000 5000; do run 3 2 finalize "$delay" 1; done
store=$(mktemp -d /tmp/ucm-kill-in-phase-XXXXXX)
trap 'rm -rf "$store"' EXIT
for delay in 5000 30000; do
  rm -f "$store"/*
  run 3 2 posixdump "$delay" 2 "$store"
  run 2 2 posixcheck 0 -1 "$store"
done
[ "$fail" -eq 0 ] && echo "ok: survivors of a rank killed in init, finalize or a write-through end bounded and load right"
exit "$fail"
