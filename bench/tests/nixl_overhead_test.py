#!/usr/bin/env python3
"""Smoke test of bench/nixl_overhead.py: one small round, its table and JSON document, and bad
options refused with exit code 2. Nothing asserts a time."""

import json
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nixl_overhead.py")


def run(*args):
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=120)


def main():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "overhead.json")
        r = run("--size", "4K", "--rounds", "2", "--ops", "50", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["size", "nixl_us", "engine_us", "added_us"], lines
        assert lines[1].split()[0] == "4K", lines
        doc = json.load(open(out))
        assert doc["bench"] == "nixl_overhead" and len(doc["rows"]) == 1, doc
        row = doc["rows"][0]
        assert row["size"] == 4096 and row["ops"] == 50 and row["rounds"] == 2, row
        assert row["nixl_us"] > 0 and row["engine_us"] > 0, row
        assert abs(row["added_us"] - (row["nixl_us"] - row["engine_us"])) < 1e-9, row
    for bad in (["--rounds", "0"], ["--size", "0"], ["--size", "1T"], ["--nope"]):
        r = run(*bad)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
        assert "nixl_overhead.py" in r.stderr, (bad, r.stderr)
    print("nixl overhead bench smoke: table, JSON and bad options checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
