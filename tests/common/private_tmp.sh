# Sourced by the scripts that check what a job leaves in the file systems
# (tests/python/kill_in_namespace.sh, tests/mpi/kill_leftovers.sh): they run in
# a private mount namespace (`unshare --mount`, root), where
#   private_tmp PATH...
# covers /tmp and /dev/shm with fresh tmpfs, so what they list is this job's
# alone, not another test's or another user's on the same machine. The job's
# own files may live under /tmp (a CI clone at /tmp/cc: its build, its
# programs, a venv's interpreter): each top directory under /tmp that a PATH
# (relative ones against $PWD) lies in is bound back at its own path, and
# private_tmp_left lists /tmp without them. On a failure it prints
# "SETUP: ..." and returns 3.

private_tmp() {
  mount --make-rprivate / 2>/dev/null
  declare -gA private_tmp_kept=()
  local p top
  for p in "$@"; do
    [ -n "$p" ] || continue
    case $p in /*) ;; *) p=$PWD/$p ;; esac
    for p in "$p" "$(realpath -m "$p")"; do
      case $p in /tmp/?*) top=${p#/tmp/}; private_tmp_kept[${top%%/*}]=1 ;; esac
    done
  done
  # The new /tmp is built on /dev/shm first, while the host's /tmp is still
  # in view to bind from; it is then moved over /tmp, and /dev/shm gets its own.
  mount -t tmpfs tmpfs /dev/shm || { echo "SETUP: cannot mount a tmpfs for /tmp"; return 3; }
  for top in "${!private_tmp_kept[@]}"; do
    [ -e "/tmp/$top" ] || continue
    if [ -d "/tmp/$top" ]; then mkdir "/dev/shm/$top"; else : > "/dev/shm/$top"; fi &&
      mount --rbind "/tmp/$top" "/dev/shm/$top" || { echo "SETUP: cannot bind /tmp/$top back in"; return 3; }
  done
  mount --move /dev/shm /tmp || { echo "SETUP: cannot move the new tmpfs over /tmp"; return 3; }
  mount -t tmpfs tmpfs /dev/shm || { echo "SETUP: cannot mount /dev/shm"; return 3; }
}

# What is in /tmp besides the trees private_tmp bound back, one name a line.
private_tmp_left() {
  local f
  ls -A /tmp | while read -r f; do [ -n "${private_tmp_kept[$f]:-}" ] || echo "$f"; done
}
