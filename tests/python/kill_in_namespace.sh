#!/usr/bin/env bash
# Runs kill_victim.py in a private mount, network and PID namespace (root):
# /dev/shm and /tmp are fresh tmpfs, the abstract Unix sockets live in the
# namespace's own table, and `ps` sees only the job. After the job it prints
# what is left: files in /dev/shm and /tmp, abstract sockets, processes.
# usage (inside `unshare --mount --net --pid --fork --mount-proc`):
#   kill_in_namespace.sh MPIRUN PYTHON VICTIM
# The job's own trees under /tmp (a CI clone at /tmp/cc) are bound back into
# the fresh /tmp, and the TMP line leaves them out (tests/common/private_tmp.sh).
set -u
mpirun=$1 py=$2 victim=$3
. "$(dirname "${BASH_SOURCE[0]}")/../common/private_tmp.sh"
IFS=: read -ra search <<< "${PYTHONPATH:-}:${LD_LIBRARY_PATH:-}"
private_tmp "$mpirun" "$py" "$victim" "$PWD" "${search[@]}" || exit 3
ip link set lo up || { echo "SETUP: cannot bring up lo"; exit 3; }
store=$(mktemp -d /tmp/store.XXXXXX)
"$mpirun" --enable-recovery --oversubscribe --timeout 90 -np 3 "$py" "$victim" "$store" 2>&1
echo "MPIRUN_RC=$?"
rm -rf "$store"
sleep 0.5
echo "SHM:[$(ls -A /dev/shm | tr '\n' ' ')]"
echo "TMP:[$(private_tmp_left | tr '\n' ' ')]"
socks=$(awk 'NR > 1 && $8 ~ /^@/ {print $8}' /proc/net/unix | tr '\n' ' ')
echo "SOCKETS:[$socks]"
procs=$(ps -e -o pid=,stat=,comm= | awk -v me=$$ '$1 != me && $1 != 1 && $3 !~ /^(ps|awk|bash|tr)$/ && $2 !~ /^Z/ {print $3}' | tr '\n' ' ')
echo "PROCS:[$procs]"
