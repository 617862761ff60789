#!/usr/bin/env python3
"""ferry's Endpoint API on GPU memory between two processes of this host, each figure next to the
copy it is measured against in the same run.

This process (the initiator) and a peer process it starts (this script with --serve) each hold four
regions of the largest size: "dev" and "dev_in" in device memory (CUDA tensors, registered by
address and length), "host" and "host_in" in host memory (NumPy arrays); "dev" and "host" hold a
pattern of their own, the "_in" regions are where bytes land. The two exchange endpoint_info() over
the peer's stdin and stdout, and for each size the initiator measures, in rounds:

  dev->dev   write  this process's "dev" into the peer's "dev_in"     reference: dev-copy
             read   the peer's "dev" into this process's "dev_in"     reference: dev-copy
  dev->host  write  this process's "dev" into the peer's "host_in"    references: host->host, d2h-copy
             read   the peer's "dev" into this process's "host_in"    references: host->host, d2h-copy
  host->host write and read between the "host" and "host_in" regions (the same transfer without a GPU)
  dev-copy   "dev" into "dev_in" on the device (torch: dst.copy_(src), synchronized)
  d2h-copy   "dev" into pinned host memory (torch: pinned.copy_(dev), synchronized: the PCIe copy)

Every operation is one transfer, waited for before the next (a Future's wait(), or the copy and
torch.cuda.synchronize()). A round's figure is bytes / wall time of its operations, in GB/s
(10^9 B/s); each printed figure is the median of --rounds rounds, and each ferry figure is printed
once per reference with its ratio (ferry / reference). Nothing is asserted about times.

    PYTHONPATH=build/python python3 bench/gpu_bench.py [--sizes 4K,64K,1M,16M,64M,256M] [--rounds 3]
        [--ops 100] [--device cuda|cpu] [--check] [--quick] [--json FILE] [--nic NAME] [--dry-run]

--device cpu runs the same harness with host memory in place of device memory (a check of the
harness on a machine without a GPU). --device cuda (the default) without a usable GPU (no usable
CUDA driver, no torch, or a torch that sees no CUDA device) prints "skipped: WHY" and exits 0, or
with FERRY_REQUIRE_CUDA=1 names the reason and exits 1. --check clears each landing region before
each round and compares its SHA-256 with the source's after it. --quick is --sizes 4K,64K,1M
--rounds 1 --ops 10 unless those are given. Exit codes: 0 done (or skipped), 1 a failure, 2 a bad
option.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on small machines

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cli import ArgumentParser, format_size as label, sizes_arg  # noqa: E402

PROG = "bench/gpu_bench.py"
DEFAULT_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20]
ROUND_BYTES = 64 << 20  # a round moves about this much per figure: at most --ops operations, at least 3
TIMEOUT = 120.0  # seconds for one transfer, or for the peer to answer
# The patterns of the source regions: each process's "dev" and "host" differ, so a transfer from
# the wrong region fails --check.
SEEDS = {("initiator", "dev"): 1, ("initiator", "host"): 2, ("peer", "dev"): 3, ("peer", "host"): 4}
# (path, op, local region, remote region): a write moves local into remote, a read remote into local.
TRANSFERS = [
    ("dev->dev", "write", "dev", "dev_in"),
    ("dev->dev", "read", "dev_in", "dev"),
    ("dev->host", "write", "dev", "host_in"),
    ("dev->host", "read", "host_in", "dev"),
    ("host->host", "write", "host", "host_in"),
    ("host->host", "read", "host_in", "host"),
]
# What each path's figures are printed against: a measurement's name ("{op}" is the row's op).
REFERENCES = {"dev->dev": ["dev-copy"], "dev->host": ["host->host {op}", "d2h-copy"]}

np = ferry = None  # imported by load_ferry() once the options are known to be good


def load_ferry():
    global np, ferry
    import numpy as np
    import ferry
    import ferry._core  # noqa: F401  (ferry._core.cuda(): the driver as ferry sees it)


def pattern(seed, n):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def sha256(array):
    return hashlib.sha256(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()


def ops_for(size, most):
    return min(most, max(3, ROUND_BYTES // size))


# ---- memory: where a region lives, and the copies and checks on it ----

class HostMemory:
    """Host memory (NumPy): the host regions, and the device regions of --device cpu."""

    where = "host"

    def alloc(self, n):
        return np.zeros(n, np.uint8)

    def alloc_pinned(self, n):  # the d2h-copy's destination
        return np.zeros(n, np.uint8)

    def address(self, buf):
        return buf.ctypes.data

    def fill(self, buf, seed):
        buf[:] = pattern(seed, buf.size)

    def clear(self, view):
        view.fill(0)

    def copy(self, dst, src):
        np.copyto(dst, src)

    def sync(self):
        pass

    def digest(self, view):
        return sha256(view)


class CudaMemory:
    """CUDA device memory by torch, on torch's current device; every copy is synchronized."""

    def __init__(self, torch):
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.where = "cuda:%d" % self.device.index

    def alloc(self, n):
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.device)

    def alloc_pinned(self, n):
        return self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)

    def address(self, buf):
        return buf.data_ptr()

    def fill(self, buf, seed):
        buf.copy_(self.torch.from_numpy(pattern(seed, buf.numel())))
        self.sync()

    def clear(self, view):
        view.zero_()
        self.sync()

    def copy(self, dst, src):
        dst.copy_(src)
        self.sync()

    def sync(self):
        self.torch.cuda.synchronize(self.device)

    def digest(self, view):
        return sha256(view.cpu().numpy())


