#!/usr/bin/env bash
# Builds a parent Meson project (tests/install/subproject) that uses this
# source tree as its subproject `ucmcache`, then runs its program.
# Only the parent's program and the library it needs are built (not the apps),
# unoptimized, to keep the test small.
#
# usage: subproject_test.sh SOURCE_ROOT BUILD_ROOT MESON VERSION
set -euo pipefail

src_root=$1 build_root=$2 meson=$3 version=$4
here="$src_root/tests/install"
fail() { echo "subproject_test: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "$build_root/tests/install/parent.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/subprojects"
cp "$here/subproject/meson.build" "$here/consumer.c" "$work/src/"
ln -s "$src_root" "$work/src/subprojects/ucmcache"

"$meson" setup "$work/build" "$work/src" -Dbuildtype=debug > "$work/setup.log" 2>&1 \
  || { cat "$work/setup.log" >&2; fail "meson setup of the parent"; }
grep -q "ucmcache version $version" "$work/setup.log" \
  || { cat "$work/setup.log" >&2; fail "the parent did not get ucmcache $version"; }
# -j2: CI's machine has 2 cores, and other tests run beside this one.
"$meson" compile -C "$work/build" -j 2 consumer > "$work/compile.log" 2>&1 \
  || { cat "$work/compile.log" >&2; fail "building the parent's consumer"; }
out=$(env -u LD_LIBRARY_PATH "$work/build/consumer") || fail "the parent's consumer exited $?"
grep -qx "version $version" <<<"$out" || fail "the parent's consumer did not print 'version $version'"
echo "$out"
echo "subproject_test: ok"
