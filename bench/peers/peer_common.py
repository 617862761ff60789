"""What the peer drivers of bench/compare share: the two-process harness and the timing loop.

A driver runs twice: as the initiator (what bench/compare starts) and, started by the initiator
through this module, as the target. The target registers a buffer and prints one JSON line with what
the initiator needs (addresses, keys, metadata); it then waits until its standard input closes. The
initiator writes into and reads from that buffer with the peer's one-sided operations and prints one
JSON line of results:

    {"peer": NAME, "transport": ..., "results": [{"size": N, "write_gbps": X, "read_gbps": Y}, ...]}

or {"peer": NAME, "error": "why it could not run"}. All traffic stays on 127.0.0.1.
"""

import importlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_cli  # noqa: E402

SIZES = [8, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]


def parse_args(prog):
    """The driver's options; bad ones end it with one line and exit code 2."""
    p = bench_cli.ArgumentParser(prog=prog)
    p.add_argument("--role", choices=["initiator", "target"], default="initiator")
    p.add_argument("--sizes", type=bench_cli.sizes_arg(), default=SIZES, help="e.g. 4K,1M,16M")
    p.add_argument("--seconds", type=float, default=1.0, help="time per size and operation")
    p.add_argument("--max-size", type=bench_cli.size_arg(), default=0, help="target: bytes to register")
    p.add_argument("--dry-run", action="store_true", help="print the settings as JSON and measure nothing")
    args = p.parse_args()
    if not args.seconds > 0:
        p.error("--seconds must be above 0, not %s" % args.seconds)
    if args.max_size == 0:
        args.max_size = max(args.sizes)
    if args.dry_run:
        print(json.dumps({"role": args.role, "sizes": args.sizes, "seconds": args.seconds,
                          "max_size": args.max_size}))
        sys.exit(0)
    return args


# Peer libraries may print their own lines to standard output; ours carry this prefix.
PREFIX = "FERRY_PEER "


def emit(obj):
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def start_target(script, args, timeout=60):
    """Starts this driver as the target; returns (process, its first JSON line)."""
    proc = subprocess.Popen(
        [sys.executable, script, "--role", "target", "--max-size", str(args.max_size)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = read_line(proc, timeout)
    if not line:
        proc.kill()
        proc.wait()
        raise RuntimeError("the target process did not start (exit code %s)" % proc.returncode)
    hello = json.loads(line[len(PREFIX):])
    if "error" in hello:
        proc.kill()
        proc.wait()
        raise RuntimeError("target: " + hello["error"])
    return proc, hello


def read_line(proc, timeout):
    """The target's first line with our prefix, or "" when none came within timeout seconds.

    A thread reads the pipe: select() on a buffered pipe misses lines already read ahead."""
    import queue
    import threading
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return ""
        if not line or line.startswith(PREFIX):
            return line


def stop_target(proc):
    try:
        proc.stdin.close()
        proc.wait(timeout=20)
    except Exception:
        proc.kill()
        proc.wait()


def wait_for_quit():
    """Target side: exits when the initiator closes our standard input."""
    sys.stdin.read()
    sys.stdout.flush()
    os._exit(0)


def per_call(size):
    """Transfers of `size` bytes issued together in one call, so that small messages measure the
    peer rather than the Python loop around it: up to 1 MiB per call, at most 1024 transfers."""
    return max(1, min(1024, (1 << 20) // size))


def time_loop(seconds, call, bytes_per_call):
    """Runs call() once untimed, then until `seconds` have passed; returns bytes per second."""
    call()
    n = 0
    start = time.perf_counter()
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            return bytes_per_call * n / elapsed


def run_initiator(name, script, args, measure):
    """Starts the target, calls measure(hello, args) -> (transport, results), prints the outcome."""
    try:
        proc, hello = start_target(script, args)
    except Exception as e:  # report, never hang or crash the comparison
        emit({"peer": name, "error": str(e)})
        return 1
    try:
        transport, results = measure(hello, args)
        emit({"peer": name, "transport": transport, "results": results})
        code = 0
    except Exception as e:
        emit({"peer": name, "error": "%s: %s" % (type(e).__name__, e)})
        code = 1
    stop_target(proc)
    # Leave without running the libraries' destructors: some crash at interpreter exit, and the
    # results are already out.
    sys.stderr.flush()
    os._exit(code)


def main(name, module, script, target, measure):
    """A peer driver's entry point: imports `module` (reporting why it cannot), then runs the
    target role (`target(args)`) or the initiator role (`measure`, through run_initiator)."""
    args = parse_args("bench/peers/" + os.path.basename(script))
    try:
        importlib.import_module(module)
    except Exception as e:
        emit({"peer": name, "error": "cannot import %s: %s" % (module, e)})
        return 1
    if args.role == "target":
        try:
            target(args)
        except Exception as e:
            emit({"error": "%s: %s" % (type(e).__name__, e)})
            return 1
        return 0
    return run_initiator(name, os.path.abspath(script), args, measure)