def why_no_cuda():
    """None where the cuda mode can run, else why not."""
    driver = ferry._core.cuda()
    if not driver["usable"]:
        return "ferry finds no usable CUDA driver: " + driver["reason"]
    try:
        import torch
    except (ImportError, OSError) as e:
        return "torch cannot be imported (%s)" % e
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "CUDA %s" % torch.version.cuda
        return "torch %s (%s) sees no CUDA device" % (torch.__version__, build)
    return None


def device_memory(kind):
    if kind == "cpu":
        return HostMemory()
    import torch  # only here: --device cpu needs no torch
    return CudaMemory(torch)


class Region:
    """One registered region: its memory, its buffer and its handle."""

    def __init__(self, ep, name, memory, size, seed):
        self.name, self.memory = name, memory
        self.buf = memory.alloc(size)
        if seed is not None:
            memory.fill(self.buf, seed)
        if name.startswith("host"):  # a NumPy array, registered as the buffer it is
            self.handle = ep.register_memory_region(name, self.buf)
        else:  # device memory by address and length, as an application holding a pointer registers it
            self.handle = ep.register_memory_region(name, memory.address(self.buf), 0, size)

    def view(self, n):
        return self.buf[:n]

    def clear(self, n):
        self.memory.clear(self.view(n))

    def digest(self, n):
        return self.memory.digest(self.view(n))


def make_regions(ep, device, side, size):
    host = HostMemory()
    regions = {}
    for name in ("dev", "dev_in", "host", "host_in"):
        memory = device if name.startswith("dev") else host
        regions[name] = Region(ep, name, memory, size, SEEDS.get((side, name)))
    return regions


# ---- the peer process ----

