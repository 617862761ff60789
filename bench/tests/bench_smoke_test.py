#!/usr/bin/env python3
"""ferry bench end to end: every operation in both modes between two processes (--local), checking
what a user reads: the JSON document's fields, positive figures for every requested size, the CPU
time of both sides. (Charts: bench/plot.py, tested in plot_test.py.)

    bench_smoke_test.py FERRY_BINARY
"""

import json
import subprocess
import sys

SWEEP = [8, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def bench(ferry, *args, timeout=240):
    cmd = [ferry, "bench", "--local", "--json", "--timeout", "20"] + list(args)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("%s did not finish within %d s" % (" ".join(cmd), timeout))
    if r.returncode != 0:
        fail("%s exited with %d:\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    try:
        return json.loads(r.stdout)
    except ValueError:
        fail("%s printed no JSON document:\n%s" % (" ".join(cmd), r.stdout))


def check_doc(doc, op, mode, sizes):
    for key, want in (("ferry_bench", 1), ("op", op), ("mode", mode)):
        if doc.get(key) != want:
            fail("%s %s: field %r is %r, expected %r" % (op, mode, key, doc.get(key), want))
    for key in ("client_device", "server_device", "threads", "qps", "depth", "batch", "results"):
        if key not in doc:
            fail("%s %s: no field %r" % (op, mode, key))
    got = [r["size"] for r in doc["results"]]
    if got != sizes:
        fail("%s %s: results for sizes %s, expected %s" % (op, mode, got, sizes))
    for r in doc["results"]:
        where = "%s %s size %d" % (op, mode, r["size"])
        for key in ("iterations", "seconds", "bw_gbps", "msg_rate_mpps", "client_cpu_seconds",
                    "server_cpu_seconds", "client_cpu_percent", "server_cpu_percent"):
            if not isinstance(r.get(key), (int, float)) or not r[key] > 0:
                fail("%s: %r is %r, expected a positive number" % (where, key, r.get(key)))
        # The machine's busy share: absent only when the run was shorter than a clock tick (10 ms
        # where the kernel counts 100 a second), and above zero in a longer one (the run itself).
        busy = r.get("machine_busy_percent")
        if busy is None and r["seconds"] >= 0.1:
            fail("%s: no machine_busy_percent in a run of %.3f s" % (where, r["seconds"]))
        if busy is not None and not (isinstance(busy, (int, float)) and 0 <= busy <= 100):
            fail("%s: machine_busy_percent is %r, expected 0-100" % (where, busy))
        if busy is not None and r["seconds"] >= 0.1 and not busy > 0:
            fail("%s: machine_busy_percent is 0 in a run of %.3f s" % (where, r["seconds"]))
        # Every run warms up for 50 ms at least, however few iterations it asks for (the
        # threads settle on their cores first).
        if not isinstance(r.get("warmup_seconds"), float) or r["warmup_seconds"] < 0.05:
            fail("%s: warmup_seconds is %r, expected at least 0.05" % (where, r.get("warmup_seconds")))
        if mode == "lat":
            lat = r.get("lat_us")
            if not lat:
                fail("%s: no lat_us" % where)
            if not 0 < lat["min"] <= lat["median"] <= lat["p99"] <= lat["max"]:
                fail("%s: latency figures out of order: %s" % (where, lat))


def main():
    ferry = sys.argv[1]
    check_doc(bench(ferry, "--sweep", "--iters", "8"), "write", "bw", SWEEP)
    check_doc(bench(ferry, "--mode", "lat", "--sweep", "--iters", "8"), "write", "lat", SWEEP)
    small = [8, 65536]
    for op in ("read", "send", "write_imm"):
        for mode in ("bw", "lat"):
            check_doc(bench(ferry, "--op", op, "--mode", mode, "--size", "8,64K", "--iters", "50"), op, mode, small)
    for mode in ("bw", "lat"):
        check_doc(bench(ferry, "--op", "atomic", "--mode", mode, "--iters", "50"), "atomic", mode, [8])
    # Several threads and QPs, batches, and a run by time instead of iterations.
    doc = bench(ferry, "--threads", "2", "--qps", "3", "--batch", "4", "--depth", "16", "--size", "4K",
                "--duration", "0.3")
    check_doc(doc, "write", "bw", [4096])
    if (doc["threads"], doc["qps"], doc["batch"], doc["depth"]) != (2, 3, 4, 16):
        fail("the JSON document does not echo the run's shape: %s" % doc)
    # Each path of the software devices between two processes here, chosen by --soft-path.
    for path, value in (("tcp", "0"), ("ring", "ring"), ("same-host", "1")):
        for op in ("write", "send"):
            doc = bench(ferry, "--soft-path", path, "--op", op, "--mode", "lat", "--size", "8,64K", "--iters", "50")
            check_doc(doc, op, "lat", small)
            if doc.get("ferry_soft_same_host") != value:
                fail("--soft-path %s ran with FERRY_SOFT_SAME_HOST=%r" % (path, doc.get("ferry_soft_same_host")))
    # Polling loops that never yield, and ones that yield after every empty poll (--poll-yield).
    for n in (0, 1):
        doc = bench(ferry, "--soft-path", "same-host", "--op", "send", "--mode", "lat", "--size", "8",
                    "--iters", "50", "--poll-yield", str(n))
        check_doc(doc, "send", "lat", [8])
        if doc.get("poll_yield") != n:
            fail("--poll-yield %d ran with poll_yield %r" % (n, doc.get("poll_yield")))
    # The verbs post timed (--call-time): each post is part of its iteration, so the mean post time is
    # positive and at most the mean iteration (a ping-pong's iteration is twice its one-way sample,
    # a READ's is its sample); without the flag there is no call_us.
    for op in ("write", "send", "read"):
        doc = bench(ferry, "--op", op, "--mode", "lat", "--size", "8", "--iters", "200", "--call-time")
        check_doc(doc, op, "lat", [8])
        r = doc["results"][0]
        bound = r["lat_us"]["avg"] * (2 if op != "read" else 1) * 1.0001  # the printed digits' rounding
        if not isinstance(r.get("call_us"), (int, float)) or not 0 < r["call_us"] <= bound:
            fail("--call-time %s: call_us %r, expected a positive mean within the mean iteration's (%s us)"
                 % (op, r.get("call_us"), bound))
    if "call_us" in bench(ferry, "--op", "write", "--mode", "lat", "--size", "8", "--iters", "50")["results"][0]:
        fail("a verbs run without --call-time reports call_us")
    # The event-driven variant (--wait event): both sides sleep on the completion channel.
    for path in ("tcp", "ring", "same-host"):
        for op in ("send", "write_imm", "read", "atomic"):
            sizes = [8] if op == "atomic" else small
            doc = bench(ferry, "--soft-path", path, "--op", op, "--mode", "lat", "--wait", "event",
                        "--size", ",".join(str(s) for s in sizes), "--iters", "50")
            check_doc(doc, op, "lat", sizes)
            if doc.get("wait") != "event":
                fail("--wait event ran with wait %r" % doc.get("wait"))
    # Memory both sides map (--memory shared: ProtectionDomain::allocMr on both sides), on every
    # path; each side checks the bytes the other moved.
    for path in ("tcp", "ring", "same-host"):
        for op in ("write", "read"):
            for mode in ("bw", "lat"):
                doc = bench(ferry, "--memory", "shared", "--soft-path", path, "--op", op, "--mode", mode,
                            "--size", "8,64K,1M", "--iters", "50")
                check_doc(doc, op, mode, [8, 65536, 1 << 20])
                if doc.get("memory") != "shared":
                    fail("--memory shared ran with memory %r" % doc.get("memory"))
    print("bench smoke: all operations and modes, JSON and plots checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
