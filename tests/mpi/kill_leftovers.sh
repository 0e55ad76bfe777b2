#!/usr/bin/env bash
# A rank is SIGKILLed while its node's cache is up: the job must end (mpirun
# tears it down), no rank may stay behind, and nothing may be left in any file
# system (the planes are memfds, the boot socket is abstract).
# usage: kill_leftovers.sh MPIRUN PROGRAM
#
# As root it runs in its own mount namespace, over fresh /tmp and /dev/shm
# (tests/common/private_tmp.sh): what it lists there is this job's alone, not
# a file another test on the same machine made meanwhile (a ucm-hang-test-*
# directory of a concurrent run once failed it). Elsewhere it compares the
# machine's directories before and after, as before.
set -u
mpirun=$1 prog=$2
if [ "${UCM_KILL_LEFTOVERS_NS:-}" != 1 ] && [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
  UCM_KILL_LEFTOVERS_NS=1 exec unshare --mount bash "${BASH_SOURCE[0]}" "$@"
fi
if [ "${UCM_KILL_LEFTOVERS_NS:-}" = 1 ]; then
  . "$(dirname "${BASH_SOURCE[0]}")/../common/private_tmp.sh"
  IFS=: read -ra search <<< "${LD_LIBRARY_PATH:-}"
  private_tmp "$mpirun" "$prog" "$PWD" "${search[@]}" || exit 1
fi
dirs=(/dev/shm /tmp /dev/hugepages /run /var/tmp)
snapshot() { for d in "${dirs[@]}"; do [ -d "$d" ] && find "$d" -maxdepth 1 -name '*ucm*' 2>/dev/null; done | sort; }
before=$(snapshot)
start=$SECONDS
out=$("$mpirun" --oversubscribe --timeout 60 -np 4 "$prog" 2 2>&1)
rc=$?
took=$((SECONDS - start))
echo "$out" | grep -E "cache up|signal 9|killed" | head -8
echo "mpirun exited with $rc after ${took}s"
fail=0
if [ "$rc" -eq 0 ]; then echo "FAIL: the job reported success although a rank was killed"; fail=1; fi
if [ "$(echo "$out" | grep -c 'cache up')" -lt 4 ]; then echo "FAIL: not every rank brought the cache up"; fail=1; fi
if [ "$took" -ge 30 ]; then echo "FAIL: the job outlived the survivors' 30 s hold: it was not torn down"; fail=1; fi
sleep 1
name=$(basename "$prog")  # by process name: this script's own arguments hold the path
# Zombies (killed, not yet reaped by whoever inherited them) are not running.
alive=$(ps -C "$name" -o pid=,stat= | awk '$2 !~ /^Z/ {print $1}')
if [ -n "$alive" ]; then echo "FAIL: ranks survived: $alive"; kill -9 $alive; fail=1; fi
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "FAIL: left in the file system:"; diff <(echo "$before") <(echo "$after"); fail=1
fi
[ "$fail" -eq 0 ] && echo "ok: job ended, no rank left, nothing left in any file system"
exit "$fail"
