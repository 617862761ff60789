"""One-sided WRITE and READ through an `RDMAEndpoint` (ferry's or DLSlime's) between two processes
on one RDMA device: first verified byte for byte, then timed. For bench/rxe-compare.

ferry's Endpoint API is DLSlime's lowest-level Python surface, so one body drives both libraries:
`RDMAEndpoint(device_name, ib_port, link_type)`, `register_memory_region(name, ptr, 0, length)`,
`endpoint_info()` / `connect()`, `register_remote_memory_region(name, mr_info)`, and `read` /
`write` of a batch of `(mr_key, remote_mr_key, offset, offset, length)` tuples returning a future
with `wait()`. A driver (ferry_endpoint_peer.py, dlslime_peer.py) supplies a `Library`: its name,
how it makes an endpoint and where its tuple puts the local and the remote offset.

The initiator starts the target as a second process of the same interpreter and talks to it over
the target's standard input and output (JSON lines; the target's carry peer_common.PREFIX):

    target -> {"info": endpoint_info}        after registering its region
    init   -> {"info": endpoint_info}        after connecting; the target connects and answers
    target -> {"ok": true}
    init   -> {"cmd": "clear"}               fill the whole region with BACKGROUND
    init   -> {"cmd": "pattern", "seed": S}  fill the whole region with pattern(S)
    init   -> {"cmd": "digest", "length": N} sha256 of region[0:N]
    target -> {"ok": true[, "digest": hex]}  or {"error": ...}

Closing the target's standard input ends it. The initiator prints one line:

    {"peer": NAME, "library": VERSION, "device": DEV, "verified": [...], "results": [...],
     "latency": [...]}   or   {"peer": NAME, "error": "why"}

Verification, per size and operation: one batch of per_call(size) transfers (the count the timed
calls use) at distinct offsets, every transfer a different slice of a random pattern, with a gap of
`size` untouched bytes between them and the local and the remote offsets different; the whole
destination region is then compared with what it must hold (the slices where they belong, the
background everywhere else), so a byte in the wrong place, a short transfer or a transfer that
overran fails it. Timing, per size and operation: calls of per_call(size) transfers that all name
the same two ranges (so no library can merge them), each call waited for, for `--seconds` (at
least 3 calls) after one untimed call; then latency: single `size`-byte transfers, each posted and
waited for, `--lat-iters` times after a tenth as many untimed ones.
"""

import hashlib
import json
import mmap
import os
import queue
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402
import bench_cli  # noqa: E402  (peer_common puts bench/ on the path)

SIZES = [8, 4096, 65536, 1 << 20, 16 << 20]
LAT_SIZES = [8, 4096]
BACKGROUND = 0xA5
# Offsets of the first transfer in the local and the remote region: different, so that a library
# that swaps them places bytes where the check sees them.
LOCAL_BASE = 64
REMOTE_BASE = 320
REPLY_TIMEOUT = 300  # seconds; the VM's CPU is emulated


class Library:
    """What differs between the libraries driven by this module."""

    def __init__(self, name, module, make_endpoint, assignment, version):
        self.name = name  # "ferry" or "dlslime"
        self.module = module  # imported first; a failure is reported as the reason
        self.make_endpoint = make_endpoint  # (args) -> RDMAEndpoint
        self.assignment = assignment  # (op, local, remote, local_offset, remote_offset, length) -> tuple
        self.version = version  # () -> str


def parse_args(prog, argv=None):
    """The driver's options; bad ones end it with one line and exit code 2."""
    p = bench_cli.ArgumentParser(prog=prog)
    p.add_argument("--role", choices=["initiator", "target"], default="initiator")
    p.add_argument("--device", default="rxe0")
    p.add_argument("--link-type", default="RoCE")
    p.add_argument("--sizes", type=bench_cli.sizes_arg(), default=SIZES, help="e.g. 4K,1M,16M")
    p.add_argument("--lat-sizes", type=bench_cli.sizes_arg(), default=LAT_SIZES)
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per size and operation")
    p.add_argument("--lat-iters", type=int, default=200)
    p.add_argument("--region", type=int, default=0, help="target: bytes to register")
    p.add_argument("--dry-run", action="store_true", help="print the settings as JSON and measure nothing")
    args = p.parse_args(argv)
    if not args.seconds > 0:
        p.error("--seconds must be above 0, not %s" % args.seconds)
    if args.lat_iters < 1 or args.region < 0:
        p.error("--lat-iters must be at least 1 and --region not negative")
    if args.region == 0:
        args.region = region_length(args.sizes + args.lat_sizes)
    if args.dry_run:
        print(json.dumps({"role": args.role, "device": args.device, "sizes": args.sizes,
                          "lat_sizes": args.lat_sizes, "seconds": args.seconds, "lat_iters": args.lat_iters,
                          "region": args.region}))
        sys.exit(0)
    return args


