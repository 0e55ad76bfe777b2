#!/usr/bin/env bash
# The package installs for Debian's interpreter: `meson install --destdir`
# puts ucmcache/ (the compiled _native module and the .py files) in a
# directory that, without the destdir, is on that interpreter's sys.path; and
# the installed copy imports (with the installed libucmcache) and works.
# usage: install_test.sh SOURCE_ROOT BUILD_ROOT MESON PYTHON
set -euo pipefail
src=$1 build=$2 meson=$3 py=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
dest=$build/python-install-test
rm -rf "$dest"
trap 'rm -rf "$dest"' EXIT
# Only the library and the package (tags), from what is built: no rebuild inside a test.
"$meson" install -C "$build" --no-rebuild --tags runtime,python-runtime --destdir "$dest" --quiet >/dev/null
init=$(find "$dest" -path '*/ucmcache/__init__.py' -print)
[[ -n "$init" ]] || { echo "FAIL: no ucmcache/__init__.py under $dest"; exit 1; }
[[ $(wc -l <<<"$init") -eq 1 ]] || { echo "FAIL: more than one ucmcache package installed: $init"; exit 1; }
pkg=$(dirname "$init")
site=${pkg%/ucmcache}
site=${site#"$dest"}
native=$(find "$pkg" -name '_native*.so' -print)
[[ -n "$native" ]] || { echo "FAIL: no compiled _native module in $pkg"; exit 1; }
for f in __init__.py errors.py demo.py; do
  [[ -f "$pkg/$f" ]] || { echo "FAIL: $f not installed in $pkg"; exit 1; }
done
# The directory, without the destdir, is on Debian's interpreter's path.
paths=$(env -u PYTHONPATH "$py" -c 'import sys; print("\n".join(sys.path))')
if ! grep -qxF "$site" <<<"$paths"; then
  echo "FAIL: $site (where meson installs the package) is not on $py's sys.path:"
  echo "$paths"
  exit 1
fi
# The installed copy imports and runs a cache (1 rank, host engine, posix store).
libdir=$(dirname "$(find "$dest" -name 'libucmcache.so.0' -print)")
store=$(mktemp -d)
trap 'rm -rf "$dest" "$store"' EXIT
out=$(cd / && env -u PYTHONPATH PYTHONPATH="$dest$site" LD_LIBRARY_PATH="$libdir" PYTHONDONTWRITEBYTECODE=1 \
      "$py" - "$store" <<'PY'
import sys
import numpy as np
from mpi4py import MPI
import ucmcache
print("file", ucmcache.__file__, ucmcache._native.__file__)
with ucmcache.Cache(MPI.COMM_WORLD, shard_bytes=4096, cache_bytes=1 << 20, reserved_slots=8,
                    copy_engine="host", backend="posix:" + sys.argv[1]) as c:
    k = [(ucmcache.block_id(1), 0)]
    c.dump(k, [np.arange(4096, dtype=np.uint16).astype(np.uint8)]).wait()
    out = np.zeros(4096, np.uint8)
    c.load(k, out).wait()
    assert np.array_equal(out, np.arange(4096, dtype=np.uint16).astype(np.uint8))
print("ok", ucmcache.version)
PY
)
echo "$out"
grep -q "^file $dest" <<<"$out" || { echo "FAIL: did not import the installed copy"; exit 1; }
grep -q "^ok " <<<"$out" || { echo "FAIL: the installed copy did not work"; exit 1; }
echo "ok: installed in $site (on $py's sys.path), imports and runs"
