#!/usr/bin/env bash
# The exported-symbol contract of libucmcache.so (DESIGN.md section 4):
#  1. every exported symbol starts with ucm_ (everything else is hidden; a C++
#     symbol here means an internal leaked past -fvisibility=hidden);
#  2. no exported symbol is also exported by UCX's libucm, which Open MPI loads
#     into the same process: a shared name would bind to whichever came first.
#
# usage: symbols_test.sh NM LIBUCMCACHE [UCX_LIBUCM]
# Exits 77 (skip) for check 2 when UCX's libucm is not installed, after check 1.
set -euo pipefail

nm=$1 lib=$2 ucx=${3:-/usr/lib/x86_64-linux-gnu/libucm.so.0}

indent() { sed 's/^/  /'; }
fail() { echo "symbols_test: FAIL: $*" >&2; exit 1; }

# Dynamic, defined symbols only; drop symbol versions ("name@@VER").
exports() { "$nm" -D --defined-only "$1" | awk 'NF >= 3 {sub(/@.*/, "", $3); print $3}' | sort -u; }

ours=$(exports "$lib") || fail "nm -D $lib"
[[ -n "$ours" ]] || fail "$lib exports no symbols at all"
echo "libucmcache exports $(wc -l <<<"$ours") symbols:"
indent <<<"$ours"

leaked=$(grep -v '^ucm_' <<<"$ours" || true)
if [[ -n "$leaked" ]]; then
  echo "symbols_test: exported symbols without the ucm_ prefix (internals leaking):" >&2
  indent <<<"$leaked" >&2
  if command -v c++filt >/dev/null; then c++filt <<<"$leaked" | sed 's/^/  demangled: /' >&2; fi
  fail "$(wc -l <<<"$leaked") non-API symbols exported"
fi

if [[ ! -e "$ucx" ]]; then
  echo "symbols_test: SKIP: UCX's libucm not found at $ucx (install libucx0 to check collisions)"
  exit 77
fi
theirs=$(exports "$ucx") || fail "nm -D $ucx"
echo "UCX $ucx exports $(wc -l <<<"$theirs") symbols"
clash=$(comm -12 <(echo "$ours") <(echo "$theirs"))
if [[ -n "$clash" ]]; then
  echo "symbols_test: exported by both libucmcache and UCX's libucm:" >&2
  indent <<<"$clash" >&2
  fail "$(wc -l <<<"$clash") symbol(s) collide with UCX"
fi
echo "symbols_test: ok (no ucm_* name collides with UCX)"
