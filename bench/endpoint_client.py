#!/usr/bin/env python3
"""The client of `ferry bench --api endpoint`, in Python: the same runs through ferry's Python Endpoint
API (`ferry.RDMAEndpoint`) against a `ferry bench` server, over the same control protocol, with the
same loops, the same checks and the same table and JSON document ("language": "python"). A figure of
this client minus the same figure of `ferry bench --api endpoint` is what Python adds per operation
and per assignment (bench/endpoint-overhead runs both and prints the differences).

    bench/endpoint_client.py --local --op write --mode lat --size 8,4K --batch 16
    bench/endpoint_client.py --local --op read --batch 256 --form numpy --json
    bench/endpoint_client.py HOST[:PORT] --op send ...    # against `ferry bench --server` on HOST

`import ferry` must find the package (PYTHONPATH=build/python, see `make env`); --local starts the
server with the `ferry` binary of --ferry (default: `ferry` on PATH, else build/ferry).

What is measured, as in `ferry bench --api endpoint` (docs/benchmarks.md): each operation names
--batch ranges of the message size (send: chunks of one message), all the same source and landing
range; bandwidth keeps --depth operations in flight and waits for the oldest, latency issues one
operation and waits for it. t_call is the time inside the call that issues an operation
(read/write/write_with_imm/send, the batch's conversion included), t_msg the wall time per assignment.
--form says how the batch is given: the document's tuples (default), a NumPy array of
ferry.assignment_dtype, or ferry.Assignment objects.
"""

import argparse
import collections
import json
import math
import mmap
import os
import re
import shutil
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from bench_cli import SizeError, format_size, parse_sizes  # noqa: E402

