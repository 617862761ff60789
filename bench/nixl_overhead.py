#!/usr/bin/env python3
"""What ferry.nixl costs per call over the engine underneath it, from Python, in one process.

Two ferry.nixl agents of this process, each with a registered buffer; one WRITE request of
--size bytes made once (initialize_xfer) and then, for each operation:

  nixl    transfer(handle), then check_xfer_state(handle) until "DONE": what a NIXL program does
          to repost a prepared request and wait for it.
  engine  the same assignment posted by the agent connection ferry.nixl uses (PeerConnection.write)
          and waited for (Future.wait): ferry's own API, with nothing of NIXL's.

Rounds alternate the two, so that drift hits both alike. It prints the median time per operation
of each and the difference (the cost of ferry.nixl's layer, in microseconds). Nothing is asserted
about times; docs/nixl.md has figures.

    PYTHONPATH=build/python python3 bench/nixl_overhead.py [--size 8] [--rounds 5] [--ops 5000]
        [--json FILE]
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cli import ArgumentParser, format_size, size_arg  # noqa: E402

PROG = "bench/nixl_overhead.py"


def parse(argv):
    p = ArgumentParser(prog=PROG, description="ferry.nixl's cost per call over the engine underneath it")
    p.add_argument("--size", type=size_arg(64 << 20), default=8, help="bytes per WRITE (default 8)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each (default 5)")
    p.add_argument("--ops", type=int, default=5000, help="operations per round (default 5000)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.ops < 1:
        p.error("--rounds and --ops must be at least 1")
    return args


def per_op_us(fn, ops):
    t0 = time.perf_counter()
    for _ in range(ops):
        fn()
    return (time.perf_counter() - t0) / ops * 1e6


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    import numpy as np
    import ferry.nixl as nixl

    a, b = nixl.nixl_agent("overhead-a"), nixl.nixl_agent("overhead-b")
    src = np.arange(args.size, dtype=np.uint8)
    dst = np.zeros(args.size, np.uint8)
    a.register_memory(src)
    b.register_memory(dst)
    a.add_remote_agent(b.get_agent_metadata())
    handle = a.initialize_xfer("WRITE", a.get_xfer_descs(src), a.get_xfer_descs(dst), "overhead-b")

    def with_nixl():
        state = a.transfer(handle)
        while state != "DONE":
            state = a.check_xfer_state(handle)

    with_nixl()
    if not np.array_equal(src, dst):
        sys.exit("%s: the WRITE did not move the bytes" % PROG)
    # The engine's own call for the same request: the connection and assignments ferry.nixl made.
    engine = a.agent
    request = next(r for r in engine._requests.values() if r.assignments)
    conn = engine._connection(engine._remote("overhead-b", PROG))
    assignments = request.assignments

    def with_engine():
        conn.write(assignments).wait()

    for fn in (with_nixl, with_engine):  # warm both paths
        per_op_us(fn, min(args.ops, 1000))
    nixl_us, engine_us = [], []
    for _ in range(args.rounds):
        nixl_us.append(per_op_us(with_nixl, args.ops))
        engine_us.append(per_op_us(with_engine, args.ops))
    row = {"size": args.size, "ops": args.ops, "rounds": args.rounds,
           "nixl_us": statistics.median(nixl_us), "engine_us": statistics.median(engine_us)}
    row["added_us"] = row["nixl_us"] - row["engine_us"]
    print("size    nixl_us  engine_us  added_us")
    print("%-6s %8.2f %10.2f %9.2f" % (format_size(args.size), row["nixl_us"], row["engine_us"], row["added_us"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "nixl_overhead", "rows": [row]}, f, indent=1)
    a.release_xfer_handle(handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
