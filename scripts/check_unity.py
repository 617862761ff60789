#!/usr/bin/env python3
"""Checks that no name is defined at file scope in two source files of one target.

A unity build (FERRY_UNITY_BUILD, CMakeLists.txt) compiles a target's sources in batches, one file
after the other in one translation unit, so each file's file-scope names (in an anonymous namespace,
`static`, or a using-declaration) are seen by the files after it. Two definitions of one name with
the same signature fail to compile; with different signatures they become overloads, and a call in
one file may pick the other file's function without a word. This check refuses both: each name a
file defines at file scope is unique within its target. Allowed twice: namespace and type aliases
(two that differ do not compile) and the same using-declaration. A file's `using namespace N;`
reaches the files after it too, so the names a header of the target's folders defines in namespace N
count as defined by that header in every target whose files use it.

    scripts/check_unity.py [ROOT]      ROOT: the repository (default: this script's parent's parent)
    scripts/check_unity.py --self-test shows that the check finds what it should, and only that

Prints `name: file, file (target)` for each name defined more than once and exits 1, or exits 0.
The targets are CMakeLists.txt's: each layer's folder (the object layer twice: with the object
store's files, and with unbuilt_store.cc in their place), each provider's folder, the `ferry` program
(tools/ferry/ and bench/engine/), the Python extension (python/src/), the test support library and
each test executable split over several files (tests/verbs/conformance*.cc). Definitions are read
from lines that start in column 0 (clang-format keeps namespace contents unindented): functions,
types, constants and using-declarations; a line ending in ';' that declares a function is not a
definition.
"""

import collections
import glob
import os
import re
import sys

TARGETS = {
    "ferry_common": ["src/common/*.cc", "src/common/net/*.cc"],
    "ferry_verbs": ["src/verbs/*.cc"],
    "ferry_provider_soft": ["src/providers/soft/*.cc"],
    "ferry_provider_ibverbs": ["src/providers/ibverbs/*.cc"],
    "ferry_providers": ["src/providers/registry.cc"],
    "ferry_endpoint": ["src/endpoint/*.cc"],
    "ferry_agent": ["src/agent/*.cc", "src/agent/store/*.cc"],
    "ferry_connect": ["src/connect/*.cc"],
    # Without cpp-httplib (FERRY_WITH_HTTP=OFF) unbuilt_store.cc replaces the object store's files.
    "ferry_objects": ["src/objects/*.cc", "!src/objects/unbuilt_store.cc"],
    "ferry_objects (FERRY_WITH_HTTP=OFF)": ["src/objects/*.cc", "!src/objects/store_*.cc", "!src/objects/sigv4.cc"],
    "ferry_cli": ["tools/ferry/*.cc", "bench/engine/*.cc"],
    "ferry_core (Python)": ["python/src/*.cc"],
    "ferry_test_support": ["tests/support/*.cc"],
    "conformance_test": ["tests/verbs/conformance.cc", "tests/verbs/conformance_*.cc"],
}

KEYWORDS = {"if", "for", "while", "switch", "return", "operator", "main", "TEST", "TEST_F", "TEST_P",
            "namespace", "sizeof", "alignas", "static_assert", "decltype", "extern"}
TYPE = re.compile(r"^(?:template\s*<.*>\s*)?(?:struct|class|union|enum class|enum)\s+(?:alignas\(\d+\)\s+)?"
                  r"([A-Za-z_]\w*)\s*(?:final\s*)?[:{]")
ALIAS = re.compile(r"^using\s+([A-Za-z_]\w*)\s*=\s*(.+);")
USING_DECL = re.compile(r"^using\s+(?!namespace\b)[\w:]*::([A-Za-z_]\w*)\s*;")
NAMESPACE_ALIAS = re.compile(r"^namespace\s+([A-Za-z_]\w*)\s*=")
OBJECT = re.compile(r"^(?:static\s+|inline\s+|thread_local\s+)*(?:constexpr|const)\s+[\w:<>,\s\*&]+?\s"
                    r"([A-Za-z_]\w*)\s*(?:=|\{|\[)")
GLOBAL = re.compile(r"^(?:static\s+|thread_local\s+)+[\w:<>,\s\*&]+?\s([A-Za-z_]\w*)\s*(?:=|\{|\[|;)")
FUNCTION = re.compile(r"^(?:template\s*<.*>\s*)?(?:static\s+|inline\s+|constexpr\s+|\[\[\w+\]\]\s+)*"
                      r"[A-Za-z_][\w:<>,\s\*&]*?[\s\*&]([A-Za-z_]\w*)\s*\(")


def definitions(path):
    """(name, kind, detail, line) for each file-scope definition in one source file."""
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not line or line[0] in " \t#/}{)" or line.startswith(("//", "/*", "*")):
            continue
        m = NAMESPACE_ALIAS.match(line)
        if m:
            found.append((m.group(1), "namespace alias", line.strip(), number))
            continue
        m = ALIAS.match(line)
        if m:
            found.append((m.group(1), "alias", m.group(2).strip(), number))
            continue
        m = USING_DECL.match(line)
        if m:
            found.append((m.group(1), "using", line.strip(), number))
            continue
        for kind, pattern in (("type", TYPE), ("constant", OBJECT), ("variable", GLOBAL), ("function", FUNCTION)):
            m = pattern.match(line)
            if not m:
                continue
            name = m.group(1)
            if name in KEYWORDS:
                break
            if kind == "function":
                # A declaration ends in ';' before any '{' (members, qualified, never match: the
                # name must follow a space, '*' or '&').
                rest = " ".join(lines[number - 1:number + 3])
                body = rest.find("{")
                semi = rest.find(";")
                if body < 0 or (0 <= semi < body):
                    break
            found.append((name, kind, "", number))
            break
    return found