def serve(args):
    """The peer: its endpoint_info() as one JSON line, then one JSON answer per command line.
    Commands: connect {info}, clear {region, length}, digest {region, length}, quit."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else writes to stdout goes to stderr, not into the answers

    def reply(obj):
        out.write(json.dumps(obj) + "\n")

    load_ferry()
    ep = ferry.RDMAEndpoint(device_name=args.nic)
    regions = make_regions(ep, device_memory(args.device), "peer", args.max_size)
    reply({"info": ep.endpoint_info(), "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "connect":
                ep.connect(cmd["info"])
                reply({"ok": True})
            elif cmd["cmd"] == "clear":
                regions[cmd["region"]].clear(cmd["length"])
                reply({"ok": True})
            elif cmd["cmd"] == "digest":
                reply({"ok": True, "sha256": regions[cmd["region"]].digest(cmd["length"])})
            elif cmd["cmd"] == "quit":
                reply({"ok": True})
                break
            else:
                reply({"ok": False, "error": "unknown command %r" % cmd["cmd"]})
        except Exception as e:  # answered, so that the initiator reports it
            reply({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    ep.shutdown()
    return 0


class BenchError(Exception):
    """A failed run: the message is the whole explanation."""


class Peer:
    """The peer process, spoken to by JSON lines; every answer has a deadline."""

    def __init__(self, args):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        command = [sys.executable, os.path.abspath(__file__), "--serve", "--device", args.device,
                   "--max-size", str(max(args.sizes)), "--nic", args.nic]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            hello = self._answer()
        except BenchError:
            self.proc.kill()
            self.proc.wait()
            raise
        self.info, self.pid = hello["info"], hello["pid"]

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _answer(self):
        try:
            line = self.lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise BenchError("the peer process did not answer within %d s" % TIMEOUT) from None
        if not line:
            raise BenchError("the peer process exited (code %s); its stderr says why" % self.proc.wait())
        return json.loads(line)

    def call(self, cmd, **fields):
        self.proc.stdin.write(json.dumps(dict(fields, cmd=cmd)) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if not answer.get("ok"):
            raise BenchError("the peer: %s" % answer.get("error"))
        return answer

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
            except (BenchError, OSError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- measurements ----

class Transfer:
    """A WRITE or READ of the Endpoint API between a local and a remote region."""

    def __init__(self, bench, path, op, local, remote):
        self.bench, self.path, self.op = bench, path, op
        self.name = "%s %s" % (path, op)
        self.local = bench.regions[local]
        self.remote, self.remote_handle = remote, bench.remote[remote]
        self.call = bench.ep.write if op == "write" else bench.ep.read

    def timed(self, n, ops):
        assignments = [(self.local.handle, self.remote_handle, 0, 0, n)]
        self.bench.device.sync()
        t0 = time.perf_counter()
        for _ in range(ops):
            self.call(assignments, None).wait(TIMEOUT)
        return time.perf_counter() - t0

    def clear(self, n):
        if self.op == "write":
            self.bench.peer.call("clear", region=self.remote, length=n)
        else:
            self.local.clear(n)

    def verify(self, n):
        if self.op == "write":
            source = self.bench.source_digest(self.local, n)
            landed = self.bench.peer.call("digest", region=self.remote, length=n)["sha256"]
            where = "the peer's " + self.remote
        else:
            source = self.bench.source_digest(self.remote, n)
            landed = self.local.digest(n)
            where = "this process's " + self.local.name
        if landed != source:
            raise BenchError("%s of %d bytes: what landed in %s differs from its source" % (self.name, n, where))


class Copy:
    """A copy inside this process (the device's own, or device to pinned host memory)."""

    def __init__(self, bench, name, src, dst_buf):
        self.bench, self.name, self.op = bench, name, "copy"
        self.src, self.dst_buf = bench.regions[src], dst_buf

    def timed(self, n, ops):
        memory, src, dst = self.bench.device, self.src.view(n), self.dst_buf[:n]
        memory.sync()
        t0 = time.perf_counter()
        for _ in range(ops):
            memory.copy(dst, src)
        return time.perf_counter() - t0

    def clear(self, n):
        self.bench.device.clear(self.dst_buf[:n])

    def verify(self, n):
        if self.bench.device.digest(self.dst_buf[:n]) != self.bench.source_digest(self.src, n):
            raise BenchError("%s of %d bytes: the copy differs from its source" % (self.name, n))


class Bench:
    def __init__(self, args, device, peer):
        self.args, self.device, self.peer = args, device, peer
        largest = max(args.sizes)
        self.ep = ferry.RDMAEndpoint(device_name=args.nic)
        self.regions = make_regions(self.ep, device, "initiator", largest)
        self.pinned = device.alloc_pinned(largest)
        peer.call("connect", info=self.ep.endpoint_info())
        self.ep.connect(peer.info)
        self.remote = {name: self.ep.register_remote_memory_region(name, entry)
                       for name, entry in peer.info["mr_info"].items()}
        self.measurements = [Transfer(self, *t) for t in TRANSFERS] + [
            Copy(self, "dev-copy", "dev", self.regions["dev_in"].buf),
            Copy(self, "d2h-copy", "dev", self.pinned)]
        self.checked_bytes = 0
        self.digests = {}

    def source_digest(self, region, n):
        """The SHA-256 of a source region's first n bytes: a local Region, or a peer's region by name.
        Sources never change, so each is computed once."""
        key = (region if isinstance(region, str) else "local " + region.name, n)
        if key not in self.digests:
            self.digests[key] = (self.peer.call("digest", region=region, length=n)["sha256"]
                                 if isinstance(region, str) else region.digest(n))
        return self.digests[key]

    def once(self, m, n, ops):
        """One round of m: the landing cleared first and compared after, with --check."""
        if self.args.check:
            m.clear(n)
        seconds = m.timed(n, ops)
        if self.args.check:
            m.verify(n)
            self.checked_bytes += n
        return seconds

    def size(self, n):
        """Every measurement at size n: {name: (ops, median GB/s, [GB/s of each round])}."""
        ops = ops_for(n, self.args.ops)
        for m in self.measurements:
            self.once(m, n, 1)  # warm-up: first touches, staging buffers, lanes
        rounds = {m.name: [] for m in self.measurements}
        for _ in range(self.args.rounds):  # interleaved, so that drift hits every figure alike
            for m in self.measurements:
                rounds[m.name].append(n * ops / self.once(m, n, ops) / 1e9)
        return {name: (ops, statistics.median(r), r) for name, r in rounds.items()}

    def close(self):
        self.ep.shutdown()


# ---- the table and the document ----

HEADER = "%6s  %-10s %-5s %4s %11s  %-16s %10s %8s" % (
    "size", "path", "op", "ops", "ferry_GB/s", "reference", "ref_GB/s", "ratio")


def rows_of(n, figures):
    rows = []
    for path, op, _, _ in TRANSFERS:
        ops, gbps, per_round = figures["%s %s" % (path, op)]
        for ref in REFERENCES.get(path, []):
            ref_name = ref.format(op=op)
            ref_gbps = figures[ref_name][1]
            rows.append({"size": n, "path": path, "op": op, "ops": ops, "gbps": gbps, "round_gbps": per_round,
                         "reference": ref_name, "reference_gbps": ref_gbps, "ratio": gbps / ref_gbps})
    return rows


def print_row(row):
    print("%6s  %-10s %-5s %4d %11.3f  %-16s %10.3f %8.3f" % (
        label(row["size"]), row["path"], row["op"], row["ops"], row["gbps"], row["reference"],
        row["reference_gbps"], row["ratio"]), flush=True)


def measure(args, device):
    peer = Peer(args)
    bench = None
    try:
        bench = Bench(args, device, peer)
        nic = bench.ep.context.device_name
        print("# memory: %s; host memory: NumPy; d2h-copy into %s; nic %s; peer pid %d; %d round(s)%s" % (
            "device memory " + device.where if args.device == "cuda" else
            "host memory in place of device memory (--device cpu: a check of the harness, not a GPU figure)",
            "pinned memory" if args.device == "cuda" else "host memory", nic, peer.pid, args.rounds,
            ", bytes checked" if args.check else ""))
        print(HEADER, flush=True)
        rows, measurements = [], []
        for n in args.sizes:
            figures = bench.size(n)
            for name, (ops, gbps, per_round) in figures.items():
                measurements.append({"size": n, "name": name, "ops": ops, "gbps": gbps, "round_gbps": per_round})
            for row in rows_of(n, figures):
                print_row(row)
                rows.append(row)
        return {"nic": nic, "peer_pid": peer.pid, "checked_bytes": bench.checked_bytes,
                "measurements": measurements, "rows": rows}
    finally:
        if bench is not None:
            bench.close()
        peer.close()


def describe_device(args):
    if args.device == "cpu":
        return {"device_name": "host memory (--device cpu)"}
    import torch
    return {"device_name": torch.cuda.get_device_name(torch.cuda.current_device()), "torch": torch.__version__,
            "cuda": ferry._core.cuda()}


def write_json(args, doc):
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict({"bench": "gpu", "device": args.device, "sizes": args.sizes, "rounds": args.rounds,
                            "ops": args.ops, "check": args.check, "pid": os.getpid()}, **doc), f, indent=1)


