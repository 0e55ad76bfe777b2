#!/usr/bin/env bash
# ucmcache: the two set-up commands (see README.md, "Set up").
#
#   ./run.sh main   install packages, build `build/`, run the main job: ucm_demo
#                   with 4 ranks on the embedded default store (extra arguments
#                   go to ucm_demo)
#   ./run.sh test   install packages, then four builds and their tests:
#                   build-ci (--werror, everything built, every suite, the
#                   Python package's suite `python` included), build-core
#                   (--werror, without MPI, hwloc, CUDA or liburing: suites
#                   unit and mp), build-tsan (ThreadSanitizer, with MPI: suites unit,
#                   mp and mpi), build-asan (AddressSanitizer + UBSan: suites
#                   unit, mp, mpi). build-core, -tsan and -asan build only
#                   what their suites' tests run (.ci/suite_targets.py). The
#                   summary counts test cases (.ci/test_summary.py).
#
# Packages come from Debian with apt-get (skipped when dpkg-query finds them all).
# Environment knobs, none needed:
#   UCM_BUILD_PREFIX  build directory name prefix (default `build`: build, build-ci,
#                     build-core, build-tsan, build-asan)
#   UCM_JOBS          parallel compile jobs and test processes (default: nproc;
#                     CI is a 2-core machine)
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")"

PACKAGES=(liburing-dev openmpi-bin libopenmpi-dev libhwloc-dev hwloc meson ninja-build pkg-config
          libgtest-dev g++ cmake scdoc strace fuse3 python3-fusepy
          python3-dev pybind11-dev python3-mpi4py python3-numpy python3-pytest)
PREFIX=${UCM_BUILD_PREFIX:-build}
JOBS=${UCM_JOBS:-$(nproc)}

# MPI as root on a small machine: later suites (mpi) launch more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'run.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
  cat >&2 <<'EOF'
usage: ./run.sh main   build (build/) and run the main job
       ./run.sh test   build build-ci, build-core, build-tsan, build-asan and run their tests
EOF
  exit 2
}

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]} == 0)); then
    echo "run.sh: packages already installed"
    return
  fi
  say "installing packages: ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "not root and no sudo: install ${missing[*]} first"
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${PACKAGES[@]}"
}

# configure DIR [meson options...]: set up, or re-apply the options to an existing dir.
configure() {
  local dir=$1; shift
  if [[ -f "$dir/meson-private/coredata.dat" ]]; then
    meson setup --reconfigure "$dir" "$@"
  else
    meson setup "$dir" "$@"
  fi
}

build() { configure "$@" && ninja -C "$1" -j "$JOBS"; }

main_job() {
  say "configure and build $PREFIX"
  build "$PREFIX"
  local demo="$PREFIX/apps/ucm_demo"
  [[ -x "$demo" ]] || die "$demo was not built (is Open MPI installed? meson setup prints what it found)"
  # The main job: 4 ranks share one node cache on the embedded default store (a
  # posix store in a fresh temporary directory, removed at the end).
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
  say "main job: mpirun -np 4 $demo $*"
  exec mpirun --oversubscribe --timeout 900 -np 4 "$demo" "$@"
}

# ---- test mode --------------------------------------------------------------

failures=()
summaries=()  # STAGE=TESTLOG for .ci/test_summary.py

# stage NAME DIR "SETUP OPTIONS" "SUITES" "TEST ARGS" [RUNNER...]: build, test, record.
# SUITES "all": build everything (`ninja`) and run every suite. Otherwise build
# only what those suites' tests run (.ci/suite_targets.py: each test's program
# and depends, plus what `meson install` copies), not the benchmarks or the
# test programs of other suites, and run those suites.
stage() {
  local name=$1 dir=$2 setup=$3 suites=$4 targs=$5; shift 5
  local start=$SECONDS targets=() suite_args=() s
  say "[$name] configure and build $dir ($setup; suites: $suites)"
  local log="$dir/meson-logs/testlog.json"
  summaries+=("$name=$log")
  rm -f "$log"  # a stale log from an earlier run must not count
  # shellcheck disable=SC2086  # option lists are words
  if ! configure "$dir" $setup; then
    failures+=("$name: configure failed")
    return
  fi
  if [[ "$suites" != all ]]; then
    local list
    # shellcheck disable=SC2086
    if ! list=$(/usr/bin/python3 .ci/suite_targets.py "$dir" $suites) || [[ -z "$list" ]]; then
      failures+=("$name: no target list for suites $suites")
      return
    fi
    mapfile -t targets <<<"$list"
    for s in $suites; do suite_args+=(--suite "$s"); done
  fi
  if ! ninja -C "$dir" -j "$JOBS" "${targets[@]}"; then
    failures+=("$name: build failed")
    return
  fi
  echo "run.sh: $name built in $((SECONDS - start)) s"
  say "[$name] meson test -C $dir ${suite_args[*]} $targs"
  # shellcheck disable=SC2086
  if ! "$@" meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$JOBS" \
       "${suite_args[@]}" $targs; then
    failures+=("$name: meson test failed (log: $dir/meson-logs/testlog.txt)")
  fi
  local counts  # its first line is the stage's (no `| head`: pipefail and SIGPIPE)
  counts=$(/usr/bin/python3 .ci/test_summary.py "$name=$log")
  echo "${counts%%$'\n'*}"
  echo "run.sh: $name took $((SECONDS - start)) s"
}

