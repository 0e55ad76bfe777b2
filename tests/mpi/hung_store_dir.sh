#!/usr/bin/env bash
# A posix store on a file system that hangs (tests/mpi/hung_fs.py, a FUSE file
# system whose every lookup waits for good, as a dead NFS or Lustre server's
# clients see it): ucm_cache_init of the main job (ucm_demo) returns
# UCM_ERR_TIMEOUT naming the store directory within its bound, not a job that
# waits forever in the kernel. Skips (77) where FUSE cannot mount here.
# usage: hung_store_dir.sh MPIRUN UCM_DEMO HUNG_FS_PY
set -u
mpirun=$1 demo=$2 hungfs=$3
python=/usr/bin/python3
if ! "$python" -c 'import fusepy' 2>/dev/null; then echo "SKIP: python3-fusepy is not installed"; exit 77; fi
[ -c /dev/fuse ] || { echo "SKIP: no /dev/fuse"; exit 77; }
top=$(mktemp -d /tmp/ucm-hung-store-XXXXXX)
mnt=$top/mnt
mkdir -m 700 "$mnt"
"$python" "$hungfs" "$mnt" >"$top/fs.log" 2>&1 &
fs=$!
cleanup() {
  kill -9 "$fs" 2>/dev/null
  wait "$fs" 2>/dev/null
  umount -l "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || fusermount -u -z "$mnt" 2>/dev/null
  rm -rf "$top"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q " $mnt fuse" /proc/mounts && break
  kill -0 "$fs" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q " $mnt fuse" /proc/mounts; then
  echo "SKIP: the FUSE file system did not mount here:"
  sed 's/^/    /' "$top/fs.log"
  exit 77
fi
# The job in the background: a thread left in the hung file system cannot
# leave the kernel (nor its process exit) until the file system's server
# ends, so the server is killed once init has said what it says.
start=$(date +%s)
UCM_TIMEOUT_MS=2000 UCM_LOG=warn "$mpirun" --oversubscribe --timeout 90 -np 2 "$demo" --backend "posix:$mnt/store" \
  >"$top/job.log" 2>&1 </dev/null &
job=$!
for _ in $(seq 600); do
  grep -q "ucm_cache_init" "$top/job.log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
took=$(( $(date +%s) - start ))
kill -9 "$fs" 2>/dev/null
wait "$job"
out=$(cat "$top/job.log")
echo "$out" | grep -E "ucm_cache_init" | cut -c1-300
if ! echo "$out" | grep -q "ucm_cache_init: UCM_ERR_TIMEOUT.*posix store directory $mnt/store.*is its file system hung"; then
  echo "FAIL: init on a hung store directory did not end in UCM_ERR_TIMEOUT naming it (${took} s); the job's last lines:"
  echo "$out" | tail -n 20 | sed 's/^/    /'
  exit 1
fi
echo "ok: init on a hung store directory ended in UCM_ERR_TIMEOUT naming it after ${took} s (UCM_TIMEOUT_MS=2000)"
