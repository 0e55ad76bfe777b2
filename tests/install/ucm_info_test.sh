#!/usr/bin/env bash
# ucm_info without a launcher (-v, -c, -f, -d, --parsable, bad input) and, when
# the build has MPI, under mpirun (the per-rank bootstrap view).
#
# usage: ucm_info_test.sh UCM_INFO UCM_H LIBUCMCACHE NM VERSION MPIRUN|none
set -euo pipefail

info=$1 header=$2 lib=$3 nm=$4 version=$5 mpirun=$6
fail() { echo "ucm_info_test: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# No launcher: clear what mpirun/srun would have set, and give Open MPI an
# empty TMPDIR: an MPI_Init (a singleton) makes its session directory there
# (ompi.<host>.<uid>), and -v, -c, -f and -d must not call it.
mkdir "$tmp/mpi"
noenv=(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE)
# Every -u before the first NAME=VALUE: env reads no option after one.
for v in $(env | sed -n 's/^\(UCM_[A-Z_]*\)=.*/\1/p'); do noenv+=(-u "$v"); done
noenv+=(TMPDIR="$tmp/mpi")
run() { "${noenv[@]}" "$@"; }

# --- -v: version and build options
run "$info" -v --parsable > "$tmp/v" 2> "$tmp/v.err" || fail "-v --parsable exited $?: $(cat "$tmp/v.err")"
[[ ! -s "$tmp/v.err" ]] || fail "-v wrote to stderr: $(cat "$tmp/v.err")"
grep -qx "version:ucmcache:$version" "$tmp/v" || fail "-v --parsable lacks version:ucmcache:$version"
for k in mpi hwloc cuda nccl nvtx; do
  grep -Eqx "build:$k:(yes|no)" "$tmp/v" || fail "-v --parsable lacks build:$k:yes|no"
done
grep -Eq "^build:compiler:.+" "$tmp/v" || fail "-v --parsable lacks build:compiler"
# Output first, then grep: under pipefail, `cmd | grep -q` fails at random
# when grep exits before cmd has written everything (SIGPIPE).
human_v=$(run "$info" -v)
grep -q "^ucmcache $version\$" <<<"$human_v" || fail "-v does not print 'ucmcache $version'"

# nccl_built means the library calls NCCL: the report and the library's
# undefined symbols agree.
# (Into a variable first: under pipefail, `nm | grep -q` dies of SIGPIPE at random.)
undefined=$("$nm" -D --undefined-only "$lib")
if grep -q ' nccl' <<< "$undefined"; then calls=yes; else calls=no; fi
grep -qx "build:nccl:$calls" "$tmp/v" \
  || fail "ucm_info says $(grep '^build:nccl:' "$tmp/v"), the library calling NCCL: $calls"

# NVTX is built in when the library can load an NVTX tool (its loader names
# the variable); ucm_info -v says the same.
if grep -q NVTX_INJECTION64_PATH "$lib"; then nvtx=yes; else nvtx=no; fi
grep -qx "build:nvtx:$nvtx" "$tmp/v" || fail "ucm_info says $(grep '^build:nvtx:' "$tmp/v"), the library's NVTX: $nvtx"

# --- -c: every variable of ucm_config_t, with value, default and source
# ucm_config_t lives in ucm_base.h beside ucm.h (the MPI-free part of the API).
vars=$(cat "$header" "$(dirname "$header")/ucm_base.h" 2>/dev/null | awk '/typedef struct ucm_config/,/} ucm_config_t;/' | grep -o '/\* UCM_[A-Z_]*' | cut -c4- | grep -vx 'UCM_VERSION_CODE' | sort -u)
[[ -n "$vars" ]] || fail "found no UCM_* variable in $header"
run env UCM_SHARD_BYTES=2M UCM_ORDER=natural "$info" -c --parsable > "$tmp/c" || fail "-c --parsable exited $?"
for v in $vars; do
  for f in field value default source; do
    grep -q "^tunable:$v:$f:" "$tmp/c" || fail "-c --parsable lacks tunable:$v:$f"
  done
done
listed=$(sed -n 's/^tunable:\([^:]*\):field:.*/\1/p' "$tmp/c" | sort -u)
[[ "$listed" == "$vars" ]] || fail "-c lists [$(echo $listed)], ucm.h documents [$(echo $vars)]"
grep -qx "tunable:UCM_SHARD_BYTES:value:2097152" "$tmp/c" || fail "UCM_SHARD_BYTES=2M is not value 2097152"
grep -qx "tunable:UCM_SHARD_BYTES:default:1048576" "$tmp/c" || fail "UCM_SHARD_BYTES default is not 1048576"
grep -qx "tunable:UCM_SHARD_BYTES:source:environment" "$tmp/c" || fail "UCM_SHARD_BYTES source is not environment"
grep -qx "tunable:UCM_ORDER:value:natural" "$tmp/c" || fail "UCM_ORDER=natural is not value natural"
grep -qx "tunable:UCM_CACHE_BYTES:source:default" "$tmp/c" || fail "unset UCM_CACHE_BYTES is not source default"
grep -q "^tunable:[^:]*:help:" "$tmp/c" && fail "-c printed help text (only -f does)"
# What a script needs to check its own settings: type, values, layout.
for v in $vars; do
  for f in type values layout; do
    grep -q "^tunable:$v:$f:." "$tmp/c" || fail "-c --parsable lacks tunable:$v:$f"
  done
done
grep -qx "tunable:UCM_ORDER:values:rotate|natural" "$tmp/c" || fail "UCM_ORDER's values are not rotate|natural"
grep -qx "tunable:UCM_ORDER:layout:yes" "$tmp/c" || fail "UCM_ORDER is not a layout tunable"
grep -qx "tunable:UCM_TIMEOUT_MS:layout:no" "$tmp/c" || fail "UCM_TIMEOUT_MS is a layout tunable"
grep -qx "tunable:UCM_SHARD_BYTES:type:size" "$tmp/c" || fail "UCM_SHARD_BYTES is not of type size"

# --- -f: the same with help text for every variable
run "$info" -f --parsable > "$tmp/f" || fail "-f --parsable exited $?"
for v in $vars; do
  grep -Eq "^tunable:$v:help:.{10,}" "$tmp/f" || fail "-f gives $v no help text"
done
human_f=$(run "$info" -f)
grep -Eq "^UCM_SHARD_BYTES +=" <<<"$human_f" || fail "-f (human) has no UCM_SHARD_BYTES row"
grep -Eq "^    values: rotate\|natural$" <<<"$human_f" || fail "-f (human) does not give UCM_ORDER's values"

# --- a bad value is an error naming it
if run env UCM_SHARD_BYTES=abc "$info" -c > "$tmp/bad" 2>&1; then fail "UCM_SHARD_BYTES=abc: -c exited 0"; fi
grep -q "UCM_SHARD_BYTES=abc" "$tmp/bad" || fail "UCM_SHARD_BYTES=abc: the error does not name it: $(cat "$tmp/bad")"
if run "$info" -x > "$tmp/bad" 2>&1; then fail "-x exited 0"; fi
grep -q "unknown option -x" "$tmp/bad" || fail "-x: no 'unknown option -x': $(cat "$tmp/bad")"

# --- -d: the node, against what this machine says
run "$info" -d --parsable > "$tmp/d" || fail "-d --parsable exited $?"
grep -qx "node:cpus:online:$(getconf _NPROCESSORS_ONLN)" "$tmp/d" || fail "-d cpus:online is not $(getconf _NPROCESSORS_ONLN)"
free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
grep -qx "node:hugepages:free:$free" "$tmp/d" || fail "-d hugepages:free is not $free (/proc/meminfo)"
grep -qx "node:memfd:yes" "$tmp/d" || fail "-d does not find memfd"
grep -Eqx "node:memfd_hugetlb:(yes|no)" "$tmp/d" || fail "-d lacks memfd_hugetlb"
grep -Eq "^node:init:pages:(hugetlb|ordinary)" "$tmp/d" || fail "-d lacks init:pages"
grep -Eq "^node:gpu:count:[0-9]+$" "$tmp/d" || fail "-d lacks gpu:count"
if grep -qx "node:gpu:count:0" "$tmp/d"; then
  grep -Eq "^node:gpu:why:.+" "$tmp/d" || fail "-d finds no GPU and does not say why"
fi
if grep -qx "build:hwloc:yes" "$tmp/v"; then
  grep -Eq "^node:numa:count:[1-9]" "$tmp/d" || fail "-d with hwloc lacks numa:count"
  grep -Eq "^node:numa:[0-9]+:cpus:[0-9]" "$tmp/d" || fail "-d with hwloc lists no NUMA node's cpus"
fi

# --- no argument, no launcher: the version and the usage, no MPI
run "$info" > "$tmp/none" || fail "no argument: exited $?"
grep -q "^usage: ucm_info" "$tmp/none" || fail "no argument: no usage"

[[ -z "$(ls -A "$tmp/mpi")" ]] || fail "-v/-c/-f/-d started MPI: $(ls -A "$tmp/mpi")"

# --- under mpirun: the per-rank bootstrap view, one line per rank in order
if [[ "$mpirun" != none ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
  # Under AddressSanitizer, no leak check at exit here: Open MPI leaks in
  # MPI_Finalize (tests/lsan.supp). The mpi suite checks the library's own
  # leaks, before MPI_Finalize.
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
  "$mpirun" --oversubscribe --timeout 50 -np 2 "$info" > "$tmp/b" 2> "$tmp/b.err" \
    || fail "mpirun -np 2 ucm_info exited $?: $(cat "$tmp/b.err")"
  [[ "$(grep -c '^rank ' "$tmp/b")" == 2 ]] || fail "mpirun -np 2 ucm_info: not 2 rank lines: $(cat "$tmp/b")"
  grep -q "^rank 0/2 .*local_size=2" "$tmp/b" && grep -q "^rank 1/2 .*local_size=2" "$tmp/b" \
    || fail "mpirun -np 2 ucm_info: rank lines lack local_size=2: $(cat "$tmp/b")"
  grep -q "nccl=not-built" "$tmp/b" || [[ $calls == yes ]] || fail "bootstrap view reports NCCL built, unused"
else
  if run "$info" -b > "$tmp/b" 2>&1; then fail "-b without MPI exited 0"; fi
  grep -q "built without MPI" "$tmp/b" || fail "-b without MPI does not say why: $(cat "$tmp/b")"
fi
echo "ucm_info_test: ok"
