#!/usr/bin/env python3
"""Smoke test of bench/gpu_bench.py's harness, on host memory (--device cpu): the rows and their
ratios, the JSON document, --check finding bytes that did not arrive, the cuda mode's skip without
a usable driver (and its failure under FERRY_REQUIRE_CUDA=1), and bad options refused with exit
code 2. Nothing asserts a time."""

import json
import os
import subprocess
import sys
import tempfile

BENCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BENCH = os.path.join(BENCH_DIR, "gpu_bench.py")
SIZES = [4096, 65536, 1 << 20]  # --quick's
LABELS = ["4K", "64K", "1M"]
# (path, op, reference) of each printed line, in order, for each size.
LINES = [("dev->dev", "write", "dev-copy"), ("dev->dev", "read", "dev-copy"),
         ("dev->host", "write", "host->host write"), ("dev->host", "write", "d2h-copy"),
         ("dev->host", "read", "host->host read"), ("dev->host", "read", "d2h-copy")]
MEASUREMENTS = {"dev->dev write", "dev->dev read", "dev->host write", "dev->host read", "host->host write",
                "host->host read", "dev-copy", "d2h-copy"}
NO_DRIVER = "/nonexistent/libcuda.so.1"


def run(*args, **env):
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def check_table(stdout):
    lines = stdout.splitlines()
    assert lines[0].startswith("# memory: host memory in place of device memory"), lines[0]
    assert lines[1].split() == ["size", "path", "op", "ops", "ferry_GB/s", "reference", "ref_GB/s", "ratio"], lines[1]
    rows = lines[2:-1]
    assert len(rows) == len(SIZES) * len(LINES), stdout
    for i, line in enumerate(rows):
        f = line.split()
        path, op, ref = LINES[i % len(LINES)]
        assert f[:3] == [LABELS[i // len(LINES)], path, op] and " ".join(f[5:-2]) == ref, line
        gbps, ref_gbps, ratio = float(f[4]), float(f[-2]), float(f[-1])
        assert gbps > 0 and ref_gbps > 0 and abs(ratio - gbps / ref_gbps) <= 0.002 + 0.002 * ratio, line
    assert lines[-1].startswith("gpu bench: 18 figures at 3 size(s), "), lines[-1]


def check_document(doc):
    assert (doc["bench"], doc["device"], doc["sizes"], doc["rounds"], doc["check"]) == (
        "gpu", "cpu", SIZES, 1, True), doc
    assert doc["pid"] > 0 and doc["peer_pid"] > 0 and doc["pid"] != doc["peer_pid"], doc
    # Each measurement's landing is checked after its warm-up operation and after each round.
    assert doc["checked_bytes"] == len(MEASUREMENTS) * 2 * sum(SIZES), doc["checked_bytes"]
    assert {(m["size"], m["name"]) for m in doc["measurements"]} == {(s, n) for s in SIZES for n in MEASUREMENTS}
    for m in doc["measurements"]:
        assert m["ops"] >= 3 and len(m["round_gbps"]) == 1 and m["gbps"] == m["round_gbps"][0] > 0, m
    gbps = {(m["size"], m["name"]): m["gbps"] for m in doc["measurements"]}
    assert len(doc["rows"]) == len(SIZES) * len(LINES), doc["rows"]
    for row in doc["rows"]:
        assert row["gbps"] == gbps[row["size"], "%s %s" % (row["path"], row["op"])], row
        assert row["reference_gbps"] == gbps[row["size"], row["reference"]], row
        assert row["ratio"] == row["gbps"] / row["reference_gbps"], row


# --check must notice bytes that did not arrive: this runs the bench with a transfer that, after
# its timed operations, spoils what landed (READ: a byte of the local landing flipped; WRITE: a
# second WRITE from the wrong source region).
SPOILED = r"""
import sys
sys.path.insert(0, sys.argv[1])
sys.argv = [sys.argv[1] + "/gpu_bench.py"] + sys.argv[2:]
import gpu_bench
timed = gpu_bench.Transfer.timed
def spoiled(self, n, ops):
    seconds = timed(self, n, ops)
    if self.name == "dev->dev read":
        self.local.buf[n - 1] ^= 0x5a
    if self.name == "dev->host write":
        host = self.bench.regions["host"]
        self.call([(host.handle, self.remote_handle, 0, 0, n)], None).wait(30)
    return seconds
gpu_bench.Transfer.timed = spoiled
sys.exit(gpu_bench.main())
"""


def check_spoiled_bytes_fail():
    r = subprocess.run([sys.executable, "-c", SPOILED, BENCH_DIR, "--device", "cpu", "--quick", "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    want = "dev->dev read of 4096 bytes: what landed in this process's dev_in differs from its source"
    assert want in r.stderr, r.stderr
    # Without the read's fault the write's is found: the peer's digest of its landing.
    r = subprocess.run([sys.executable, "-c", SPOILED.replace('"dev->dev read"', '"none"'), BENCH_DIR,
                        "--device", "cpu", "--quick", "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    want = "dev->host write of 4096 bytes: what landed in the peer's host_in differs from its source"
    assert want in r.stderr, r.stderr


def check_cuda_mode_without_a_driver():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "skipped.json")
        r = run("--quick", "--json", out, FERRY_CUDA_LIBRARY=NO_DRIVER, FERRY_REQUIRE_CUDA="0")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert r.stdout.startswith("skipped: ferry finds no usable CUDA driver: cannot load " + NO_DRIVER), r.stdout
        assert len(r.stdout.splitlines()) == 1, r.stdout
        assert json.load(open(out))["skipped"] == r.stdout[len("skipped: "):].strip()
    r = run("--quick", FERRY_CUDA_LIBRARY=NO_DRIVER, FERRY_REQUIRE_CUDA="1")
    assert r.returncode == 1 and "skipped" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "FERRY_REQUIRE_CUDA=1 and the cuda mode cannot run: ferry finds no usable CUDA driver" in r.stderr, r.stderr


def main():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gpu.json")
        r = run("--device", "cpu", "--quick", "--check", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        check_table(r.stdout)
        check_document(json.load(open(out)))
    check_spoiled_bytes_fail()
    check_cuda_mode_without_a_driver()
    for bad, why in ((["--sizes", "3X"], "bad size '3X'"), (["--sizes", "0"], "sizes start at 1 byte"),
                     (["--rounds", "0"], "--rounds must be at least 1"), (["--ops", "0"], "--ops must be at least 1"),
                     (["--device", "gpu"], "invalid choice: 'gpu'"), (["--nope"], "unrecognized arguments")):
        r = run(*bad, "--device", "cpu") if bad[0] != "--device" else run(*bad)
        assert r.returncode == 2, (bad, r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith("bench/gpu_bench.py: error: ") and why in r.stderr, (bad, r.stderr)
        assert r.stdout == "", (bad, r.stdout)
    print("gpu bench smoke: rows, ratios, JSON, checked bytes, the cuda skip and bad options checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