PROTOCOL = 1
DEFAULT_PORT = 18520
SWEEP = [8, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
MAX_SIZE = 1 << 30
MAX_BATCH = 1 << 20
MAX_QPS = 64
MAX_DEPTH = 4096
OPS = ("write", "read", "send", "write_imm")
FORMS = ("tuple", "numpy", "assignment")
REGION = "bench"


class BenchError(Exception):
    """A run that cannot go on: the message says why (exit code 1)."""


class UsageError(Exception):
    """Bad options (exit code 2)."""


def pattern(length):
    """Byte i of a source half, as `ferry bench` fills it (patternByte in bench/engine/bench.h)."""
    period = bytes(((i % 251) * 7 + 3) & 0xFF for i in range(251))
    return (period * (length // 251 + 1))[:length]


def auto_iterations(mode, size):
    """The iterations `ferry bench` runs when neither --iters nor --duration is given."""
    budget, lo, hi = ((2 << 30), 32, 20000) if mode == "bw" else ((256 << 20), 16, 5000)
    return min(max(budget // max(size, 1), lo), hi)


def percentile(sorted_samples, p):
    rank = math.ceil(p / 100.0 * len(sorted_samples))
    return sorted_samples[min(max(rank, 1), len(sorted_samples)) - 1]


class Control:
    """The control connection: JSON lines {"ferry_bench": 1, "type": T, ...}, each checked."""

    def __init__(self, sock, timeout):
        self.sock = sock
        self.timeout = timeout
        self.buffered = b""

    @classmethod
    def connect(cls, host, port, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return cls(sock, timeout)
            except OSError as e:
                if time.monotonic() > deadline:
                    raise BenchError("cannot connect to %s:%d: %s" % (host, port, e)) from None
                time.sleep(0.1)

    def send(self, kind, **fields):
        message = {"ferry_bench": PROTOCOL, "type": kind}
        message.update(fields)
        try:
            self.sock.sendall((json.dumps(message, separators=(",", ":")) + "\n").encode())
        except OSError as e:
            raise BenchError("the peer closed the control connection (%s)" % e) from None

    def send_error(self, text):
        try:
            self.send("error", message=text)
        except BenchError:
            pass

    def receive(self):
        self.sock.settimeout(self.timeout)
        while b"\n" not in self.buffered:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise BenchError("no control message from the peer within %g s" % self.timeout) from None
            if not chunk:
                raise BenchError("the peer closed the control connection")
            self.buffered += chunk
        line, self.buffered = self.buffered.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as e:
            raise BenchError("malformed control message (%s)" % e) from None
        if not isinstance(message, dict) or message.get("ferry_bench") != PROTOCOL:
            raise BenchError("malformed control message or another protocol version: %r" % line[:200])
        if message.get("type") == "error":
            raise BenchError("the peer gave up: %s" % message.get("message", "(no message)"))
        return message

    def expect(self, kind):
        message = self.receive()
        if message.get("type") != kind:
            raise BenchError("unexpected control message '%s' (expected '%s')" % (message.get("type"), kind))
        return message

    def field(self, message, name, kind, lo=None, hi=None):
        value = message.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) or (lo is not None and not lo <= value <= hi):
            raise BenchError("control message '%s': field '%s' is missing or out of range: %r"
                             % (message.get("type"), name, value))
        return value


class Server:
    """`ferry bench --server` as a child process on 127.0.0.1 (--local), ended by its own pid."""

    def __init__(self, ferry, device, timeout):
        cmd = [ferry, "bench", "--server", "--announce", "--bind", "127.0.0.1", "--port", "0",
               "--timeout", str(timeout)]
        if device:
            cmd += ["--device", device]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        try:
            self.port = json.loads(line)["port"]
        except (ValueError, KeyError, TypeError):
            self.stop()
            raise BenchError("the server process did not start (%s)" % " ".join(cmd)) from None
        self.name = "127.0.0.1:%d (pid %d)" % (self.port, self.proc.pid)

    def stop(self, seconds=5):
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait()
            return 1


class EndpointClient:
    """The client's side of a run: one RDMAEndpoint, its buffer and the measured loops."""

    def __init__(self, args, control):
        import ferry
        self.ferry = ferry
        self.args = args
        self.control = control
        self.max_size = max(args.sizes)
        self.device = args.device or self.choose_device(control.sock.getsockname()[0])
        self.ep = ferry.RDMAEndpoint(device_name=self.device, link_type="", num_qp=args.qps)
        landing = self.max_size * (args.batch if args.op == "send" else 1)
        self.buffer = mmap.mmap(-1, max(self.max_size + landing, 4096))
        self.buffer[:self.max_size] = pattern(self.max_size)
        self.local = self.ep.register_memory_region(REGION, self.buffer)
        self.remote = None
        self.next_imm = 0

    def choose_device(self, address):
        """As `ferry bench`: the device bound to the control connection's address, else the first."""
        devices = self.ferry.get_devices()
        if not devices:
            raise BenchError("no ferry devices here (see `ferry info`)")
        return next((d.name for d in devices if d.address and d.address == address), devices[0].name)

    def hello(self):
        a = self.args
        self.control.send("hello", endpoint=self.ep.endpoint_info(), op=a.op, mode=a.mode, api="endpoint",
                          threads=1, qps=a.qps, depth=a.depth, batch=a.batch, max_size=self.max_size,
                          device=self.device)
        reply = self.control.expect("hello")
        server_device = self.control.field(reply, "device", str)
        if not isinstance(reply.get("endpoint"), dict):
            raise BenchError("control message 'hello': field 'endpoint' must be an object")
        self.ep.connect(reply["endpoint"])
        self.remote = self.ep.remote_handle(REGION)
        return server_device

    def items(self, size):
        """The batch of one operation, in the form asked for."""
        a, n, landing = self.args, self.args.batch, self.max_size
        if a.op == "send":
            return [(self.local, 0, size)] * n
        # (mr_key, remote_mr_key, target_offset, source_offset, length): the target is local for read.
        one = (self.local, self.remote, landing, 0, size)
        if a.form == "numpy":
            import numpy
            return numpy.array([one] * n, dtype=self.ferry.assignment_dtype)
        if a.form == "assignment":
            op = "read" if a.op == "read" else "write"
            return [self.ferry.Assignment.from_tuple(op, one)] * n
        return [one] * n

    def issuer(self, size):
        """A function that issues one operation of the run and returns its future."""
        items, ep = self.items(size), self.ep
        if self.args.op == "write_imm":
            write_with_imm = ep.write_with_imm

            def issue():
                f = write_with_imm(items, self.next_imm)
                self.next_imm = (self.next_imm + 1) & 0xFFFFFFFF
                return f
            return issue
        call = {"read": ep.read, "write": ep.write, "send": ep.send}[self.args.op]
        return lambda: call(items)

    def wait(self, future):
        try:
            future.wait(self.args.timeout)
        except self.ferry.TimedOut:
            raise BenchError("an operation made no progress for %g s (is the peer alive?)"
                             % self.args.timeout) from None

    def measure(self, size, iters, warmup, duration):
        """One run of `size`: warm-up, "start", then the timed operations. Returns the figures."""
        a = self.args
        issue = self.issuer(size)
        landing = self.max_size
        if a.op == "read":
            self.buffer[landing:landing + size] = bytes(size)
        depth = a.depth if a.mode == "bw" else 1
        latency = a.mode == "lat"
        perf_counter, wait, control = time.perf_counter, self.wait, self.control
        totals = {"operations": 0, "call": 0.0}
        samples = []

        def run(count, stop_at, timed):
            inflight = collections.deque()
            issued = completed = 0
            last_beat = perf_counter()
            while True:
                while len(inflight) < depth and issued < count and perf_counter() < stop_at:
                    t0 = perf_counter()
                    f = issue()
                    t1 = perf_counter()
                    inflight.append(f)
                    issued += 1
                    totals["operations"] += 1
                    if timed:
                        totals["call"] += t1 - t0
                        if latency:
                            wait(f)
                            samples.append((perf_counter() - t0) * 1e6)
                if not inflight:
                    return completed
                wait(inflight[0])
                inflight.popleft()
                completed += 1
                if timed and completed % 64 == 0 and perf_counter() - last_beat > 0.5:
                    control.send("progress", done=completed)
                    last_beat = perf_counter()

        run(warmup, math.inf, False)
        control.send("start")
        cpu0, start = time.process_time(), perf_counter()
        stop_at = start + duration if duration > 0 else math.inf
        iterations = run(iters if duration <= 0 else math.inf, stop_at, True)
        seconds = perf_counter() - start
        cpu = time.process_time() - cpu0
        verified = 0
        if a.op == "read":
            got = self.buffer[landing:landing + size]
            if got != self.buffer[:size]:
                j = next(i for i in range(size) if got[i] != self.buffer[i])
                raise BenchError("byte %d of the %d bytes read here is 0x%02x, not 0x%02x"
                                 % (j, size, got[j], self.buffer[j]))
            verified = size
        return {"iterations": iterations, "seconds": seconds, "operations": totals["operations"],
                "call_seconds": totals["call"], "samples": sorted(samples), "cpu": cpu,
                "verified_bytes": verified}

    def close(self):
        self.ep.shutdown()
        self.ep.unregister_memory_region(REGION)


def summarize(args, size, m, result):
    """One entry of "results", with the fields and the arithmetic of `ferry bench` (bench_report.cc)."""
    messages = m["iterations"] * args.batch
    seconds = m["seconds"]
    r = {"size": size, "iterations": m["iterations"], "seconds": seconds,
         "bw_gbps": size * messages / seconds / 1e9 if seconds > 0 else 0,
         "msg_rate_mpps": messages / seconds / 1e6 if seconds > 0 else 0}
    s = m["samples"]
    if args.mode == "lat" and s:
        n = len(s)
        median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        r["lat_us"] = {"min": s[0], "median": median, "p99": percentile(s, 99), "avg": sum(s) / n, "max": s[-1]}
    server_cpu, server_wall = result["cpu_seconds"], result["wall_seconds"]
    r.update({"client_cpu_seconds": m["cpu"], "client_cpu_percent": 100 * m["cpu"] / seconds if seconds else 0,
              "server_cpu_seconds": server_cpu,
              "server_cpu_percent": 100 * server_cpu / server_wall if server_wall else 0,
              "messages": messages, "us_per_message": seconds * 1e6 / messages if messages else 0,
              "call_us": m["call_seconds"] * 1e6 / m["iterations"] if m["iterations"] else 0,
              "verified_bytes": max(m["verified_bytes"], result["verified_bytes"])})
    return r


def columns(mode):
    """The table's columns, as `ferry bench --api endpoint` prints them: (title, width, value)."""
    cols = [("#bytes", 10, lambda r: format_size(r["size"])), ("#operations", 12, lambda r: str(r["iterations"]))]
    if mode == "bw":
        cols += [("BW average[GB/s]", 16, lambda r: "%.4f" % r["bw_gbps"]),
                 ("MsgRate[Mpps]", 14, lambda r: "%.4f" % r["msg_rate_mpps"])]
    else:
        cols += [(title, width, lambda r, k=key: "%.2f" % r["lat_us"][k]) for title, width, key in
                 (("t_min[us]", 11, "min"), ("t_median[us]", 14, "median"), ("t_p99[us]", 11, "p99"),
                  ("t_avg[us]", 11, "avg"))]
    return cols + [("t_msg[us]", 11, lambda r: "%.3f" % r["us_per_message"]),
                   ("t_call[us]", 11, lambda r: "%.3f" % r["call_us"]),
                   ("CPU client[%]", 14, lambda r: "%.1f" % r["client_cpu_percent"]),
                   ("CPU server[%]", 14, lambda r: "%.1f" % r["server_cpu_percent"])]


def run_session(args, control, server_name):
    client = EndpointClient(args, control)
    try:
        server_device = client.hello()
        rule = ("--duration %g" % args.duration if args.duration else
                "--iters %d" % args.iters if args.iters else "auto (per size)")
        doc = {"ferry_bench": PROTOCOL, "api": "endpoint", "language": "python", "form": args.form,
               "op": args.op, "mode": args.mode, "client_device": client.device, "server_device": server_device,
               "server": server_name, "threads": 1, "qps": args.qps, "depth": args.depth, "batch": args.batch,
               "iterations_rule": rule, "latency_kind": "none" if args.mode == "bw" else "post_to_completion",
               "ferry_soft_same_host": os.environ.get("FERRY_SOFT_SAME_HOST"), "results": []}
        table = sys.stderr if args.json else sys.stdout
        print("ferry bench (Python client, %s batches): Endpoint API %s %s, %s -> %s (server %s)"
              % (args.form, args.op, "bandwidth" if args.mode == "bw" else "latency", client.device,
                 server_device, server_name), file=table)
        print("  1 endpoint, num_qp %d, batch %d, iterations: %s" % (args.qps, args.batch, rule), file=table)
        cols = columns(args.mode)
        print("-" * 87, file=table)
        print("".join(" %-*s" % (width, title) for title, width, _ in cols), file=table, flush=True)
        for size in args.sizes:
            iters = 0 if args.duration else (args.iters or auto_iterations(args.mode, size))
            warmup = ((64 if args.mode == "bw" else 16) if args.duration else
                      min(max(iters // 10, 1), 256 if args.mode == "bw" else 64))
            control.send("run", size=size)
            control.expect("ready")
            try:
                m = client.measure(size, iters, warmup, args.duration)
            except BenchError as e:
                raise BenchError("size %s: %s" % (format_size(size), e)) from None
            control.send("done", iterations=m["iterations"], operations=m["operations"])
            result = control.expect("result")
            for name in ("cpu_seconds", "wall_seconds"):
                control.field(result, name, (int, float), 0, 1e9)
            control.field(result, "verified_bytes", int, 0, 1 << 32)
            r = summarize(args, size, m, result)
            doc["results"].append(r)
            print("".join(" %-*s" % (width, value(r)) for _, width, value in cols), file=table, flush=True)
        control.send("bye")
        control.expect("bye")
        return doc
    finally:
        client.close()


class _ArgumentParser(argparse.ArgumentParser):
    """Usage errors become UsageError, which main() prints on one line."""

    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = _ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("server", nargs="?", help="HOST[:PORT] of a `ferry bench --server`")
    p.add_argument("--local", action="store_true", help="start the server here as a child process")
    p.add_argument("--ferry", help="the ferry binary for --local (default: ferry on PATH, else build/ferry)")
    p.add_argument("--device", default="", help="this side's device")
    p.add_argument("--server-device", default="", help="--local: the server's device (default: --device)")
    p.add_argument("--op", default="write")
    p.add_argument("--mode", default="bw")
    p.add_argument("--size", action="append", default=[], help="N[,N...], as ferry bench --size takes them")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--duration", type=float, default=0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("--qps", type=int, default=1)
    p.add_argument("--form", default="tuple", help="tuple (default), numpy or assignment")
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.local == bool(args.server):
        raise UsageError("give exactly one of --local or a server address HOST[:PORT]")
    if args.op not in OPS:
        raise UsageError("unknown --op '%s': the Endpoint API offers %s" % (args.op, ", ".join(OPS)))
    if args.mode not in ("bw", "lat"):
        raise UsageError("unknown --mode '%s': use bw or lat" % args.mode)
    if args.form not in FORMS:
        raise UsageError("unknown --form '%s': use %s" % (args.form, ", ".join(FORMS)))
    if args.form != "tuple" and args.op == "send":
        raise UsageError("--form %s: send takes chunks, which are (mr_key, offset, length) tuples" % args.form)
    for flag, value, hi in (("--batch", args.batch, MAX_BATCH), ("--depth", args.depth, MAX_DEPTH),
                            ("--qps", args.qps, MAX_QPS)):
        if not 1 <= value <= hi:
            raise UsageError("%s takes a whole number in [1, %d], not %d" % (flag, hi, value))
    if args.iters < 0 or args.duration < 0 or args.timeout <= 0 or (args.iters and args.duration):
        raise UsageError("--iters and --duration are positive, and not both given")
    try:
        sizes = [size for text in args.size for size in parse_sizes(text)]
    except SizeError as e:
        raise UsageError(str(e)) from None
    if args.sweep or not sizes:
        sizes += SWEEP
    args.sizes = sorted(set(sizes))
    if max(args.sizes) * args.batch > MAX_SIZE:
        raise UsageError("one call moves --size x --batch bytes, at most 1G; %d x %d is more"
                         % (max(args.sizes), args.batch))
    return args


def main(argv=None):
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print("endpoint_client: %s" % e, file=sys.stderr)
        return 2
    try:
        import ferry  # noqa: F401
    except ImportError as e:
        print("endpoint_client: cannot import ferry (%s): set PYTHONPATH=build/python (make env)" % e,
              file=sys.stderr)
        return 1
    server = control = None
    try:
        if args.local:
            binary = args.ferry or shutil.which("ferry") or os.path.join(REPO, "build", "ferry")
            server = Server(binary, args.server_device or args.device, args.timeout)
            host, port, name = "127.0.0.1", server.port, server.name
        else:
            host, _, port = args.server.rpartition(":") if ":" in args.server else (args.server, "", DEFAULT_PORT)
            port, name = int(port), args.server
        control = Control.connect(host, port, args.timeout)
        try:
            doc = run_session(args, control, name)
        except (BenchError, ferry.Error) as e:
            control.send_error(str(e))
            raise
        if args.json:
            print(json.dumps(doc))
        code = server.stop(args.timeout) if server else 0
        if code != 0:
            raise BenchError("the server process exited with %d" % code)
        return 0
    except (BenchError, ferry.Error) as e:
        print("endpoint_client: %s" % e, file=sys.stderr)
        return 1
    finally:
        if control:
            control.sock.close()
        if server and server.proc.poll() is None:
            server.stop(0)


if __name__ == "__main__":
    sys.exit(main())
