#!/usr/bin/python3
"""The layers are a build fact, and the build says what docs/design.md says.

docs/design.md, section 3, has one row per layer with the layers it may use.
Against it, in this build:

- `meson introspect --targets`: one static library `ucmcache_<layer>` per
  row, compiled only from lib/<layer>/, whose include path holds the scope of
  the layer itself and of the layers it may use, and nothing else of the
  source or build tree (the public headers and ucm_build_config.h aside).
- compile_commands.json: a probe source compiled with exactly a layer's flags
  resolves every header of the layers it may use and none of the others (one
  preprocessor run per layer); and compiled for real in ctrl's scope, an
  include of queue/load_queue.h fails while an include of its own and of
  sync/'s headers compiles.
- the sources: <mpi.h> only in boot/ and api/, CUDA and NCCL headers only in
  device/cuda/, hwloc only in topo/; no include spelled with "../" or "lib/".

usage: layers_test.py SOURCE_ROOT BUILD_ROOT MESON
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)
    print("layers_test: FAIL: " + msg)


def design_table(src):
    """{layer: set of layers it may use}, in the table's order (a dict keeps it)."""
    text = open(os.path.join(src, "docs", "design.md"), encoding="utf-8").read()
    m = re.search(r"^## 3\. Layers\n(.*?)^## 4\.", text, re.S | re.M)
    if not m:
        raise SystemExit("layers_test: FAIL: docs/design.md has no section '## 3. Layers'")
    table = {}
    header = None
    for line in m.group(1).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        name = re.fullmatch(r"`([a-z_]+)/`", cells[0])
        if not name:
            continue
        if header[1] != "may use":
            raise SystemExit("layers_test: FAIL: the layer table's second column is %r, not 'may use'" % header[1])
        uses = set() if cells[1] == "nothing" else set(re.findall(r"`([a-z_]+)`", cells[1]))
        table[name.group(1)] = uses
    if not table:
        raise SystemExit("layers_test: FAIL: docs/design.md section 3 has no layer rows")
    return table


def scope_of(path):
    """The layer whose include root `path` (an -I argument) is, else None."""
    m = re.search(r"(?:^|/)lib/scope/([a-z_]+)$", path.rstrip("/"))
    return m.group(1) if m else None


