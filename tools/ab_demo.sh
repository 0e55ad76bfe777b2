#!/usr/bin/env bash
# ab_demo.sh OLD_DEMO NEW_DEMO [NP] [PAIRS] [-- ucm_demo args...]: the main job
# of two builds side by side, in interleaved pairs (old, then new, PAIRS times),
# each run on a fresh posix store directory, so that a drift in the machine's
# load or its disk hits both alike. Prints one line per run (decode time, raw
# read rate, backend loads, fraction of achievable by Belady's MIN and by the
# run's own 1-rank count where it has one, owner loads max/min), then each
# build's median decode time and the median and range of new/old per pair.
#
#   tools/ab_demo.sh /work/old/build-rel/apps/ucm_demo build-rel/apps/ucm_demo 1 6
#   tools/ab_demo.sh OLD NEW 4 5 -- --window 1
#
# Run it on a quiet machine (nothing building or testing beside it).
set -euo pipefail
(($# >= 2)) || { sed -n '2,13p' "$0" >&2; exit 2; }
old=$1 new=$2
shift 2
np=1 pairs=5
if (($# > 0)) && [[ $1 != -- ]]; then np=$1; shift; fi
if (($# > 0)) && [[ $1 != -- ]]; then pairs=$1; shift; fi
[[ ${1:-} == -- ]] && shift
for b in "$old" "$new"; do [[ -x $b ]] || { echo "ab_demo: $b: not an executable" >&2; exit 2; }; done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

times=""
for ((r = 1; r <= pairs; ++r)); do
  for v in old new; do
    bin=$old
    [[ $v == new ]] && bin=$new
    dir=$(mktemp -d)
    out=$(mpirun --bind-to none -np "$np" "$bin" --backend "posix:$dir" "$@" 2>&1) || {
      rm -rf "$dir"
      echo "ab_demo: pair $r, $v: ucm_demo failed:" >&2
      echo "$out" | tail -20 >&2
      exit 1
    }
    rm -rf "$dir"
    d=$(grep -oP 'tasks per rank in \K[0-9.]+' <<<"$out")
    raw=$(grep -oP 'bound: raw read \K[0-9.]+' <<<"$out" || echo -)
    loads=$(grep -oP 'backend loads per unique shard per node: [0-9.]+ \(\K[0-9]+' <<<"$out")
    fmin=$(grep -oP "result: .*, \K[0-9.]+(?= by Belady's MIN)" <<<"$out" || echo -)
    fone=$(grep -oP "the issue's count.*reached \K[0-9.]+" <<<"$out" || echo -)
    own=$(grep -oP 'owner loads per rank in decode: .*max/min \K[0-9.]+' <<<"$out" || echo -)
    times+="$v $r $d"$'\n'
    echo "pair $r $v: decode $d s, raw read $raw GB/s, loads $loads, fraction by MIN $fmin, by the 1-rank count $fone, owners max/min $own"
  done
done

printf '%s' "$times" | python3 -c '
import statistics, sys
d = {}
for line in sys.stdin:
    v, r, t = line.split()
    d.setdefault(v, {})[int(r)] = float(t)
old, new = d["old"], d["new"]
ratio = sorted(new[r] / old[r] for r in old)
print("decode, median: old %.4f s, new %.4f s; new/old per pair: median %.3f, range %.3f-%.3f (%d pairs)" % (
    statistics.median(old.values()), statistics.median(new.values()), statistics.median(ratio), ratio[0], ratio[-1],
    len(ratio)))
'
