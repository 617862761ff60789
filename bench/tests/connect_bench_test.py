#!/usr/bin/env python3
"""Smoke test of bench/connect_bench.py: two small sizes with every operation's bytes checked, the
JSON document's fields, and bad options refused with exit code 2. Nothing asserts a time."""

import json
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "connect_bench.py")


def run(*args):
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=240)


def main():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "connect.json")
        r = run("--sizes", "4K,1M", "--rounds", "2", "--ops", "5", "--check", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split()[:3] == ["size", "ops", "connector_us"], lines[0]
        assert [l.split()[0] for l in lines[1:]] == ["4K", "1M"], r.stdout
        doc = json.load(open(out))
        assert doc["bench"] == "connect" and len(doc["rows"]) == 2, doc
        for row, size in zip(doc["rows"], (4096, 1 << 20)):
            assert row["size"] == size and row["ops"] >= 4, row
            for key in ("connector_us", "endpoint_us", "connector_gbps", "endpoint_gbps", "ratio"):
                assert row[key] > 0, (key, row)
    for bad in (["--sizes", "0"], ["--sizes", "x"], ["--rounds", "0"], ["--ops", "-1"]):
        r = run(*bad)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
        assert "error" in r.stderr, r.stderr
    print("connect bench smoke: sizes, bytes, JSON and bad options checked")


if __name__ == "__main__":
    main()
