#!/usr/bin/env bash
# Installs the build into a staging directory inside the build tree, then builds
# and runs consumer.c against that installed copy the way a user would:
# `pkg-config --cflags --libs ucmcache`, nothing from the source tree.
#
# Then the same program through the CMake package (tests/install/cmake):
# find_package(ucmcache MAJOR.MINOR CONFIG REQUIRED), the project's own major
# and minor (1.0 once the version is 1.0), must configure, build and run
# against the installed copy (its RUNPATH, with meson test's LD_LIBRARY_PATH
# removed); a request for the next major (MAJOR+1.0) must be
# refused by ucmcacheConfigVersion.cmake.
#
# With MAN=man, the man pages ucm_info(1) and ucmcache(7) must be installed.
#
# usage: install_test.sh SOURCE_ROOT BUILD_ROOT MESON CC VERSION SANITIZE CMAKE|none MAN|noman
#   SANITIZE is the build's b_sanitize value ("none", "address,undefined", ...);
#   the consumer is built with the same -fsanitize flags so that a sanitized
#   libucmcache.so finds its runtime.
set -euo pipefail

src_root=$1 build_root=$2 meson=$3 cc=$4 version=$5 sanitize=$6 cmake=${7:-none} man=${8:-noman}
here="$src_root/tests/install"

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