def check_targets(src, build, meson, table):
    out = subprocess.run([meson, "introspect", "--targets", build], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        fail("meson introspect --targets %s exited %d: %s" % (build, out.returncode, out.stderr.strip()))
        return
    targets = {t["name"]: t for t in json.loads(out.stdout)}
    src_real = os.path.normpath(src)
    for layer, uses in table.items():
        t = targets.get("ucmcache_" + layer)
        if t is None or t["type"] != "static library":
            fail("no static library ucmcache_%s in meson introspect: layer %s is not its own library" % (layer, layer))
            continue
        seen = set()
        for ts in t["target_sources"]:
            for s in ts["sources"]:
                rel = os.path.relpath(os.path.normpath(s), src_real)
                if not rel.startswith(os.path.join("lib", layer) + os.sep):
                    fail("ucmcache_%s compiles %s, which is not under lib/%s/" % (layer, rel, layer))
            params = ts["parameters"]
            for i, p in enumerate(params):
                if p == "-I" and i + 1 < len(params):
                    p = "-I" + params[i + 1]
                if not p.startswith("-I") or p == "-I":
                    continue
                d = p[2:]
                full = os.path.normpath(os.path.join(build, d))
                layer_scope = scope_of(d)
                if layer_scope is not None:
                    seen.add(layer_scope)
                elif d.endswith(".a.p"):
                    pass  # the target's own object directory
                elif full in (os.path.join(src_real, "include"), os.path.join(os.path.normpath(build), "include")):
                    pass  # the public headers
                elif full == src_real or full.startswith(src_real + os.sep) or full == os.path.normpath(build):
                    fail("ucmcache_%s compiles with %s: a directory of the tree outside any layer's scope" % (layer, p))
        seen.discard("config")
        want = uses | {layer}
        if seen != want:
            extra = sorted(seen - want)
            missing = sorted(want - seen)
            fail("ucmcache_%s's include scope is %s; docs/design.md says %s%s%s" % (
                layer, sorted(seen), sorted(want),
                (" (not declared there: %s)" % ", ".join(extra)) if extra else "",
                (" (missing: %s)" % ", ".join(missing)) if missing else ""))
    lib_layers = sorted(d for d in os.listdir(os.path.join(src, "lib"))
                        if os.path.isfile(os.path.join(src, "lib", d, "meson.build")))
    if lib_layers != sorted(table):
        fail("lib/ has layers %s; docs/design.md's table has %s" % (lib_layers, sorted(table)))


def layer_commands(build):
    """{layer: (directory, argv)}: the first compile command of a source under lib/<layer>/."""
    cmds = {}
    for e in json.load(open(os.path.join(build, "compile_commands.json"))):
        f = os.path.normpath(os.path.join(e["directory"], e["file"]))
        m = re.search(r"/lib/([a-z_]+)/[^/]+\.cpp$", f)
        if not m or m.group(1) in cmds:
            continue
        argv = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        cmds[m.group(1)] = (e["directory"], argv, e["file"])
    return cmds


def probe_argv(argv, source, mode):
    """The layer's command with `source` in place of its own and no output
    file: mode is ['-fsyntax-only'] or ['-M', '-MG']."""
    out = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if i == 0 and os.path.basename(a) == "ccache":
            continue
        if a in ("-o", "-MQ", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-fdiagnostics-color"):
            continue
        out.append(a)
    # The source is the last argument (after -c in Meson's commands).
    return out[:-1] + mode + [source]


def headers(src, layer):
    root = os.path.join(src, "lib")
    hs = []
    for d, _, files in os.walk(os.path.join(root, layer)):
        hs += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".h")]
    return sorted(hs)


