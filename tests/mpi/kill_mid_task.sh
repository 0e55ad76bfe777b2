#!/usr/bin/env bash
# A rank SIGKILLed while it owns a load task, or a dump task's write-throughs:
# the survivors' tasks of the same keys end OK with the right bytes, within
# timeout_ms, and their finalize names the dead rank.
# usage: kill_mid_task.sh MPIRUN PROGRAM
set -u
mpirun=$1 prog=$2
fail=0
for mode in load dump; do
  for np in 2 4; do
    # --enable-recovery keeps the survivors running.
    out=$("$mpirun" --oversubscribe --enable-recovery --timeout 60 -np "$np" "$prog" "$mode" 2>&1)
    echo "$out" | grep -E "^rank [0-9]+:"
    oks=$(echo "$out" | grep -c "^rank [0-9]*: ok$")
    if [ "$oks" -ne $((np - 1)) ]; then
      echo "FAIL: $mode, np $np: $oks of $((np - 1)) survivors right"
      fail=1
    fi
  done
done
[ "$fail" -eq 0 ] && echo "ok: survivors of a rank killed mid-task finish their tasks and finalize"
exit "$fail"
