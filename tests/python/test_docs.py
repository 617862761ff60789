"""The docs stay true: every relative link in the repository's Markdown resolves to a file (or
folder) inside the repository, and the tables of FERRY_* variables in README.md and
docs/configuration.md list exactly what the code's table holds."""

import os
import re

import ferry

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP_DIRS = {".git", ".venv", "node_modules"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files():
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(dirpath, f)


def test_every_relative_link_resolves_inside_the_repository():
    broken, checked = [], 0
    for path in markdown_files():
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            checked += 1
            if not resolved.startswith(ROOT + os.sep) or not os.path.exists(resolved):
                broken.append("%s: %s" % (os.path.relpath(path, ROOT), target))
    assert checked > 20, "found only %d links: is the pattern right?" % checked
    assert not broken, broken


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