def check_scopes(src, build, table, tmp):
    cmds = layer_commands(build)
    every = {layer: headers(src, layer) for layer in table}
    probe = os.path.join(tmp, "scope_probe.cpp")
    with open(probe, "w") as f:
        for layer in table:
            for h in every[layer]:
                f.write('#include "%s"\n' % h)
    for layer, uses in table.items():
        if layer not in cmds:
            fail("compile_commands.json has no source of lib/%s/" % layer)
            continue
        d, argv, _ = cmds[layer]
        r = subprocess.run(probe_argv(argv, probe, ["-M", "-MG"]), cwd=d, capture_output=True, text=True, check=False)
        tokens = r.stdout.replace("\\\n", " ").split()
        resolved, missing = set(), set()
        for t in tokens[2:]:
            m = re.search(r"(?:^|/)lib/scope/([a-z_]+)/\1/", t)
            if m:
                resolved.add(m.group(1))
            elif re.fullmatch(r"[a-z_]+/[a-z_/]+\.h", t) and not os.path.exists(os.path.join(d, t)):
                missing.add(t.split("/")[0])
            elif os.path.normpath(os.path.join(d, t)).startswith(os.path.join(os.path.normpath(src), "lib") + os.sep):
                fail("in %s's scope, %s was found outside the layers' include roots" % (layer, t))
        want = uses | {layer}
        if resolved - want:
            fail("in %s's scope, headers of %s resolve (it may use only %s)" % (
                layer, ", ".join(sorted(resolved - want)), ", ".join(sorted(want))))
        if missing & want:
            fail("in %s's scope, headers of %s do not resolve, which it may use" % (layer, ", ".join(sorted(missing & want))))
        # A header of the layer that no source of it includes is built by
        # nobody: its own includes must resolve in its layer's scope too.
        own = os.path.join(tmp, "own_%s.cpp" % layer)
        with open(own, "w") as f:
            f.writelines('#include "%s"\n' % h for h in every[layer])
        r_own = subprocess.run(probe_argv(argv, own, ["-M", "-MG"]), cwd=d, capture_output=True, text=True, check=False)
        for t in r_own.stdout.replace("\\\n", " ").split()[2:]:
            if re.fullmatch(r"[a-z_]+/[a-z_/]+\.h", t) and not os.path.exists(os.path.join(d, t)):
                fail("a header of lib/%s/ includes %s, which %s may not use" % (layer, t, layer))
        unseen = set(table) - want - missing - resolved
        if unseen:
            fail("in %s's scope, headers of %s were neither found nor missing (exit %d: %s)" % (
                layer, ", ".join(sorted(unseen)), r.returncode, r.stderr.strip()[:400]))

    # The deliberate wrong include, compiled for real with ctrl's own flags.
    if "ctrl" not in cmds:
        return
    d, argv, file = cmds["ctrl"]
    bad = os.path.join(tmp, "ctrl_uses_queue.cpp")
    with open(bad, "w") as f:
        f.write('#include "ctrl/layout.h"\n#include "queue/load_queue.h"\n')
    r = subprocess.run(probe_argv(argv, bad, ["-fsyntax-only"]), cwd=d, capture_output=True, text=True, check=False)
    if r.returncode == 0:
        fail("ctrl's flags (those of %s) compiled an include of queue/load_queue.h: a wrong include builds" % file)
    elif "queue/load_queue.h" not in r.stderr:
        fail("the wrong include failed, but not on queue/load_queue.h: %s" % r.stderr.strip()[:400])
    good = os.path.join(tmp, "ctrl_uses_sync.cpp")
    with open(good, "w") as f:
        f.write('#include "ctrl/layout.h"\n#include "sync/futex.h"\n#include "common/result.h"\n'
                'int probe() { return static_cast<int>(ucm::kCtrlAbi); }\n')
    r = subprocess.run(probe_argv(argv, good, ["-fsyntax-only"]), cwd=d, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        fail("ctrl's flags did not compile includes of ctrl/, sync/ and common/: %s" % r.stderr.strip()[:400])


# (pattern of an #include <...>, the folders under lib/ that may have it)
EXTERNAL = [
    (r"mpi\.h", ("boot", "api")),
    (r"(cuda|cuda_runtime|cuda_runtime_api|nccl)\.h", ("device/cuda",)),
    (r"hwloc(\.h|/.*)", ("topo",)),
]


def check_sources(src):
    root = os.path.join(src, "lib")
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith((".h", ".cpp")):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
                if not m:
                    continue
                name = m.group(2)
                if m.group(1) == '"' and (name.startswith("../") or name.startswith("lib/")):
                    fail("lib/%s:%d includes \"%s\": spell it <layer>/<header>.h" % (rel, n, name))
                for pat, where in EXTERNAL:
                    if m.group(1) == "<" and re.fullmatch(pat, name) and \
                            not any(rel.startswith(w + os.sep) for w in where):
                        fail("lib/%s:%d includes <%s>, which only %s may" % (rel, n, name, ", ".join(where)))


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    src, build, meson = sys.argv[1:]
    table = design_table(src)
    for layer, uses in table.items():
        for u in uses:
            if u not in table:
                fail("docs/design.md: %s may use %s, which is no layer" % (layer, u))
            elif list(table).index(u) > list(table).index(layer):
                fail("docs/design.md: %s may use %s, a layer listed after it" % (layer, u))
            elif not table[u] <= uses:
                fail("docs/design.md: %s may use %s but not all of what %s may use (%s)" % (
                    layer, u, u, ", ".join(sorted(table[u] - uses))))
    check_targets(src, build, meson, table)
    with tempfile.TemporaryDirectory(prefix="ucm-layers-") as tmp:
        check_scopes(src, build, table, tmp)
    check_sources(src)
    if failures:
        print("layers_test: %d failure(s)" % len(failures))
        return 1
    print("layers_test: ok: %d layers, each its own library with the scope docs/design.md gives it" % len(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