# ---- options ----

def parse_args():
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=sizes_arg(), default=None,
                   help="e.g. 4K,1M,256M (K/M/G binary, as ferry bench --size takes them; "
                   "default 4K,64K,1M,16M,64M,256M)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per size; each figure is their median (default 3)")
    p.add_argument("--ops", type=int, default=None,
                   help="most operations per round (default 100; fewer for large sizes: about 64 MiB, at least 3)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default) or cpu: host memory in place of device memory, to check the harness")
    p.add_argument("--check", action="store_true", help="clear each landing region and compare it after each round")
    p.add_argument("--quick", action="store_true", help="--sizes 4K,64K,1M --rounds 1 --ops 10 unless given")
    p.add_argument("--json", default="", help="write every figure and the settings to this file")
    p.add_argument("--nic", default="", help="ferry's device for both endpoints (default: the first listed)")
    p.add_argument("--dry-run", action="store_true", help="print the settings as JSON and measure nothing")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--max-size", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    quick = args.quick
    args.sizes = args.sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)
    args.rounds = args.rounds if args.rounds is not None else 1 if quick else 3
    args.ops = args.ops if args.ops is not None else 10 if quick else 100
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.ops < 1:
        p.error("--ops must be at least 1")
    return args


def main():
    args = parse_args()
    if args.dry_run:
        print(json.dumps({"sizes": args.sizes, "rounds": args.rounds, "ops": args.ops, "device": args.device,
                          "check": args.check, "nic": args.nic}))
        return 0
    try:
        load_ferry()
    except ImportError as e:
        print("%s: cannot import %s: set PYTHONPATH=build/python (make env)" % (PROG, e), file=sys.stderr)
        return 1
    if args.serve:
        return serve(args)
    if args.device == "cuda":
        why = why_no_cuda()
        if why is not None:
            if os.environ.get("FERRY_REQUIRE_CUDA") == "1":
                print("%s: FERRY_REQUIRE_CUDA=1 and the cuda mode cannot run: %s" % (PROG, why), file=sys.stderr)
                return 1
            print("skipped: " + why, flush=True)
            write_json(args, {"skipped": why})
            return 0
    device = device_memory(args.device)
    try:
        doc = measure(args, device)
    except (BenchError, ferry.Error) as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    write_json(args, dict(doc, **describe_device(args)))
    print("gpu bench: %d figures at %d size(s), %s" % (
        len(doc["rows"]), len(args.sizes),
        "%d bytes checked" % doc["checked_bytes"] if args.check else "bytes not checked"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
