#!/usr/bin/python3
"""No function in lib/, python/src/ or apps/ is over 60 lines (signature line through closing brace).

The project's rule (docs/design.md, section 3), as a build fact: every
function definition under lib/, python/src/ and apps/ (.cpp and .h) is found
and measured from the first line of its signature (after any `template <...>`
line) through its closing brace; one over the limit fails the test, named by
file:line, name and length. A file the scanner cannot follow (braces that do not balance) fails
too, so that nothing escapes the rule by confusing it.

How it reads C++: comments, string literals (raw ones too), character
literals and preprocessor lines are blanked first (a `'` inside a number is a
digit separator, not a character literal), so no brace in them counts. Then,
at namespace and class scope, each `{` is judged by what came before it since
the last `;`, `{` or `}`: `namespace` and `extern "C"` are entered, a class,
struct or union is entered (its inline member functions count), a head with a
parameter list and no `=` before it opens a function body (a constructor's
braced member initializers are stepped over), anything else (an aggregate
initializer, an enum) is skipped. A function body is skipped by brace
matching, so the lambdas and local classes inside it count toward it.

usage: fn_length_test.py SOURCE_ROOT [MAX]   scan SOURCE_ROOT/lib, SOURCE_ROOT/python/src and SOURCE_ROOT/apps
       fn_length_test.py --self-test          the scanner's own cases
"""
import os
import re
import sys

MAX_LINES = 60
# The library, the Python module's C++ and the programs users run (ucm_demo,
# ucm_info): the same rule for all three.
SCANNED = ("lib", os.path.join("python", "src"), "apps")
_QUALIFIERS = {"const", "noexcept", "override", "final", "volatile", "mutable", "try"}
_CLASS_KEYS = {"class", "struct", "union"}
_ACCESS = {"public", "private", "protected"}


class ScanError(Exception):
    pass


