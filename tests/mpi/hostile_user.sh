#!/usr/bin/env bash
# Another user on the node (nobody, through setpriv) interferes with a job:
# it connects to every boot socket it sees, sending garbage, a forged fd, or
# nothing (held open), while the job starts its cache again and again: every
# init works and every load brings the right bytes. It squats the posix
# store's directory (its own, a link to its own, one open to everybody):
# init fails on every rank, naming the directory and why. It plants a file
# under a key's name: its bytes never come back as the key's.
# usage: hostile_user.sh MPIRUN PROGRAM ATTACKER
set -u
mpirun=$1 prog=$2 attacker=$3
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
if [ "$(id -u)" != 0 ] || ! as_nobody true 2>/dev/null; then
  echo "SKIP: needs root and setpriv to act as another user"
  exit 77
fi
fail=0
work=$(mktemp -d /tmp/ucm-hostile-XXXXXX)
chmod 1777 "$work"  # as /tmp is: nobody may create its squats here
trap 'rm -rf "$work"' EXIT
np=4
# check NAME WANT_OKS OUTPUT [PATTERN]: every rank ok, and PATTERN in the output.
check() {
  local oks
  oks=$(echo "$3" | grep -c "^rank [0-9]*: ok$")
  echo "$3" | grep -E "^rank 0: |attacker" | cut -c1-300
  if [ "$oks" -ne "$2" ]; then echo "FAIL: $1: $oks of $2 ranks right"; fail=1; fi
  if [ -n "${4:-}" ] && ! echo "$3" | grep -q -- "$4"; then echo "FAIL: $1: no '$4' in the output"; fail=1; fi
}
# 1. The boot socket under attack.
# setpriv execs python, so $! is the attacker itself (a function would fork).
setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$attacker" 25 > "$work/attacker.out" 2>&1 &
apid=$!
sleep 0.5
out=$("$mpirun" --oversubscribe --timeout 60 -np "$np" "$prog" boot 15 2>&1)
kill -TERM "$apid" 2>/dev/null  # the job is over: nothing more to attack
wait "$apid"
check "boot socket attacked" "$np" "$out
$(cat "$work/attacker.out")" "attacker: reached"
echo "$out" | grep -c "refused a connection from pid" | sed 's/^/refusals logged: /'
# 2. Squatted store directories.
as_nobody mkdir -m 700 "$work/nobodys"
out=$("$mpirun" --oversubscribe --timeout 60 -np "$np" "$prog" init "$work/nobodys" 2>&1)
check "store dir nobody owns" "$np" "$out" "$work/nobodys"
echo "$out" | grep -q "^rank 0: init=UCM_OK" && { echo "FAIL: a store dir nobody owns was used"; fail=1; }
as_nobody ln -s "$work/nobodys" "$work/link"
out=$("$mpirun" --oversubscribe --timeout 60 -np "$np" "$prog" init "$work/link" 2>&1)
check "link to nobody's dir" "$np" "$out" "$work/link"
echo "$out" | grep -q "^rank 0: init=UCM_OK" && { echo "FAIL: a link to nobody's dir was used"; fail=1; }
mkdir -m 777 "$work/open"
out=$("$mpirun" --oversubscribe --timeout 60 -np "$np" "$prog" init "$work/open" 2>&1)
check "store dir open to all" "$np" "$out" "$work/open"
echo "$out" | grep -q "^rank 0: init=UCM_OK" && { echo "FAIL: a store dir others may write was used"; fail=1; }
# 3. A file planted under key 0's name while the directory was open, then closed.
mkdir -m 777 "$work/store"
as_nobody sh -c "head -c 200000 /dev/urandom > '$work/store/a7000000000000000000000000000001.ucmblk'"
chmod 700 "$work/store"
out=$("$mpirun" --oversubscribe --timeout 60 -np "$np" "$prog" planted "$work/store" 2>&1)
check "planted file" "$np" "$out"
[ "$fail" -eq 0 ] && echo "ok: another user's connections, squats and planted files neither hang nor fool the job"
exit "$fail"
