#!/usr/bin/env python3
"""ferry_agent_bench end to end, each mode run small: the table's rows, the JSON document's fields
(positive, ordered figures where a user reads them), every endpoint of the scale run ready, no child
left behind; and bad options refused with one line on stderr and exit code 2. Nothing asserts a time.

    agent_bench_test.py FERRY_AGENT_BENCH
"""

import json
import os
import subprocess
import sys
import tempfile

TIMEOUT = 180


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(binary, *args, timeout=TIMEOUT):
    cmd = [binary] + list(args)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("%s did not finish within %d s" % (" ".join(cmd), timeout))


def bench(binary, tmp, mode, *args):
    path = os.path.join(tmp, mode + ".json")
    r = run(binary, "--mode", mode, "--json", path, "--timeout", "60", *args)
    if r.returncode != 0:
        fail("%s %s exited with %d:\n%s%s" % (mode, " ".join(args), r.returncode, r.stdout, r.stderr))
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail("%s: no JSON document in %s: %s" % (mode, path, e))
    for key, want in (("ferry_agent_bench", 1), ("mode", mode), ("device", "soft_lo")):
        if doc.get(key) != want:
            fail("%s: field %r is %r, expected %r" % (mode, key, doc.get(key), want))
    return r.stdout, doc


def check_summary(where, s):
    if not isinstance(s, dict):
        fail("%s: no summary" % where)
    if not 0 < s["min"] <= s["median"] <= s["p99"] <= s["max"]:
        fail("%s: figures out of order or not positive: %s" % (where, s))


def check_first_write(binary, tmp):
    table, doc = bench(binary, tmp, "first-write", "--iters", "3")
    measures = ["connect_to_first_write", "connect_to_ready", "write_after_ready", "agent_start"]
    got = [r["measure"] for r in doc["results"]]
    if got != measures:
        fail("first-write: results %s, expected %s" % (got, measures))
    for r in doc["results"]:
        want = 6 if r["measure"] == "agent_start" else 3
        if r["samples"] != want:
            fail("first-write %s: %d samples, expected %d" % (r["measure"], r["samples"], want))
        check_summary("first-write " + r["measure"], r["us"])
        if r["measure"] not in table:
            fail("first-write: no row %r in the table:\n%s" % (r["measure"], table))


def check_overhead(binary, tmp):
    table, doc = bench(binary, tmp, "overhead", "--iters", "256", "--rounds", "2", "--batch", "16")
    if [r["batch"] for r in doc["results"]] != [1, 16]:
        fail("overhead: batches %s, expected [1, 16]" % [r["batch"] for r in doc["results"]])
    for r in doc["results"]:
        for path in ("agent_names", "agent_handles", "endpoint"):
            s = r.get(path + "_us_per_call")
            check_summary("overhead batch %d %s" % (r["batch"], path), s)
            if not s["ratio_to_endpoint"] > 0 or not s["us_per_assignment"] > 0:
                fail("overhead batch %d %s: no ratio or per-assignment figure: %s" % (r["batch"], path, s))
        if r["endpoint_us_per_call"]["ratio_to_endpoint"] != 1.0:
            fail("overhead: the endpoint's ratio to itself is not 1: %s" % r)
    for path in ("agent_names", "agent_handles", "endpoint"):
        if table.count(path) != 2:
            fail("overhead: %r is not in the table once per batch:\n%s" % (path, table))


def check_scale(binary, tmp):
    table, doc = bench(binary, tmp, "scale", "--endpoints", "16", "--procs", "2", "--idle-seconds", "1")
    for key, want in (("endpoints", 16), ("procs", 2), ("ready_ok", 16), ("writes_ok", 16), ("failed", 0), ("writes_failed", 0)):
        if doc.get(key) != want:
            fail("scale: field %r is %r, expected %r" % (key, doc.get(key), want))
    if not 0 < doc["ready_seconds"] <= doc["writes_seconds"]:
        fail("scale: ready %r and writes %r seconds" % (doc["ready_seconds"], doc["writes_seconds"]))
    roles = [p["role"] for p in doc["processes"]]
    if roles != ["store", "serving", "serving", "connecting"]:
        fail("scale: processes %s" % roles)
    if sum(p["agents"] for p in doc["processes"] if p["role"] == "serving") != 16:
        fail("scale: the serving processes do not host 16 agents: %s" % doc["processes"])
    for p in doc["processes"]:
        for key in ("rss_kb_before", "rss_kb_after", "threads_after", "fds_after"):
            if not isinstance(p.get(key), int) or p[key] <= 0:
                fail("scale %s: %r is %r" % (p["role"], key, p.get(key)))
        if not p["idle_cpu_percent"] >= 0:
            fail("scale %s: idle CPU %r" % (p["role"], p["idle_cpu_percent"]))
        # Every child was shut down by the time the program exited.
        if p["role"] != "store" and os.path.exists("/proc/%d" % p["pid"]):
            fail("scale: the %s process %d is still running" % (p["role"], p["pid"]))
    for key in ("memory_kb_per_endpoint", "idle_cpu_percent"):
        if not isinstance(doc.get(key), dict):
            fail("scale: no %r" % key)
    for row in ("memory per endpoint", "idle CPU", "connecting", "serving"):
        if row not in table:
            fail("scale: no %r in the table:\n%s" % (row, table))


def check_bad_options(binary):
    cases = [["--mode", "sideways"], ["--iters", "zero"], ["--size", "16Q"], ["--bogus"], ["--iters"],
             ["--mode", "scale", "--endpoints", "2", "--procs", "4"], ["--idle-seconds", "-1"], ["--heartbeat", "0"], ["extra"]]
    for args in cases:
        r = run(binary, *args, timeout=30)
        if r.returncode != 2:
            fail("%s exited with %d, expected 2" % (args, r.returncode))
        lines = r.stderr.strip().splitlines()
        if len(lines) != 1 or "ferry_agent_bench" not in lines[0]:
            fail("%s: expected one line on stderr, got %r" % (args, r.stderr))
    r = run(binary, "--help", timeout=30)
    if r.returncode != 0 or "--mode" not in r.stdout:
        fail("--help: exit %d, %r" % (r.returncode, r.stdout))


def main():
    binary = sys.argv[1]
    check_bad_options(binary)
    with tempfile.TemporaryDirectory() as tmp:
        check_first_write(binary, tmp)
        check_overhead(binary, tmp)
        check_scale(binary, tmp)
    print("agent bench smoke: every mode and bad input checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
