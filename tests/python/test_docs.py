"""The docs stay true: every relative link in the repository's Markdown resolves to a file (or
folder) inside the repository, no Markdown names a path outside it, and the tables of FERRY_*
variables in README.md and docs/configuration.md list exactly what the code's table holds."""

import os
import re

import ferry

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP_DIRS = {".git", ".venv", ".pytest_cache", "node_modules"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
# A path that climbs out of the file's folder: ../x, ../../x/y (in prose, code spans and blocks).
PARENT_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-][\w./-]*)")
# Folders next to a checkout that the repository must not depend on.
OUTSIDE_NAMES = ("../shared", "shared/seeds", "shared/tools", "shared/notes")


def markdown_files():
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(dirpath, f)


def inside_repository(path):
    return path == ROOT or path.startswith(ROOT + os.sep)


def link_targets(line):
    return LINK.findall(line) + REFERENCE_LINK.findall(line)


def is_relative(target):
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith(("#", "/"))


def outside_references(path, text):
    """Returns "file:line: why" for each place in Markdown file `path` (its contents `text`) that
    leads out of the repository: a relative link that resolves outside it or to nothing, a path
    that climbs above its root, or a name of a folder next to the checkout. Links count outside
    fenced code blocks; paths and names count everywhere."""
    found = []
    folder = os.path.dirname(path)
    where = os.path.relpath(path, ROOT)
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        names = [name for name in OUTSIDE_NAMES if name in line]
        if names:
            found.append("%s:%d: names %s, outside the repository" % (where, number, names[0]))
        links = [] if in_code else [t for t in link_targets(line) if is_relative(t)]
        for climb in PARENT_PATH.findall(line):
            if climb not in links and not inside_repository(os.path.normpath(os.path.join(folder, climb))):
                found.append("%s:%d: path %s leaves the repository" % (where, number, climb))
        for target in links:
            resolved = os.path.normpath(os.path.join(folder, target.split("#", 1)[0]))
            if not inside_repository(resolved):
                found.append("%s:%d: link %s leaves the repository" % (where, number, target))
            elif not os.path.exists(resolved):
                found.append("%s:%d: link %s: no such file" % (where, number, target))
    return found


def test_the_scan_finds_what_leaves_the_repository():
    doc = os.path.join(ROOT, "docs", "example.md")
    text = "\n".join([
        "See [the build](../README.md), [a section](#ok), [a site](https://example.org/x).",  # 1: fine
        "Run `../shared/tools/rxe-vm/run-in-vm.sh` first.",  # 2
        "As shared/seeds/001_x describes.",  # 3
        "A [missing page](nothing-here.md).",  # 4
        "An [outside page](../../outside.md).",  # 5
        "```sh",
        "cd ../../elsewhere && make",  # 7: a path in a code block
        "[not a link in code](nothing-here.md)",  # 8: fine
        "```",
        "[ref]: ../../outside.md",  # 10
    ])
    found = outside_references(doc, text)
    assert [f.split(":")[1] for f in found] == ["2", "3", "4", "5", "7", "10"], found
    assert all(f.startswith(os.path.join("docs", "example.md") + ":") for f in found), found


def test_markdown_stays_inside_the_repository():
    found, links = [], 0
    for path in markdown_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        links += sum(len(link_targets(line)) for line in text.splitlines())
        found += outside_references(path, text)
    assert links > 20, "found only %d links: is the pattern right?" % links
    assert not found, "\n".join(found)


def variable_rows(doc):
    return {m.group(1): line for line in open(os.path.join(ROOT, doc), encoding="utf-8")
            for m in [re.match(r"^\| `(FERRY_[A-Z_]+)` \|", line)] if m}


def test_variable_tables_match_the_code():
    table = ferry.config()
    for doc in ("README.md", os.path.join("docs", "configuration.md")):
        rows = variable_rows(doc)
        assert sorted(rows) == sorted(r["name"] for r in table), doc
        for r in table:
            line = rows[r["name"]]
            assert r["meaning"] in line and r["default"] in line and r["valid"] in line, (doc, line)
