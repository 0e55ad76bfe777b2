#!/usr/bin/python3
"""Every call of the public C API says, beside its declaration, which threads
may make it ("Threads: ...") and, when it takes a pointer, what a NULL one
gives (the issue's "one error for one mistake": UCM_ERR_NULL_POINTER).

The comment a call is judged by is the block comment right before its
declaration (and before a static inline wrapper's, for ucm_config_init).

usage: header_contract_test.py INCLUDE_DIR
"""
import os
import re
import sys

DECL = re.compile(r"/\*((?:(?!\*/).)*)\*/\s*((?:static inline[^{]*\{[^}]*\}\s*)?)UCM_API\s+[^;(]*?\b(ucm_\w+)\s*\(([^)]*)\)\s*;",
                  re.S)


def main(include_dir):
    errors, calls = [], 0
    for name in ("ucm_base.h", "ucm.h"):
        with open(os.path.join(include_dir, "ucmcache", name), encoding="utf-8") as f:
            text = f.read()
        declared = set(re.findall(r"UCM_API\s+[^;(]*?\b(ucm_\w+)\s*\(", text))
        judged = set()
        for m in DECL.finditer(text):
            comment, fn, params = " ".join(m.group(1).split()), m.group(3), m.group(4)
            judged.add(fn)
            calls += 1
            if "Threads:" not in comment:
                errors.append("%s: %s says nothing about threads (no 'Threads:' in its comment)" % (name, fn))
            if "*" in params and "NULL" not in comment:
                errors.append("%s: %s takes a pointer but its comment does not say what NULL gives" % (name, fn))
        for fn in sorted(declared - judged):
            errors.append("%s: %s has no comment right before its declaration" % (name, fn))
    if calls == 0:
        errors.append("no UCM_API declaration found under %s" % include_dir)
    if errors:
        print("header_contract_test: FAIL:\n" + "\n".join(errors), file=sys.stderr)
        return 1
    print("header_contract_test: ok (%d calls)" % calls)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