USING_NAMESPACE = re.compile(r"^using namespace\s+(?:[\w:]*::)?([A-Za-z_]\w*)\s*;")
NAMESPACE_OPEN = re.compile(r"^namespace\s+(?:[\w:]*::)?([A-Za-z_]\w*)\s*\{")


def used_namespace_headers(paths):
    """The headers beside `paths` that open a namespace some file of `paths` brings in whole with a
    using-directive (std's excepted)."""
    used = set()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            used.update(m.group(1) for m in map(USING_NAMESPACE.match, f) if m)
    used -= {"std", "chrono", "literals", "chrono_literals", "string_literals"}
    headers = set()
    for folder in {os.path.dirname(p) for p in paths}:
        for header in glob.glob(os.path.join(folder, "*.h")):
            with open(header, encoding="utf-8", errors="replace") as f:
                if any(m and m.group(1) in used for m in map(NAMESPACE_OPEN.match, f)):
                    headers.add(header)
    return headers


def namespaces_of(header):
    with open(header, encoding="utf-8", errors="replace") as f:
        return {m.group(1) for m in map(NAMESPACE_OPEN.match, f) if m}


def check(root):
    problems = []
    for target, patterns in TARGETS.items():
        seen = collections.defaultdict(list)
        paths = set()  # a pattern "!..." takes files out, as CMakeLists.txt leaves them out
        for pattern in patterns:
            matched = set(glob.glob(os.path.join(root, pattern.lstrip("!"))))
            paths = paths - matched if pattern.startswith("!") else paths | matched
        for path in sorted(paths | used_namespace_headers(paths)):
            for name, kind, detail, line in definitions(path):
                seen[name].append((os.path.relpath(path, root), kind, detail, line))
        for name, places in sorted(seen.items()):
            # `using N::name;` names the definition a header of namespace N holds: one entity.
            opened = {ns for p in places if p[0].endswith(".h")
                      for ns in namespaces_of(os.path.join(root, p[0]))}
            same = re.compile(r"\b(%s)::%s\s*;" % ("|".join(sorted(opened)) or "$^", name))
            places = [p for p in places if not (p[1] == "using" and same.search(p[2]))]
            files = sorted({p[0] for p in places})
            if len(files) < 2:
                continue
            kinds = {p[1] for p in places}
            if kinds <= {"namespace alias", "alias"}:
                continue  # two aliases of one name that differ do not compile: never silent
            if kinds == {"using"} and len({p[2] for p in places}) == 1:
                continue  # the same using-declaration twice names one entity
            problems.append("%s: %s (%s)" % (name, ", ".join("%s:%d" % (p[0], p[3]) for p in places), target))
    return problems


def self_test():
    """The check finds an overload across two files and a twice-defined constant, and lets aliases,
    declarations, members and one file's own overloads pass."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "src/common"))
        files = {
            "a.cc": "namespace {\nusing Clock = std::chrono::steady_clock;\nint fail(const char* who) {\n"
                    "  return 1;\n}\nint one(int x) { return x; }\nint one(long x) { return 2; }\n"
                    "constexpr int kLimit = 3;\n}  // namespace\nint Foo::member(int x) {\n  return x;\n}\n",
            "b.cc": "namespace {\nusing Clock = Table::Clock;\nint fail(const std::string& what) {\n"
                    "  return 2;\n}\nconstexpr int kLimit = 3;\nint declared(int x);\n}  // namespace\n"
                    "int Foo::member(long x) {\n  return 0;\n}\nusing namespace helpers;\n",
            # Brought into the batch whole by b.cc's using-directive: clashes with c.cc's refuse().
            "helpers.h": "namespace ferry::helpers {\ninline int refuse(const std::string& why) {\n"
                         "  return 1;\n}\n}  // namespace ferry::helpers\n",
            "c.cc": "namespace {\nint refuse(const char* why) {\n  return 2;\n}\n}  // namespace\n",
            # A header no file brings in whole: its names are its own.
            "other.h": "namespace ferry::other {\ninline int kept(int x) {\n  return x;\n}\n}\n",
            "d.cc": "namespace {\nint kept(long x) {\n  return 3;\n}\n}  // namespace\n",
        }
        for name, text in files.items():
            with open(os.path.join(root, "src/common", name), "w") as f:
                f.write(text)
        found = sorted(p.split(":")[0] for p in check(root))
    if found != ["fail", "kLimit", "refuse"]:
        print("check_unity: self-test FAILED: found %s, expected ['fail', 'kLimit', 'refuse']" % found)
        return 1
    print("check_unity: self-test passed (an overload across files, a constant and a name a using-directive "
          "brings in found; aliases, declarations, members and one file's overloads not)")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print("check_unity: %d names are defined at file scope in more than one file of a target; "
              "give each its own name or share one definition in a header" % len(problems))
        return 1
    print("check_unity: every file-scope name is unique within its target")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
