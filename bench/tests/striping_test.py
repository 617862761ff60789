#!/usr/bin/env python3
"""bench/striping end to end: its settings (--dry-run), bad arguments refused on one line with exit
code 2 and no namespace made, and, as root, a short run across two network namespaces that must
print positive figures of iperf3 and of ferry's WRITE and READ with the stripe off and on, write its
JSON document and leave no namespace or process behind, also when it is ended by SIGTERM midway.

    striping_test.py FERRY_BINARY

Exit 77 (skipped) where the run cannot be made: not root, no iproute2, no iperf3, no link between
namespaces.
"""

import glob
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "striping")
MiB = 1 << 20


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, timeout=60, env=None):
    cmd = [sys.executable, SCRIPT] + args
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("%s did not finish within %d s" % (" ".join(cmd), timeout))


def namespaces():
    if not shutil.which("ip"):
        return None
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return sorted(line.split()[0] for line in r.stdout.splitlines() if line.strip())


def leftovers(tag, netns_inodes=(), server_addr=None):
    """Pids of processes the run left: those naming its namespaces (impair.py), those still in them,
    and the servers it started on the link's address."""
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.split("/")[2])
        if pid == os.getpid():
            continue
        try:
            with open(d + "/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            net = os.readlink(d + "/ns/net")
        except OSError:
            continue
        if tag in cmd or net in ["net:[%d]" % i for i in netns_inodes] or \
                (server_addr and server_addr in cmd and ("--server" in cmd or "iperf3" in cmd)):
            pids.append((pid, cmd.strip()))
    return pids


def check_dry_run(build_dir):
    r = run(["--build-dir", build_dir, "--dry-run"])
    if r.returncode != 0:
        fail("--dry-run exited %d: %s" % (r.returncode, r.stderr))
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        fail("--dry-run printed no JSON document: %r" % r.stdout)
    want = {"sizes": [MiB, 16 * MiB, 64 * MiB], "seconds": 10.0, "loss": 0.02, "delay_ms": 10.0, "streams": 2,
            "rounds": 1, "no_install": False, "build_dir": os.path.abspath(build_dir),
            "ferry": os.path.join(os.path.abspath(build_dir), "ferry")}
    for key, value in want.items():
        if doc.get(key) != value:
            fail("--dry-run: %r is %r, expected %r" % (key, doc.get(key), value))
    if not doc.get("out", "").endswith(os.path.join("bench", "results")):
        fail("--dry-run: out is %r, expected bench/results" % doc.get("out"))
    # The build tree comes from FERRY_BUILD_DIR when --build-dir is not given.
    r = run(["--dry-run", "--seconds", "2.5", "--sizes", "4K,1M", "--rounds", "3"],
            env=dict(os.environ, FERRY_BUILD_DIR="/nowhere/build"))
    doc = json.loads(r.stdout)
    if (doc["build_dir"], doc["seconds"], doc["sizes"], doc["rounds"]) != ("/nowhere/build", 2.5, [4096, MiB], 3):
        fail("--dry-run does not echo its settings: %s" % doc)


def check_bad_arguments(build_dir):
    before = namespaces()
    # Were an argument taken, the run would be short (and would fail this test by exiting 0).
    base = ["--build-dir", build_dir, "--no-install", "--seconds", "1", "--sizes", "1M"]
    for args, word in ((["--seconds", "0"], "--seconds"), (["--seconds", "-1"], "--seconds"),
                       (["--seconds", "nan"], "--seconds"), (["--loss", "1"], "--loss"),
                       (["--loss", "-0.01"], "--loss"), (["--loss", "x"], "--loss"),
                       (["--delay-ms", "-5"], "--delay-ms"), (["--sizes", "1X"], "bad size"),
                       (["--sizes", "0"], "bad size"), (["--sizes", "1M,,2M"], "bad size"),
                       (["--streams", "1"], "--streams"), (["--streams", "0"], "--streams"),
                       (["--rounds", "0"], "--rounds"), (["--rounds", "-2"], "--rounds"),
                       (["--what"], "unrecognized")):
        r = run(base + args, timeout=120)
        name = " ".join(args)
        if r.returncode != 2:
            fail("%s: exit code %d, expected 2 (stderr %r)" % (name, r.returncode, r.stderr))
        lines = r.stderr.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("bench/striping: error:") or word not in lines[0]:
            fail("%s: expected one line 'bench/striping: error: ...' naming %r, got %r" % (name, word, r.stderr))
        if r.stdout:
            fail("%s: printed %r on stdout" % (name, r.stdout))
    if namespaces() != before:
        fail("bad arguments left network namespaces: %s, before %s" % (namespaces(), before))


def number(text):
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v > 0 else None


def check_run(build_dir, out_dir):
    before = namespaces()
    r = run(["--build-dir", build_dir, "--no-install", "--seconds", "1", "--sizes", "1M", "--loss", "0.01",
             "--delay-ms", "2", "--out", out_dir], timeout=240)
    if r.returncode == 77:
        print(r.stdout.strip())
        print("SKIP: bench/striping cannot make its link here")
        sys.exit(77)
    if r.returncode != 0:
        fail("the run exited %d:\n%s\n%s" % (r.returncode, r.stdout, r.stderr))
    text = r.stdout
    if "Not measured" in text:
        fail("some run failed:\n" + text)
    m = re.search(r"iperf3 across the link.*: one stream (\S+), 2 streams \(-P 2\) (\S+),", text)
    if not m or not number(m.group(1)) or not number(m.group(2).rstrip(",")):
        fail("no positive iperf3 figures of one and two streams in:\n" + text)
    for op in ("WRITE", "READ"):
        m = re.search(r"^ferry %s across the link.*\n\s+size\s+stripe-off\s+stripe-on\s+on/off\s+off/iperf3x1\s+"
                      r"on/iperf3x1\s+off/iperf3x2\s+on/iperf3x2\n\s+1M\s+(.*)$" % op, text, re.M)
        if not m:
            fail("no %s table with a 1M row in:\n%s" % (op, text))
        cells = m.group(1).split()
        if len(cells) != 7 or not all(number(c) for c in cells):
            fail("%s 1M row: expected 7 positive figures (stripe off, on, and ratios), got %r" % (op, cells))
    files = glob.glob(os.path.join(out_dir, "striping-*.json"))
    if len(files) != 1 or not re.search(r"striping-\d{8}-\d{6}\.json$", files[0]):
        fail("expected one striping-YYYYMMDD-HHMMSS.json in %s, found %s" % (out_dir, files))
    with open(files[0]) as f:
        doc = json.load(f)
    s = doc["settings"]
    if (s["seconds"], s["sizes"], s["loss"], s["delay_ms"], s["streams"]) != (1.0, [MiB], 0.01, 2.0, 2):
        fail("the JSON document's settings are %s" % s)
    if doc["link"].get("kind") not in ("netem", "impair"):
        fail("the JSON document does not say which link it used: %s" % doc["link"])
    runs = doc["rounds"][0]["runs"]
    for name in ("iperf3_1", "iperf3_n", "ferry_write_stripe0", "ferry_write_stripe1", "ferry_read_stripe0",
                 "ferry_read_stripe1"):
        rec = runs.get(name)
        if not rec:
            fail("the JSON document has no run %s" % name)
        figures = [rec.get("gbps")] if name.startswith("iperf3") else [x.get("gbps") for x in rec["sizes"]]
        if not figures or not all(isinstance(g, float) and g > 0 for g in figures):
            fail("%s: figures %s, expected positive GB/s" % (name, figures))
        if name.startswith("ferry"):
            bench = rec["sizes"][0]["bench"]
            stripe = name[-1]
            if bench.get("ferry_soft_same_host") != "0" or bench.get("ferry_soft_tcp_stripe") != stripe:
                fail("%s ran with FERRY_SOFT_SAME_HOST=%s FERRY_SOFT_TCP_STRIPE=%s" % (
                    name, bench.get("ferry_soft_same_host"), bench.get("ferry_soft_tcp_stripe")))
            devices = ["soft_" + d for d in doc["link"]["devices"]]
            if [bench.get("client_device"), bench.get("server_device")] != devices:
                fail("%s ran between %s and %s, not the link's devices %s" % (
                    name, bench.get("client_device"), bench.get("server_device"), devices))
    ns = doc["link"]["namespaces"]
    if namespaces() != before or set(ns) & set(namespaces() or []):
        fail("the run left network namespaces: %s (before: %s)" % (namespaces(), before))
    left = leftovers(ns[0][:-2], server_addr=doc["link"]["addresses"][1])
    if left:
        fail("the run left processes: %s" % left)
    return doc


def check_interrupted(build_dir, out_dir):
    """SIGTERM while the runs go on: the namespaces and every process of the run go with it."""
    before = namespaces()
    cmd = [sys.executable, SCRIPT, "--build-dir", build_dir, "--no-install", "--seconds", "2", "--sizes", "1M",
           "--delay-ms", "2", "--out", out_dir]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    err = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and p.poll() is None:
        ready, _, _ = select.select([p.stderr], [], [], 1)
        line = p.stderr.readline() if ready else ""
        err.append(line)
        if "ferry bench --op write" in line:
            break
    time.sleep(1)  # into the first ferry run: its server and client are up
    tag = "ferry_striping_%d" % p.pid
    inodes = []
    for suffix in ("_a", "_b"):
        try:
            inodes.append(os.stat("/var/run/netns/" + tag + suffix).st_ino)
        except OSError:
            pass
    if len(inodes) != 2 or p.poll() is not None:
        p.kill()
        p.wait()
        fail("no namespaces %s_a and _b while the run went on (stderr: %s)" % (tag, "".join(err)))
    p.send_signal(signal.SIGTERM)
    try:
        _, rest = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        fail("bench/striping did not end within 60 s of SIGTERM")
    if p.returncode != 128 + signal.SIGTERM:
        fail("after SIGTERM bench/striping exited %d, expected %d: %s" % (p.returncode, 128 + signal.SIGTERM,
                                                                         "".join(err) + rest))
    if namespaces() != before:
        fail("SIGTERM left network namespaces: %s (before: %s)" % (namespaces(), before))
    left = leftovers(tag, inodes)
    if left:
        fail("SIGTERM left processes in the run's namespaces: %s" % left)
    if glob.glob(os.path.join(out_dir, "striping-*.json")):
        fail("an interrupted run wrote a JSON document")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    build_dir = os.path.dirname(os.path.abspath(sys.argv[1]))
    check_dry_run(build_dir)
    check_bad_arguments(build_dir)
    print("bench striping: --dry-run and bad arguments checked")
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("SKIP: the run across network namespaces needs root and iproute2")
        return 77
    if not shutil.which("iperf3"):
        print("SKIP: the run needs iperf3 (apt-get install iperf3), which this test does not install")
        return 77
    with tempfile.TemporaryDirectory(prefix="ferry-striping-") as out:
        doc = check_run(build_dir, out)
    print(doc["report"])
    with tempfile.TemporaryDirectory(prefix="ferry-striping-") as out:
        check_interrupted(build_dir, out)
    print("bench striping: settings, bad arguments, a run across namespaces and its cleanup checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