def blank(text):
    """text with comments, literals and preprocessor lines turned to spaces
    (newlines kept, so line numbers stay); a string literal leaves `""`."""
    out = []
    i, n = 0, len(text)
    line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if line_start and c == "#":
            # A directive, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                if text.startswith("/*", i):  # a comment opened on the directive line
                    end = text.find("*/", i + 2)
                    end = n if end < 0 else end + 2
                    out.append(re.sub(r"[^\n]", " ", text[i:end]))
                    i = end
                    continue
                out.append(" ")
                i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ScanError("unterminated comment")
            out.append(re.sub(r"[^\n]", " ", text[i:end + 2]))
            i = end + 2
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(', text[i:i + 24])
        if m and not _ident_char_before(text, i):
            close = ")" + m.group(1) + '"'
            end = text.find(close, i + m.end())
            if end < 0:
                raise ScanError("unterminated raw string")
            end += len(close)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:end]))
            i = end
            continue
        if c == '"' or (c == "'" and not _digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    raise ScanError("unterminated literal")
                j += 1
            if j >= n:
                raise ScanError("unterminated literal")
            out.append(c + c + " " * (j - i - 1))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _ident_char_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _digit_separator(text, i):
    """A `'` inside a number (1'000'000, 0xff'ff), not a character literal (u8'a')."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return j < i and text[j].isdigit()


_TOKEN = re.compile(r'""|\'\'|::|->|==|!=|<=|>=|&&|\|\||[A-Za-z_]\w*|\d[\w.\']*|\S')


def tokens(text):
    """[(token, line)] of blanked text."""
    out = []
    line = 1
    pos = 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        out.append((m.group(0), line))
    return out


def _strip_head(head):
    """The head without attributes, alignas(...), a leading template <...> and
    access specifiers: what is left starts on the signature's line."""
    h = list(head)
    changed = True
    while changed and h:
        changed = False
        t = h[0][0]
        if t in _ACCESS and len(h) > 1 and h[1][0] == ":":
            h = h[2:]
            changed = True
        elif t == "template" and len(h) > 1 and h[1][0] == "<":
            depth, k = 0, 1
            while k < len(h):
                if h[k][0] == "<":
                    depth += 1
                elif h[k][0] == ">":
                    depth -= 1
                    if depth == 0:
                        break
                elif h[k][0] == ">>":
                    depth -= 2
                    if depth <= 0:
                        break
                k += 1
            h = h[k + 1:]
            changed = True
        elif t == "[" and len(h) > 1 and h[1][0] == "[":
            k = 2
            while k + 1 < len(h) and not (h[k][0] == "]" and h[k + 1][0] == "]"):
                k += 1
            h = h[k + 2:]
            changed = True
    return h


def _first_paren(h):
    """Index of the parameter list's `(` in the head (none: -1)."""
    for k, (t, _) in enumerate(h):
        if t == "(":
            prev = h[k - 1][0] if k > 0 else ""
            if prev in ("alignas", "__attribute__", "__declspec", "decltype"):
                continue
            if prev == "operator" and k + 1 < len(h) and h[k + 1][0] == ")":
                continue  # operator(): its parameter list is the next one
            return k
    return -1


def _matching(toks, k, open_, close):
    depth = 0
    while k < len(toks):
        if toks[k][0] == open_:
            depth += 1
        elif toks[k][0] == close:
            depth -= 1
            if depth == 0:
                return k
        k += 1
    raise ScanError("unbalanced %s%s" % (open_, close))


def classify(head):
    """'namespace', 'class', 'function' or 'other' for the head before a `{`."""
    h = _strip_head(head)
    if not h:
        return "other"
    words = [t for t, _ in h]
    if words[0] == "namespace" or (words[0] == "extern" and words[1:] == ['""']):
        return "namespace"
    p = _first_paren(h)
    top = []  # the head's tokens outside parentheses, up to the parameter list
    depth = 0
    for t, _ in h[: p if p >= 0 else len(h)]:
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
        elif depth == 0:
            top.append(t)
    if top and top[0] == "enum":
        return "other"
    if p < 0:
        return "class" if any(t in _CLASS_KEYS for t in top) else "other"
    if any(t == "=" and (k == 0 or top[k - 1] != "operator") for k, t in enumerate(top)):
        return "other"
    return "function"


def _function_name(head):
    """The declarator's name: `Foo::bar`, `Foo::~Foo`, `operator==`."""
    h = [t for t, _ in _strip_head(head)]
    p = _first_paren(_strip_head(head))
    if p <= 0:
        return "?"
    k = p - 1
    j = k
    while j >= 0 and h[j] != "operator" and not re.match(r"\w", h[j]):
        j -= 1
    if j >= 0 and h[j] == "operator":
        name = "operator" + "".join(h[j + 1:p])
        k = j - 1
    elif re.match(r"\w", h[k]):
        name = h[k]
        k -= 1
    else:
        return "?"
    if k >= 0 and h[k] == "~":
        name = "~" + name
        k -= 1
    while k >= 1 and h[k] == "::" and re.match(r"\w", h[k - 1]):
        name = h[k - 1] + "::" + name
        k -= 2
    return name


def _in_init_list(head):
    """The head is a constructor's signature followed by `:` (member initializers)."""
    h = _strip_head(head)
    p = _first_paren(h)
    if p < 0:
        return False
    try:
        close = _matching(h, p, "(", ")")
    except ScanError:
        return False
    depth = 0
    for t, _ in h[close + 1:]:
        if t in ("(", "{"):
            depth += 1
        elif t in (")", "}"):
            depth -= 1
        elif t == ":" and depth == 0:
            return True
    return False


def scan(text):
    """[(name, first_line, lines)] of every function definition in C++ text."""
    toks = tokens(blank(text))
    found = []
    head = []
    scopes = []  # 'namespace' or 'class' for each brace entered
    k = 0
    while k < len(toks):
        t, line = toks[k]
        if t == "{":
            kind = classify(head)
            if kind == "function" and _in_init_list(head) and head and \
                    (re.match(r"\w", head[-1][0]) or head[-1][0] == ">") and head[-1][0] not in _QUALIFIERS:
                # A braced member initializer, `: a_{1}`: part of the head.
                end = _matching(toks, k, "{", "}")
                head.append(("{}", line))
                k = end + 1
                continue
            if kind in ("namespace", "class"):
                scopes.append(kind)
                head = []
                k += 1
                continue
            end = _matching(toks, k, "{", "}")
            if kind == "function":
                h = _strip_head(head)
                first = h[0][1] if h else line
                found.append((_function_name(head), first, toks[end][1] - first + 1))
                head = []
            else:
                head.append(("{}", line))  # an initializer: the declaration goes on to its `;`
            k = end + 1
            continue
        if t == "}":
            if not scopes:
                raise ScanError("line %d: `}` closes nothing" % line)
            scopes.pop()
            head = []
        elif t == ";":
            head = []
        else:
            head.append((t, line))
        k += 1
    if scopes:
        raise ScanError("%d scope(s) still open at the end" % len(scopes))
    return found


def scan_tree(root, max_lines):
    """(over-long functions as 'file:line name (N lines)', unreadable files)."""
    over, errors = [], []
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith((".cpp", ".cc", ".h", ".hpp")):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, os.path.dirname(root))
            try:
                fns = scan(open(p, encoding="utf-8", errors="replace").read())
            except ScanError as e:
                errors.append("%s: the scanner cannot follow it: %s" % (rel, e))
                continue
            over += [(rel, line, name, n) for name, line, n in fns if n > max_lines]
    return ["%s:%d %s (%d lines)" % o for o in sorted(over)], errors


