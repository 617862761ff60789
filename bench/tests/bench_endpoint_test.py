#!/usr/bin/env python3
"""ferry bench --api endpoint end to end, and its Python client (bench/endpoint_client.py): every
operation in both modes between two processes (--local), checking what a user reads: the JSON
document's fields, positive figures for every size, operations x batch assignments, and the bytes
each run moved checked on the side they landed on. Nothing asserts a time; bad input is in
bench_bad_input_test.py.

    bench_endpoint_test.py FERRY_BINARY [--python]

--python also runs the Python client (`import ferry` must work: PYTHONPATH=build/python).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(os.path.dirname(HERE), "endpoint_client.py")
OPS = ("write", "read", "write_imm", "send")
FAILURES = []


def check(name, cond, detail):
    if not cond:
        FAILURES.append("%s: %s" % (name, detail))
    return cond


def run(cmd, timeout=180):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None


def document(name, cmd):
    r = run(cmd)
    if not check(name, r is not None, "did not finish"):
        return None
    if not check(name, r.returncode == 0, "exit code %d:\n%s" % (r.returncode, r.stderr[-2000:])):
        return None
    try:
        return json.loads(r.stdout)
    except ValueError:
        check(name, False, "printed no JSON document: %r" % r.stdout[:300])
        return None


def check_doc(name, doc, language, op, mode, batch, sizes, iters):
    if doc is None:
        return
    for key, want in (("ferry_bench", 1), ("api", "endpoint"), ("language", language), ("op", op),
                      ("mode", mode), ("batch", batch), ("threads", 1)):
        check(name, doc.get(key) == want, "field %r is %r, expected %r" % (key, doc.get(key), want))
    check(name, doc.get("latency_kind") == ("none" if mode == "bw" else "post_to_completion"),
          "latency_kind %r" % doc.get("latency_kind"))
    got = [r["size"] for r in doc.get("results", [])]
    if not check(name, got == sizes, "results for sizes %s, expected %s" % (got, sizes)):
        return
    for r in doc["results"]:
        where = "%s size %d" % (name, r["size"])
        for key in ("seconds", "bw_gbps", "msg_rate_mpps", "us_per_message", "call_us", "client_cpu_seconds"):
            check(where, isinstance(r.get(key), (int, float)) and r[key] > 0,
                  "%r is %r, expected a positive number" % (key, r.get(key)))
        if iters:
            check(where, r["iterations"] == iters, "%d operations, expected %d" % (r["iterations"], iters))
            check(where, r["messages"] == iters * batch,
                  "%d assignments, expected %d x %d" % (r["messages"], iters, batch))
        # The bytes of the run, checked where they landed: the server for write, write_imm and send
        # (a send's message is `batch` chunks), the client for read.
        landed = r["size"] * (batch if op == "send" else 1)
        check(where, r.get("verified_bytes") == landed, "verified_bytes %r, expected %d" % (r.get("verified_bytes"),
                                                                                           landed))
        if mode == "lat":
            lat = r.get("lat_us") or {}
            check(where, 0 < lat.get("min", 0) <= lat.get("median", 0) <= lat.get("p99", 0) <= lat.get("max", 0),
                  "latency figures missing or out of order: %s" % lat)


def smoke(ferry, python):
    sizes = [8, 4096]
    for op in OPS:
        for mode in ("bw", "lat"):
            args = ["--local", "--json", "--timeout", "20", "--op", op, "--mode", mode, "--size", "8,4K",
                    "--batch", "4", "--iters", "40"]
            name = "ferry bench --api endpoint --op %s --mode %s" % (op, mode)
            check_doc(name, document(name, [ferry, "bench", "--api", "endpoint"] + args), "c++", op, mode, 4, sizes,
                      40)
            if python:
                name = "endpoint_client.py --op %s --mode %s" % (op, mode)
                check_doc(name, document(name, [sys.executable, CLIENT, "--ferry", ferry] + args), "python", op, mode,
                          4, sizes, 40)
    # Buffers the pool allocates (--memory shared): memory both sides map.
    for op in OPS:
        args = ["--local", "--json", "--timeout", "20", "--op", op, "--mode", "bw", "--size", "8,4K", "--batch", "4",
                "--iters", "40", "--memory", "shared"]
        name = "ferry bench --api endpoint --op %s --memory shared" % op
        doc = document(name, [ferry, "bench", "--api", "endpoint"] + args)
        check_doc(name, doc, "c++", op, "bw", 4, sizes, 40)
        if doc:
            check(name, doc.get("memory") == "shared", "memory %r" % doc.get("memory"))
    # Several queue pairs, a run by time, a batch striped over them, and the batch forms of Python.
    args = ["--local", "--json", "--timeout", "20", "--qps", "3", "--depth", "8", "--batch", "5", "--size", "64K",
            "--duration", "0.2"]
    name = "ferry bench --api endpoint --qps 3 --duration 0.2"
    doc = document(name, [ferry, "bench", "--api", "endpoint"] + args)
    check_doc(name, doc, "c++", "write", "bw", 5, [65536], None)
    if doc:
        check(name, (doc["qps"], doc["depth"]) == (3, 8), "the document does not echo the shape: %s" % doc)
    if python:
        for form in ("numpy", "assignment"):
            name = "endpoint_client.py --form %s --op read" % form
            doc = document(name, [sys.executable, CLIENT, "--ferry", ferry, "--form", form, "--op", "read"] + args)
            check_doc(name, doc, "python", "read", "bw", 5, [65536], None)
            if doc:
                check(name, doc.get("form") == form, "form %r" % doc.get("form"))


def main():
    ferry = os.path.abspath(sys.argv[1])
    python = "--python" in sys.argv[2:]
    smoke(ferry, python)
    for f in FAILURES:
        print("FAIL: " + f)
    if FAILURES:
        print("bench endpoint: %d checks failed" % len(FAILURES))
        return 1
    print("bench endpoint: every operation and mode measured and verified%s"
          % (", from C++ and Python" if python else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
