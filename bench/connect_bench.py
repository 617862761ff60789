#!/usr/bin/env python3
"""What ferry.connect costs over the Endpoint API, from Python, in one asyncio loop.

For each size, one run interleaves (in rounds, so drift hits both alike):

  connector  a whole operation: create_readable(Descriptor(src)), metadata().model_dump_json(),
             RdmaMetadata.model_validate_json(), begin_read(), and both wait_for_completion()s;
             two Connectors (two agents) of this process, over the lane their agents choose.
  endpoint   the same bytes by the Endpoint API: one READ between two connected RDMAEndpoints
             with the memory registered once, awaited from the same loop (ferry.aio).

It prints the median time per operation of each, the connector's added cost (connector minus
endpoint, in microseconds) and, from 1 MiB, the bandwidth ratio (endpoint time / connector
time). Nothing is asserted about times; docs/performance.md ("Connector") has figures.

    PYTHONPATH=build/python python3 bench/connect_bench.py [--sizes 4K,64K,1M,16M,256M,1G]
        [--rounds 5] [--ops N] [--json FILE] [--check] [--chunk-bytes 64M] [--window 2]

--ops is operations per round for the smallest size (fewer for large ones, at least 2); --check
verifies the bytes of every operation (slower; the bench smoke test uses it).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cli import ArgumentParser, format_size as label, size_arg, sizes_arg  # noqa: E402

PROG = "bench/connect_bench.py"
# Imported by load_ferry() once the options are known to be good.
np = ferry = Connector = Descriptor = RdmaMetadata = None


def load_ferry():
    global np, ferry, Connector, Descriptor, RdmaMetadata
    import numpy as np
    import ferry
    from ferry.connect import Connector, Descriptor, RdmaMetadata


def ops_for(size, base):
    return max(2, min(base, int(base * 65536 // max(size, 65536))))


async def connector_round(a, b, src, dst, n, check):
    times = []
    for i in range(n):
        if check:
            src[:16] = np.frombuffer(np.int64(i).tobytes() * 2, np.uint8)
        t0 = time.perf_counter()
        readable = a.create_readable(Descriptor(src))
        text = readable.metadata().model_dump_json()
        op = await b.begin_read(RdmaMetadata.model_validate_json(text), Descriptor(dst))
        await op.wait_for_completion()
        await readable.wait_for_completion()
        times.append(time.perf_counter() - t0)
        if check and not np.array_equal(src, dst):
            raise SystemExit("connect_bench: the bytes of a connector operation differ")
    return times


async def endpoint_round(ep, local, remote, size, src, dst, n, check):
    times = []
    for i in range(n):
        if check:
            src[:16] = np.frombuffer(np.int64(i + 7).tobytes() * 2, np.uint8)
        t0 = time.perf_counter()
        await ep.read([(local, remote, 0, 0, size)], None)
        times.append(time.perf_counter() - t0)
        if check and not np.array_equal(src, dst):
            raise SystemExit("connect_bench: the bytes of an endpoint READ differ")
    return times


async def run(args):
    sizes = args.sizes
    tuning = {}
    if args.chunk_bytes:
        tuning["chunk_bytes"] = args.chunk_bytes
    if args.window:
        tuning["window"] = args.window
    a, b = Connector("bench-owner", **tuning), Connector("bench-reader", **tuning)
    await a.initialize()
    await b.initialize()
    reader, target = ferry.RDMAEndpoint(), ferry.RDMAEndpoint()
    reader.connect(target.endpoint_info())
    target.connect(reader.endpoint_info())
    rows = []
    try:
        for size in sizes:
            src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
            dst = np.zeros(size, np.uint8)
            name = "buf%d" % size
            local = reader.register_memory_region(name, dst)
            target.register_memory_region(name, src)
            remote = reader.register_remote_memory_region(name, target.endpoint_info()["mr_info"][name])
            n = ops_for(size, args.ops)
            # One warm-up operation of each (the first connection, first pages).
            await connector_round(a, b, src, dst, 1, args.check)
            await endpoint_round(reader, local, remote, size, src, dst, 1, args.check)
            conn, base = [], []
            for _ in range(args.rounds):
                conn += await connector_round(a, b, src, dst, n, args.check)
                base += await endpoint_round(reader, local, remote, size, src, dst, n, args.check)
            c, e = statistics.median(conn), statistics.median(base)
            row = {"size": size, "ops": len(conn), "connector_us": c * 1e6, "endpoint_us": e * 1e6,
                   "added_us": (c - e) * 1e6, "connector_gbps": size / c / 1e9, "endpoint_gbps": size / e / 1e9,
                   "ratio": e / c}
            rows.append(row)
            print("%6s %6d %12.1f %12.1f %10.1f %9.3f %9.3f %7.2f" % (
                label(size), row["ops"], row["connector_us"], row["endpoint_us"], row["added_us"],
                row["connector_gbps"], row["endpoint_gbps"], row["ratio"]), flush=True)
            del src, dst
    finally:
        a.shutdown()
        b.shutdown()
        reader.shutdown()
        target.shutdown()
    return rows


def main():
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=sizes_arg(), default=[4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30],
                   help="e.g. 4K,1M,16M (K/M/G binary, as ferry bench --size takes them)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=400)
    p.add_argument("--json", default="")
    p.add_argument("--check", action="store_true")
    p.add_argument("--chunk-bytes", type=size_arg(), default=0,
                   help="the owner's Connector(chunk_bytes=...), e.g. 64M (default: its own)")
    p.add_argument("--window", type=int, default=0, help="the owner's Connector(window=...) (default: its own)")
    p.add_argument("--dry-run", action="store_true", help="print the settings as JSON and measure nothing")
    args = p.parse_args()
    if args.rounds < 1 or args.ops < 1:
        p.error("--rounds and --ops must be at least 1")
    if args.window < 0:
        p.error("--window must not be negative")
    if args.dry_run:
        print(json.dumps({"sizes": args.sizes, "rounds": args.rounds, "ops": args.ops,
                          "chunk_bytes": args.chunk_bytes, "window": args.window}))
        return 0
    try:
        load_ferry()
    except ImportError as e:
        print("%s: cannot import %s: set PYTHONPATH=build/python (make env)" % (PROG, e), file=sys.stderr)
        return 1
    print("%6s %6s %12s %12s %10s %9s %9s %7s" % (
        "size", "ops", "connector_us", "endpoint_us", "added_us", "conn_GB/s", "ep_GB/s", "ratio"))
    rows = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "connect", "pid": os.getpid(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