def region_length(sizes):
    """Bytes each side registers: room for the verification batch of every size (its transfers sit
    every 2 * size bytes after the larger base offset)."""
    need = max(2 * size * peer_common.per_call(size) for size in sizes)
    return need + 2 * REMOTE_BASE + 4096


def pattern(seed, length):
    return random.Random(seed).randbytes(length)


class Region:
    """Anonymous page-aligned memory, registered by address as both libraries accept it."""

    def __init__(self, length):
        import ctypes
        self.length = length
        self.mem = mmap.mmap(-1, length)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))

    def clear(self):
        self.mem[:] = bytes([BACKGROUND]) * self.length

    def fill(self, seed):
        self.mem[:] = pattern(seed, self.length)


# ---- target ----

def run_target(lib, args):
    ep = lib.make_endpoint(args)
    region = Region(args.region)
    region.clear()
    ep.register_memory_region("target", region.addr, 0, region.length)
    peer_common.emit({"info": ep.endpoint_info()})
    hello = json.loads(sys.stdin.readline())
    ep.connect(hello["info"])
    peer_common.emit({"ok": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "clear":
                region.clear()
                peer_common.emit({"ok": True})
            elif cmd["cmd"] == "pattern":
                region.fill(cmd["seed"])
                peer_common.emit({"ok": True})
            elif cmd["cmd"] == "digest":
                digest = hashlib.sha256(region.mem[:cmd["length"]]).hexdigest()
                peer_common.emit({"ok": True, "digest": digest})
            else:
                peer_common.emit({"error": "unknown command %r" % cmd["cmd"]})
        except Exception as e:
            peer_common.emit({"error": "%s: %s" % (type(e).__name__, e)})
    sys.stdout.flush()
    os._exit(0)


# ---- initiator ----

class Target:
    """The target process and the JSON-line channel to it (one reader thread for its output)."""

    def __init__(self, script, args):
        cmd = [sys.executable, script, "--role", "target", "--device", args.device,
               "--link-type", args.link_type, "--region", str(region_length(args.sizes + args.lat_sizes))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith(peer_common.PREFIX):
                self.lines.put(json.loads(line[len(peer_common.PREFIX):]))
            else:  # the library's own output
                sys.stderr.write("target: " + line)
        self.lines.put(None)

    def receive(self):
        try:
            msg = self.lines.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            raise RuntimeError("the target did not answer within %d s" % REPLY_TIMEOUT)
        if msg is None:
            self.proc.wait()
            raise RuntimeError("the target exited (code %s)" % self.proc.returncode)
        if "error" in msg:
            raise RuntimeError("target: " + msg["error"])
        return msg

    def request(self, msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self.receive()

    def stop(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def log(lib, msg):
    print("%s: %s" % (lib.name, msg), file=sys.stderr, flush=True)


def verify(lib, ep, local, remote, region, target, op, size, seed):
    """One batch of per_call(size) transfers at distinct offsets; returns the number of transfers or
    raises with the first difference."""
    count = peer_common.per_call(size)
    offsets = [(LOCAL_BASE + 2 * size * i, REMOTE_BASE + 2 * size * i) for i in range(count)]
    batch = [lib.assignment(op, local, remote, lo, ro, size) for lo, ro in offsets]
    span = REMOTE_BASE + 2 * size * count
    if op == "write":
        region.fill(seed)
        target.request({"cmd": "clear"})
        ep.write(batch).wait()
        expected = bytearray([BACKGROUND]) * span
        for lo, ro in offsets:
            expected[ro:ro + size] = region.mem[lo:lo + size]
        got = target.request({"cmd": "digest", "length": span})["digest"]
        if got != hashlib.sha256(expected).hexdigest():
            raise AssertionError("WRITE of %d x %d bytes: the target's region does not hold what was "
                                 "written (sha256 of its first %d bytes differs)" % (count, size, span))
    else:
        region.clear()
        target.request({"cmd": "pattern", "seed": seed})
        ep.read(batch).wait()
        source = pattern(seed, region.length)  # what the target filled its region with
        expected = bytearray([BACKGROUND]) * span
        for lo, ro in offsets:
            expected[lo:lo + size] = source[ro:ro + size]
        got = region.mem[:span]
        if got != bytes(expected):
            first = next(i for i in range(span) if got[i] != expected[i])
            raise AssertionError("READ of %d x %d bytes: local byte %d is 0x%02x, expected 0x%02x"
                                 % (count, size, first, got[first], expected[first]))
    return count


def bandwidth(ep, batch, op, seconds):
    """Calls of one batch, each waited for, after one untimed call; (bytes/s factor, calls, s)."""
    call = ep.write if op == "write" else ep.read
    call(batch).wait()
    n = 0
    start = time.perf_counter()
    while True:
        call(batch).wait()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            return n, elapsed


def latency(ep, one, op, iters):
    call = ep.write if op == "write" else ep.read
    for _ in range(max(1, iters // 10)):
        call(one).wait()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call(one).wait()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return {"min": samples[0], "median": samples[len(samples) // 2],
            "p99": samples[min(len(samples) - 1, (len(samples) * 99 + 99) // 100 - 1)],
            "avg": sum(samples) / len(samples)}


def measure(lib, args, script):
    ep = lib.make_endpoint(args)
    region = Region(region_length(args.sizes + args.lat_sizes))
    local = ep.register_memory_region("initiator", region.addr, 0, region.length)
    target = Target(script, args)
    try:
        info = target.receive()["info"]
        remote = ep.register_remote_memory_region("target", info["mr_info"]["target"])
        ep.connect(info)
        target.request({"info": ep.endpoint_info()})
        log(lib, "connected on %s; verifying" % args.device)

        verified = []
        for i, size in enumerate(sorted(set(args.sizes + args.lat_sizes))):
            for op in ("write", "read"):
                count = verify(lib, ep, local, remote, region, target, op, size, seed=1000 * i + len(op))
                verified.append({"op": op, "size": size, "transfers": count})
        log(lib, "verified: WRITE and READ at %s bytes" % ",".join(str(s) for s in sorted(set(args.sizes))))

        results = []
        for size in args.sizes:
            k = peer_common.per_call(size)
            row = {"size": size, "per_call": k}
            for op in ("write", "read"):
                batch = [lib.assignment(op, local, remote, 0, 0, size)] * k
                calls, seconds = bandwidth(ep, batch, op, args.seconds)
                row[op + "_gbps"] = size * k * calls / seconds / 1e9
                row[op + "_calls"] = calls
                row[op + "_seconds"] = seconds
            log(lib, "%d B: WRITE %.4g GB/s, READ %.4g GB/s" % (size, row["write_gbps"], row["read_gbps"]))
            results.append(row)

        lat = []
        for size in args.lat_sizes:
            for op in ("write", "read"):
                one = [lib.assignment(op, local, remote, 0, 0, size)]
                us = latency(ep, one, op, args.lat_iters)
                lat.append({"op": op, "size": size, "iterations": args.lat_iters, "us": us})
                log(lib, "%d B %s latency: median %.1f us" % (size, op.upper(), us["median"]))
        return {"peer": lib.name, "library": lib.version(), "device": args.device,
                "verified": verified, "results": results, "latency": lat}
    finally:
        target.stop()


def main(lib, script):
    args = parse_args("bench/peers/" + os.path.basename(script))
    try:
        __import__(lib.module)
    except Exception as e:
        peer_common.emit({"peer": lib.name, "error": "cannot import %s: %s" % (lib.module, e)})
        return 1
    if args.role == "target":
        try:
            run_target(lib, args)
        except Exception as e:
            peer_common.emit({"error": "%s: %s" % (type(e).__name__, e)})
            return 1
        return 0
    try:
        peer_common.emit(measure(lib, args, os.path.abspath(script)))
        code = 0
    except Exception as e:  # report the reason, never hang the comparison
        peer_common.emit({"peer": lib.name, "error": "%s: %s" % (type(e).__name__, e)})
        code = 1
    # Leave without running the libraries' destructors: the results are out.
    sys.stderr.flush()
    os._exit(code)
