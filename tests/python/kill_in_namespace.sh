#!/usr/bin/env bash
# Runs kill_victim.py in a private mount, network and PID namespace (root):
# /dev/shm and /tmp are fresh tmpfs, the abstract Unix sockets live in the
# namespace's own table, and `ps` sees only the job. After the job it prints
# what is left: files in /dev/shm and /tmp, abstract sockets, processes.
# usage (inside `unshare --mount --net --pid --fork --mount-proc`):
#   kill_in_namespace.sh MPIRUN PYTHON VICTIM
#
# The job's own files may live under /tmp (a CI clone at /tmp/cc: the victim,
# the build's python package and library, a venv's interpreter). Each such
# tree is bound back into the fresh /tmp at its own path, so the job sees
# them and nothing else of the host's /tmp; the TMP line leaves those trees
# out (what the job writes into its own checkout is not the host's /tmp).
set -u
mpirun=$1 py=$2 victim=$3
mount --make-rprivate / 2>/dev/null
# The top directories under /tmp the job reads from, once each.
declare -A keep=()
IFS=: read -ra search <<< "${PYTHONPATH:-}:${LD_LIBRARY_PATH:-}"
for p in "$mpirun" "$py" "$victim" "$PWD" "${search[@]}"; do
  case $p in
    /tmp/?*) top=${p#/tmp/}; keep[${top%%/*}]=1 ;;
  esac
done
# The new /tmp is built on /dev/shm first (the host's /tmp is still in view
# to bind from), then moved over /tmp; /dev/shm then gets its own tmpfs.
mount -t tmpfs tmpfs /dev/shm || { echo "SETUP: cannot mount a tmpfs for /tmp"; exit 3; }
for top in "${!keep[@]}"; do
  [ -e "/tmp/$top" ] || continue
  if [ -d "/tmp/$top" ]; then mkdir "/dev/shm/$top"; else : > "/dev/shm/$top"; fi && mount --rbind "/tmp/$top" "/dev/shm/$top" ||
    { echo "SETUP: cannot bind /tmp/$top back in"; exit 3; }
done
mount --move /dev/shm /tmp || { echo "SETUP: cannot move the new tmpfs over /tmp"; exit 3; }
mount -t tmpfs tmpfs /dev/shm || { echo "SETUP: cannot mount /dev/shm"; exit 3; }
ip link set lo up || { echo "SETUP: cannot bring up lo"; exit 3; }
store=$(mktemp -d /tmp/store.XXXXXX)
"$mpirun" --enable-recovery --oversubscribe --timeout 90 -np 3 "$py" "$victim" "$store" 2>&1
echo "MPIRUN_RC=$?"
rm -rf "$store"
sleep 0.5
echo "SHM:[$(ls -A /dev/shm | tr '\n' ' ')]"
left=$(ls -A /tmp | while read -r f; do [ -n "${keep[$f]:-}" ] || echo "$f"; done | tr '\n' ' ')
echo "TMP:[$left]"
socks=$(awk 'NR > 1 && $8 ~ /^@/ {print $8}' /proc/net/unix | tr '\n' ' ')
echo "SOCKETS:[$socks]"
procs=$(ps -e -o pid=,stat=,comm= | awk -v me=$$ '$1 != me && $1 != 1 && $3 !~ /^(ps|awk|bash|tr)$/ && $2 !~ /^Z/ {print $3}' | tr '\n' ' ')
echo "PROCS:[$procs]"
