#!/usr/bin/env bash
# The man pages say what the code does: ucmcache(7) documents exactly the
# UCM_* variables of ucm_config_t (ucm.h) plus every other one lib/ reads, and
# ucm_info(1) every option `ucm_info -h` lists. When scdoc is built, the
# generated pages are roff.
#
# usage: man_test.sh SOURCE_ROOT UCM_INFO BUILT_PAGE...
set -euo pipefail

src=$1 info=$2; shift 2
fail() { echo "man_test: FAIL: $*" >&2; exit 1; }

header="$src/include/ucmcache/ucm.h" page7="$src/man/ucmcache.7.scd" page1="$src/man/ucm_info.1.scd"
# ucm_config_t lives in ucm_base.h beside ucm.h (the MPI-free part of the API).
config_vars=$(cat "$header" "$(dirname "$header")/ucm_base.h" 2>/dev/null | awk '/typedef struct ucm_config/,/} ucm_config_t;/' | grep -o '/\* UCM_[A-Z_]*' | cut -c4- | grep -vx 'UCM_VERSION_CODE' | sort -u)
[[ -n "$config_vars" ]] || fail "no UCM_* variable found in $header"
# Every other variable the library reads (logging, the test hooks): any getenv of lib/.
log_vars=$(grep -rho 'getenv("UCM_[A-Z_]*")' "$src/lib" | sed 's/getenv("\(.*\)")/\1/' | sort -u)
want=$(printf '%s\n' $config_vars $log_vars | sort -u)
# A variable is documented by a heading line: *UCM_NAME* at the line's start.
have=$(grep -o '^\*UCM_[A-Z_]*\*' "$page7" | tr -d '*' | sort -u)
[[ "$have" == "$want" ]] || fail "ucmcache.7 documents [$(echo $have)], the code reads [$(echo $want)]"

# Every option a store's spec parser takes (k == "name" in its parse loop)
# is documented in ucmcache.7 as *name=*.
for store in posix sim; do
  keys=$(grep -o 'k == "[a-z_]*"' "$src/lib/backend/${store}_backend.cpp" | sed 's/k == "\(.*\)"/\1/' | sort -u)
  [[ -n "$keys" ]] || fail "no option found in the $store store's parser"
  for k in $keys; do
    grep -q -- "\*$k=\*" "$page7" || fail "ucmcache.7 does not document the $store store's option $k="
  done
done

opts=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE "$info" -h | grep -oE '(^| )--?[a-z]+' | tr -d ' ' | sort -u)
[[ -n "$opts" ]] || fail "ucm_info -h lists no option"
for o in $opts; do
  grep -q -- "\*$o\*" "$page1" || fail "ucm_info.1 does not document $o"
done

for built in "$@"; do
  [[ -s "$built" ]] || fail "$built was not generated"
  grep -q '^\.TH ' "$built" || fail "$built is not a man page (no .TH)"
done
echo "man_test: ok ($(echo $want | wc -w) variables, $(echo $opts | wc -w) options, $# pages built)"