# ---- the scanner's own cases ---------------------------------------------------


def _body(n):
    """A function of exactly n lines (n >= 2)."""
    return "int f(int x) {\n" + "  x += 1;\n" * (n - 2) + "}\n"


def self_test():
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append("%s: got %r, want %r" % (what, got, want))

    def lengths(text):
        return [(name, line, n) for name, line, n in scan(text)]

    check("60 lines", lengths(_body(60)), [("f", 1, 60)])
    check("61 lines", lengths(_body(61)), [("f", 1, 61)])
    with_tmp = _tmp_tree({"a/x.cpp": _body(60), "a/y.cpp": "\n" + _body(61)})
    check("tree: 60 passes, 61 fails", scan_tree(os.path.join(with_tmp, "a"), 60),
          (["a/y.cpp:2 f (61 lines)"], []))
    check("braces in strings, chars, comments",
          lengths('void g() {\n  const char* s = "{{{";\n  char c = \'{\';\n  // }\n  /* { */\n'
                  '  auto r = R"x(})x";\n}\nint h() { return 1; }\n'),
          [("g", 1, 7), ("h", 8, 1)])
    check("escaped quote in a string", lengths('void g() {\n  puts("\\"}");\n}\n'), [("g", 1, 3)])
    check("digit separators are not char literals",
          lengths("void g() {\n  long n = 1'000'000;\n  char c = '}';\n}\n"), [("g", 1, 4)])
    check("multi-line signature counts from its first line",
          lengths("namespace ucm {\nResult Foo::bar(int a,\n                 int b) const {\n  return a;\n}\n}  // namespace ucm\n"),
          [("Foo::bar", 2, 4)])
    check("a lambda counts toward its function",
          lengths("void g() {\n  auto f = [&](int x) {\n    return x;\n  };\n  f(1);\n}\nvoid h() {}\n"),
          [("g", 1, 6), ("h", 7, 1)])
    check("braced member initializers",
          lengths("Foo::Foo(int a)\n    : a_{a},\n      b_(a) {\n  go();\n}\n"), [("Foo::Foo", 1, 5)])
    check("inline member functions in a class; initializers are not functions",
          lengths("struct alignas(64) S {\n public:\n  int a{0};\n  int get() const {\n    return a;\n  }\n"
                  "  enum class E : int { kA, kB };\n};\nint v[] = {1, 2};\n"),
          [("get", 4, 3)])
    check("template line not counted", lengths("template <typename T>\nT id(T x) {\n  return x;\n}\n"),
          [("id", 2, 3)])
    check("extern \"C\" block and operator",
          lengths('extern "C" {\nint ucm_x(void) {\n  return 0;\n}\n}\n'
                  "bool operator==(const K& a, const K& b) {\n  return a.x == b.x;\n}\n"),
          [("ucm_x", 2, 3), ("operator==", 6, 3)])
    check("preprocessor lines ignored",
          lengths("#define M(x) do { x; } while (0)\n#if 1\nvoid g() {\n#endif\n}\n"), [("g", 3, 3)])
    try:
        scan("void g() {\n  if (x) {\n}\n")
        failures.append("unbalanced braces: no ScanError")
    except ScanError:
        pass
    for f in failures:
        print("fn_length_test: FAIL (self-test): " + f)
    print("fn_length_test: self-test: %d failure(s)" % len(failures))
    return 1 if failures else 0


def _tmp_tree(files):
    import tempfile
    root = tempfile.mkdtemp(prefix="fn_length_")
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    return root


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    if len(argv) < 2:
        print(__doc__)
        return 2
    max_lines = int(argv[2]) if len(argv) > 2 else MAX_LINES
    over, errors = [], []
    for d in SCANNED:
        o, e = scan_tree(os.path.join(argv[1], d), max_lines)
        over += o
        errors += e
    for e in errors:
        print("fn_length_test: FAIL: " + e)
    for o in over:
        print("fn_length_test: FAIL: %s: over %d lines" % (o, max_lines))
    print("fn_length_test: %d function(s) over %d lines, %d file(s) unreadable" % (len(over), max_lines, len(errors)))
    return 1 if over or errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
