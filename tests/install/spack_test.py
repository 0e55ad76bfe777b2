#!/usr/bin/python3
"""Keeps packaging/spack honest against meson_options.txt (no Spack needed).

Every variant() of the recipe is a `feature` option of meson_options.txt with
the same name, passed as feature("<name>"); every meson option that is not a
variant is passed explicitly as "-D<name>=..."; the recipe names no option
meson_options.txt lacks.

usage: spack_test.py SOURCE_ROOT
"""
import ast
import re
import sys


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
    if errors:
        return "\n".join(errors)
    print("spack_test: variants %s; passed %s" % (sorted(variants), sorted(passed)))
    return None


if __name__ == "__main__":
    err = main(sys.argv[1])
    if err:
        print("spack_test: FAIL:\n" + err, file=sys.stderr)
        sys.exit(1)
    print("spack_test: ok")
