#!/usr/bin/env bash
# ucm_cache_finalize with a dead or a late peer returns, bounded, naming it.
# usage: finalize_peer.sh MPIRUN PROGRAM
set -u
mpirun=$1 prog=$2
fail=0
# A SIGKILLed rank; --enable-recovery keeps the survivors running.
out=$("$mpirun" --oversubscribe --enable-recovery --timeout 60 -np 3 "$prog" dead 2>&1)
echo "$out" | grep -E "^rank [0-9]+:" 
oks=$(echo "$out" | grep -c "^rank [01]: ok$")
if [ "$oks" -ne 2 ]; then echo "FAIL: dead peer: $oks of 2 survivors saw a bounded UCM_ERR_PEER_DEAD naming local rank 2"; fail=1; fi
# A live rank that comes to finalize 4 s late, with timeout_ms 1000.
out=$("$mpirun" --oversubscribe --timeout 60 -np 2 "$prog" late 2>&1)
rc=$?
echo "$out" | grep -E "^rank [0-9]+:"
oks=$(echo "$out" | grep -c "^rank [01]: ok$")
if [ "$oks" -ne 2 ] || [ "$rc" -ne 0 ]; then echo "FAIL: late peer: $oks of 2 ranks right, mpirun exit $rc"; fail=1; fi
[ "$fail" -eq 0 ] && echo "ok: finalize is bounded and names the peer it did not see"
exit "$fail"
