#!/usr/bin/env python3
"""Mooncake Transfer Engine (TCP transport) one-sided WRITE and READ between two processes, for
bench/compare.

Both engines start with local_hostname 127.0.0.1 and the P2PHANDSHAKE metadata mode (no metadata
server); the initiator names the target by "127.0.0.1:<rpc port>". Each call is one synchronous
batch of per_call(size) transfers of `size` bytes between the same two regions.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402


def make_engine():
    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError("TransferEngine.initialize returned %d" % rc)
    return engine


def target(args):
    import numpy as np
    engine = make_engine()
    buf = np.ones(args.max_size, dtype=np.uint8)
    rc = engine.register_memory(buf.ctypes.data, args.max_size)
    if rc != 0:
        raise RuntimeError("register_memory returned %d" % rc)
    peer_common.emit({"session": "127.0.0.1:%d" % engine.get_rpc_port(), "addr": buf.ctypes.data,
                      "len": args.max_size})
    peer_common.wait_for_quit()


def measure(hello, args):
    import numpy as np
    engine = make_engine()
    buf = np.zeros(args.max_size, dtype=np.uint8)
    rc = engine.register_memory(buf.ctypes.data, args.max_size)
    if rc != 0:
        raise RuntimeError("register_memory returned %d" % rc)
    session = hello["session"]
    results = []
    for size in args.sizes:
        k = peer_common.per_call(size)
        local, far, lengths = [buf.ctypes.data] * k, [hello["addr"]] * k, [size] * k
        row = {"size": size}
        for op, fn in (("write", engine.batch_transfer_sync_write), ("read", engine.batch_transfer_sync_read)):
            def call():
                rc = fn(session, local, far, lengths)
                if rc != 0:
                    raise RuntimeError("Mooncake %s of %d x %d bytes returned %d" % (op, k, size, rc))

            row[op + "_gbps"] = peer_common.time_loop(args.seconds, call, size * k) / 1e9
        results.append(row)
    return "tcp", results


def main():
    return peer_common.main("mooncake", "mooncake.engine", __file__, target, measure)


if __name__ == "__main__":
    sys.exit(main())
