#!/usr/bin/python3
"""Keeps packaging/spack honest against meson_options.txt (no Spack needed).

Every variant() of the recipe is a `feature` option of meson_options.txt with
the same name, passed as feature("<name>"); every meson option that is not a
variant is passed explicitly as "-D<name>=..."; the recipe names no option
meson_options.txt lacks.

The recipe is then run, against a stand-in for `spack.package` that records
its directives: its source (`git`) and `homepage` are this checkout (the
project is published nowhere, so an http(s) address in it is a placeholder
and refused), and meson_args() for every variant combination Spack allows
passes each variant's feature as enabled or disabled to match.

usage: spack_test.py SOURCE_ROOT
"""
import ast
import itertools
import os
import re
import sys
import types


def main(root):
    opts = {}
    with open(root + "/meson_options.txt", encoding="utf-8") as f:
        for m in re.finditer(r"option\('([^']+)',\s*type:\s*'([^']+)'", f.read()):
            opts[m.group(1)] = m.group(2)
    if not opts:
        return "no option found in meson_options.txt"
    path = root + "/packaging/spack/packages/ucmcache/package.py"
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)

    def calls(name):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.value

    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    if not classes or not any(getattr(b, "id", None) == "MesonPackage" for b in classes[0].bases):
        return "the recipe's class is not a MesonPackage"
    variants = set(calls("variant"))
    featured = set(calls("feature"))
    passed = set(re.findall(r'"-D([a-z_]+)=', source))
    errors = []
    for v in sorted(variants):
        if v not in opts:
            errors.append("variant %s is no option of meson_options.txt" % v)
        elif opts[v] != "feature":
            errors.append("variant %s is a %s option, not a feature" % (v, opts[v]))
        if v not in featured:
            errors.append("variant %s is not passed to meson (feature(%r))" % (v, v))
    for name, kind in sorted(opts.items()):
        if name not in variants and name not in passed:
            errors.append("meson option %s (%s) is neither a variant nor passed as -D%s=" % (name, kind, name))
    for name in sorted(passed | featured):
        if name not in opts:
            errors.append("the recipe passes -D%s, which meson_options.txt lacks" % name)
    for want in ("cuda", "nccl", "hwloc"):
        if want not in variants:
            errors.append("no variant %s" % want)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.search(r"\bhttps?://", node.value):
            errors.append("the recipe names a web address (%r, line %d): its source is the user's checkout"
                          % (node.value, node.lineno))
    if errors:
        return "\n".join(errors)
    errors = run_recipe(root, path, opts, variants)
    if errors:
        return "\n".join(errors)
    print("spack_test: variants %s; passed %s" % (sorted(variants), sorted(passed)))
    return None


class FakeSpec:
    """What meson_args() asks of a spec: satisfies("+v"), spec["dep"].prefix."""

    def __init__(self, on):
        self.on = on

    def satisfies(self, constraint):
        m = re.fullmatch(r"([+~])([a-z_]+)", constraint)
        if not m:
            raise AssertionError("the stand-in spec understands only +variant/~variant, not %r" % constraint)
        return self.on[m.group(2)] == (m.group(1) == "+")

    def __getitem__(self, dep):
        return types.SimpleNamespace(prefix="/opt/fake/" + dep)


def run_recipe(root, path, opts, variants):
    """Loads the recipe in place (its __file__ is where it lies) with a recording spack.package."""
    directives = []
    pkg = types.ModuleType("spack.package")

    class MesonPackage:
        run_tests = False
    pkg.MesonPackage = MesonPackage
    for name in ("license", "version", "variant", "conflicts", "depends_on", "maintainers", "patch", "resource"):
        setattr(pkg, name, (lambda n: lambda *a, **k: directives.append((n, a, k)))(name))
    pkg.__all__ = [n for n in vars(pkg) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.package = pkg
    saved = {k: sys.modules.get(k) for k in ("spack", "spack.package")}
    sys.modules["spack"], sys.modules["spack.package"] = spack, pkg
    try:
        scope = {"__file__": path, "__name__": "ucmcache_recipe"}
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), scope)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    errors = []
    cls = scope.get("Ucmcache")
    if cls is None:
        return ["the recipe defines no class Ucmcache"]
    checkout = os.path.realpath(root)
    git = getattr(cls, "git", None)
    if git != "file://" + checkout:
        errors.append("the recipe's git is %r, not this checkout (file://%s)" % (git, checkout))
    home = getattr(cls, "homepage", "")
    if not home.startswith("file://") or not os.path.exists(home[len("file://"):]):
        errors.append("the recipe's homepage %r is no file of this checkout" % home)
    for attr in ("url", "list_url"):
        if getattr(cls, attr, None):
            errors.append("the recipe sets %s = %r: its source is the checkout (git)" % (attr, getattr(cls, attr)))
    if not any(d[0] == "version" for d in directives):
        errors.append("the recipe declares no version()")
    conflicts = [(a[0], k.get("when")) for n, a, k in directives if n == "conflicts"]
    names = sorted(variants)
    for values in itertools.product([True, False], repeat=len(names)):
        on = dict(zip(names, values))
        spec = FakeSpec(on)
        if any(spec.satisfies(c) and spec.satisfies(w) for c, w in conflicts if w):
            continue
        for run_tests in (True, False):
            obj = cls.__new__(cls)
            obj.spec = spec
            obj.run_tests = run_tests
            args = obj.meson_args()
            where = " ".join(("+" if on[v] else "~") + v for v in names) + (" (tests)" if run_tests else "")
            given = {}
            for a in args:
                m = re.fullmatch(r"-D([a-z_]+)=(.*)", a)
                if not m:
                    errors.append("%s: meson_args() gives %r, not -Dname=value" % (where, a))
                    continue
                if m.group(1) in given:
                    errors.append("%s: meson_args() passes -D%s twice" % (where, m.group(1)))
                given[m.group(1)] = m.group(2)
            for name in given:
                if name not in opts:
                    errors.append("%s: meson_args() passes -D%s, which meson_options.txt lacks" % (where, name))
            for v in names:
                want = "enabled" if on[v] else "disabled"
                if given.get(v) != want:
                    errors.append("%s: -D%s=%s, the variant says %s" % (where, v, given.get(v), want))
            if given.get("tests") != ("true" if run_tests else "false"):
                errors.append("%s: -Dtests=%s" % (where, given.get("tests")))
    return errors


if __name__ == "__main__":
    err = main(sys.argv[1])
    if err:
        print("spack_test: FAIL:\n" + err, file=sys.stderr)
        sys.exit(1)
    print("spack_test: ok")