# ThreadSanitizer maps its shadow at fixed addresses; with high-entropy ASLR some
# kernels place mappings there and every binary dies with "unexpected memory
# mapping". Probe once and, if so, run the tests with ASLR off (setarch -R).
tsan_runner=()
probe_tsan() {
  local dir=$1 probe out
  probe="$dir/tsan-probe"
  printf 'int main() { return 0; }\n' | c++ -x c++ - -fsanitize=thread -o "$probe" || return 0
  if ! out=$("$probe" 2>&1); then
    if grep -q "unexpected memory mapping" <<<"$out"; then
      echo "run.sh: ThreadSanitizer needs ASLR off on this kernel: tests run under setarch -R"
      tsan_runner=(setarch "$(uname -m)" -R)
      "${tsan_runner[@]}" "$probe" || die "TSan probe fails even under setarch -R"
    else
      printf 'run.sh: warning: TSan probe failed:\n%s\n' "$out" >&2
    fi
  fi
}

test_job() {
  local start=$SECONDS
  # Warnings are errors in build-ci only: sanitizer builds add compiler warnings of
  # their own (-Wtsan) that say nothing about the code.
  # NVIDIA's NCCL at /usr/local/cuda has no pkg-config file: name its prefix,
  # so build-ci looks for it as a user's build would (-Dnccl_prefix).
  local ci_opts="--werror"
  [[ -f /usr/local/cuda/include/nccl.h ]] && ci_opts+=" -Dnccl_prefix=/usr/local/cuda"
  # build-ci builds everything (apps, benchmarks, the Python module) and runs
  # every suite: it is the one stage where the benchmarks' smoke runs (suite
  # bench), the install, obs, python and slurm suites, and gpu's skips run.
  stage ci "$PREFIX-ci" "$ci_opts" all ""

  # Sanitizer builds check the CPU code: CUDA/NCCL code cannot run without a GPU,
  # and nvcc does not take -fsanitize. build-ci compiles it with --werror.
  local san_common="-Dcuda=disabled -Dnccl=disabled"

  # The proof that the cache core builds (without a warning) and passes its
  # tests with none of MPI, hwloc or CUDA (DESIGN.md section 3), and that the
  # posix store builds and works without liburing (its io_uring engine's tests
  # skip, saying so; every other stage builds that engine). Unoptimized:
  # it is the cheapest build, and the optimized code is tested in the others.
  # It builds what suites unit and mp run (no benchmarks: build-ci runs those).
  stage core "$PREFIX-core" \
    "--werror -Dbuildtype=debug $san_common -Dmpi=disabled -Dhwloc=disabled -Dio_uring=disabled" \
    "unit mp" ""

  # ThreadSanitizer over everything the CPU runs, with MPI: the core's shared
  # structures in unit and mp, and under mpirun the api layer's threads (the
  # dispatcher, copier, store workers and application threads calling the C
  # API at once, then finalize). Open MPI is not instrumented; TSan still
  # intercepts its pthread and memory calls, and needs no suppression with
  # the ob1/vader transports the mpi suite uses.
  # Both sanitizer stages build only what suites unit, mp and mpi run (the
  # benchmarks, the Python module, obs's probe are build-ci's), and compile
  # the test programs' own sources at -O0 (tests/meson.build says why); the
  # library keeps -O2.
  # Line tables only (-g1, after the buildtype's -g): a sanitizer's report still
  # names each frame's function, file and line, and an instrumented -O2 file
  # compiles in about 0.73x the time of full -g (load_queue.cpp: 8.5 s, 11.6 s).
  san_common+=" -Dc_args=-g1 -Dcpp_args=-g1"
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  mkdir -p "$PREFIX-tsan"
  probe_tsan "$PREFIX-tsan"
  stage tsan "$PREFIX-tsan" "-Db_sanitize=thread $san_common" \
    "unit mp mpi" "--timeout-multiplier 2" "${tsan_runner[@]}"

  export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
  # GCC links libasan/libubsan into libucmcache.so itself, so b_lundef
  # (-Wl,--no-undefined) can stay on. The mpi suite's ranks run under ASan
  # too (Open MPI's own leaks are suppressed by tests/lsan.supp, which the
  # mpi tests' environment names).
  stage asan "$PREFIX-asan" "-Db_sanitize=address,undefined $san_common" \
    "unit mp mpi" "--timeout-multiplier 2"

  say "summary ($((SECONDS - start)) s)"
  if ((${#failures[@]})); then
    printf '  FAILED %s\n' "${failures[@]}"
  fi
  # A line per stage, then one closing line over all four: test cases
  # (GoogleTest's, pytest's, a script is one) and, beside them, test programs.
  /usr/bin/python3 .ci/test_summary.py "${summaries[@]}"
  ((${#failures[@]} == 0))
}

case "${1:-}" in
  main) shift; install_packages; main_job "$@" ;;
  test) (($# == 1)) || usage; install_packages; test_job ;;
  *) usage ;;
esac