# Everything this test writes lives under the build tree and is removed on exit.
stage=$(mktemp -d "$build_root/tests/install/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# --no-rebuild: `meson test` has already built everything, and a second ninja
# inside a running `meson test` would race with it.
"$meson" install -C "$build_root" --no-rebuild --quiet --destdir "$stage/root" \
  > "$stage/install.log" 2>&1 || { cat "$stage/install.log" >&2; fail "meson install"; }

pc=$(find "$stage/root" -name ucmcache.pc -path '*/pkgconfig/*' -print -quit)
[[ -n "$pc" ]] || fail "no ucmcache.pc installed under $stage/root"
header=$(find "$stage/root" -path '*/include/ucmcache/ucm.h' -print -quit)
[[ -n "$header" ]] || fail "ucmcache/ucm.h not installed"
echo "installed: ${pc#"$stage/root"}"
echo "installed: ${header#"$stage/root"}"
if [[ "$man" == man ]]; then
  for page in man1/ucm_info.1 man7/ucmcache.7; do
    found=$(find "$stage/root" -path "*/share/man/$page" -print -quit)
    [[ -n "$found" ]] || fail "man page $page not installed"
    echo "installed: ${found#"$stage/root"}"
  done
fi

# The installed .pc names the configured prefix (/usr/local by default), which is
# not where the staged copy is. Relocate a copy of it by rewriting `prefix=` only:
# every other path in it must derive from ${prefix}, or the checks below fail.
# (PKG_CONFIG_SYSROOT_DIR would also re-root the system packages ucmcache.pc
# requires, such as mpi-c.) System .pc files stay on the search path.
grep -q '^prefix=' "$pc" || fail "ucmcache.pc has no prefix= line"
prefix=$(sed -n '/^prefix=/{s///p;q}' "$pc")
echo "ucmcache.pc (prefix $prefix):"
sed 's/^/  | /' "$pc"
mkdir -p "$stage/pc"
sed "s|^prefix=.*|prefix=$stage/root$prefix|" "$pc" > "$stage/pc/ucmcache.pc"
export PKG_CONFIG_PATH="$stage/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

pc_version=$(pkg-config --modversion ucmcache) || fail "pkg-config --modversion"
[[ "$pc_version" == "$version" ]] || fail "ucmcache.pc version '$pc_version' != project version '$version'"
cflags=$(pkg-config --cflags ucmcache) || fail "pkg-config --cflags"
libs=$(pkg-config --libs ucmcache) || fail "pkg-config --libs"
echo "pkg-config --cflags: $cflags"
echo "pkg-config --libs:   $libs"

# -I must be the directory that holds ucmcache/, so <ucmcache/ucm.h> resolves.
inc_dir=$(dirname "$(dirname "$header")")
[[ " $cflags " == *" -I$inc_dir "* ]] || fail "--cflags lacks -I$inc_dir (got '$cflags')"
[[ " $libs " == *" -lucmcache "* ]] || fail "--libs lacks -lucmcache (got '$libs')"
lib_dir=""  # the -L into the staged copy (required packages add their own -L)
for flag in $libs; do
  if [[ "$flag" == "-L$stage/root/"* ]]; then lib_dir=${flag#-L}; fi
done
[[ -n "$lib_dir" ]] || fail "--libs has no -L into the installed copy (got '$libs')"
[[ -e "$lib_dir/libucmcache.so" ]] || fail "no libucmcache.so in the -L directory $lib_dir"
[[ -n "$(ls "$lib_dir"/libucmcache.so.0* 2>/dev/null)" ]] || fail "no libucmcache.so.0* (soname) in $lib_dir"

san_flags=()
if [[ "$sanitize" != "none" && -n "$sanitize" ]]; then
  san_flags=("-fsanitize=$sanitize")
fi

# shellcheck disable=SC2086  # pkg-config output is a list of words
# C99 with -pedantic-errors: the installed header must be plain C99.
"$cc" -std=c99 -pedantic-errors -Wall -Wextra -Werror "${san_flags[@]}" \
  $cflags "$here/consumer.c" -o "$stage/consumer" $libs \
  || fail "compiling consumer.c against the installed copy"

# The executable must load the installed library, not the one in the build tree.
out=$(LD_LIBRARY_PATH="$lib_dir" "$stage/consumer") || fail "consumer exited $?"
echo "$out"
resolved=$(LD_LIBRARY_PATH="$lib_dir" ldd "$stage/consumer" | awk '/libucmcache/ {print $3}')
[[ "$resolved" == "$lib_dir"/* ]] || fail "consumer resolved libucmcache to '$resolved', not the installed copy"

grep -qx "version $version" <<<"$out" || fail "consumer did not print 'version $version'"
grep -qx "result UCM_OK: .*" <<<"$out" || fail "consumer did not print the UCM_OK result string"
grep -qx "result UCM_ERR_NO_SPACE: .*" <<<"$out" || fail "consumer did not print the UCM_ERR_NO_SPACE result string"

# --- the CMake package
[[ "$cmake" != none ]] || { echo "install_test: ok (no cmake: CMake package not checked)"; exit 0; }
cfg=$(find "$stage/root" -path '*/cmake/ucmcache/ucmcacheConfig.cmake' -print -quit)
[[ -n "$cfg" ]] || fail "no cmake/ucmcache/ucmcacheConfig.cmake installed"
[[ -f "$(dirname "$cfg")/ucmcacheConfigVersion.cmake" ]] || fail "no ucmcacheConfigVersion.cmake beside $cfg"
echo "installed: ${cfg#"$stage/root"}"
major=${version%%.*} rest=${version#*.}
minor=${rest%%.*}
want="$major.$minor" refuse="$((major + 1)).0"
cmake_args=(-DCMAKE_PREFIX_PATH="$stage/root$prefix" -DCMAKE_C_COMPILER="$cc")
if ((${#san_flags[@]})); then
  cmake_args+=(-DCMAKE_C_FLAGS="${san_flags[*]}" -DCMAKE_EXE_LINKER_FLAGS="${san_flags[*]}")
fi
"$cmake" -S "$here/cmake" -B "$stage/cmake-ok" "${cmake_args[@]}" -DUCM_WANT_VERSION="$want" \
  > "$stage/cmake-ok.log" 2>&1 || { cat "$stage/cmake-ok.log" >&2; fail "find_package(ucmcache $want) failed"; }
grep -q "ucmcache $version from $stage/root" "$stage/cmake-ok.log" \
  || { cat "$stage/cmake-ok.log" >&2; fail "find_package(ucmcache $want) did not find $version in the staged tree"; }
"$cmake" --build "$stage/cmake-ok" > "$stage/cmake-build.log" 2>&1 \
  || { cat "$stage/cmake-build.log" >&2; fail "building the CMake consumer"; }
out=$(env -u LD_LIBRARY_PATH "$stage/cmake-ok/consumer") || fail "CMake consumer exited $?"
grep -qx "version $version" <<<"$out" || fail "CMake consumer did not print 'version $version'"
resolved=$(env -u LD_LIBRARY_PATH ldd "$stage/cmake-ok/consumer" | awk '/libucmcache/ {print $3}')
[[ "$resolved" == "$stage/root/"* ]] || fail "CMake consumer resolved libucmcache to '$resolved', not the installed copy"
echo "cmake: find_package(ucmcache $want) found $version, built and ran"

if "$cmake" -S "$here/cmake" -B "$stage/cmake-refuse" "${cmake_args[@]}" -DUCM_WANT_VERSION="$refuse" \
     > "$stage/cmake-refuse.log" 2>&1; then
  cat "$stage/cmake-refuse.log" >&2
  fail "find_package(ucmcache $refuse) accepted version $version"
fi
grep -q "compatible with requested version \"$refuse\"" "$stage/cmake-refuse.log" \
  || { cat "$stage/cmake-refuse.log" >&2; fail "find_package(ucmcache $refuse) failed for another reason"; }
echo "cmake: find_package(ucmcache $refuse) refused, as it must"
echo "install_test: ok"
