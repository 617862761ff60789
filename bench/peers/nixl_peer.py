#!/usr/bin/env python3
"""NIXL (UCX backend) one-sided WRITE and READ between two processes, for bench/compare.

Each call is one NIXL transfer request of per_call(size) descriptors (NIXL_PEER_DESCS in the
environment sets another count), all naming the same local and remote `size`-byte regions (the same
addresses repeated, so NIXL cannot merge them into one larger transfer); the request is prepared
once, then reposted and polled until DONE on every call. UCX picks its transports as usual; set
UCX_TLS in the environment to pin them (bench/compare runs it once with UCX_TLS=tcp and once with
shared memory and cross-memory attach).

The program uses NIXL's Python API only (nixl._api), so it runs unchanged on ferry.nixl too:
bench/peers/ferry_nixl_peer.py runs it there after ferry.nixl.install_as_nixl().
"""

import base64
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402


def make_endpoint(name):
    """A NIXL instance with the UCX backend and a progress thread."""
    import nixl._api as api
    config = api.nixl_agent_config(enable_prog_thread=True, enable_listen_thread=False, backends=["UCX"])
    return api.nixl_agent(name, config)


def target(args):
    import numpy as np
    nx = make_endpoint("ferry-bench-target")
    buf = np.ones(args.max_size, dtype=np.uint8)
    nx.register_memory(np.array([[buf.ctypes.data, args.max_size, 0]], dtype=np.uint64), "DRAM")
    peer_common.emit({"meta": base64.b64encode(nx.get_agent_metadata()).decode(),
                      "addr": buf.ctypes.data, "len": args.max_size})
    peer_common.wait_for_quit()


def measure(hello, args):
    import numpy as np
    nx = make_endpoint("ferry-bench-initiator")
    buf = np.zeros(args.max_size, dtype=np.uint8)
    nx.register_memory(np.array([[buf.ctypes.data, args.max_size, 0]], dtype=np.uint64), "DRAM")
    remote = nx.add_remote_agent(base64.b64decode(hello["meta"]))
    results = []
    descs = int(os.environ.get("NIXL_PEER_DESCS", "0"))
    for size in args.sizes:
        k = descs if descs > 0 else peer_common.per_call(size)
        local = nx.get_xfer_descs(np.array([[buf.ctypes.data, size, 0]] * k, dtype=np.uint64), "DRAM")
        far = nx.get_xfer_descs(np.array([[hello["addr"], size, 0]] * k, dtype=np.uint64), "DRAM")
        row = {"size": size, "descs": k}
        for op in ("WRITE", "READ"):
            handle = nx.initialize_xfer(op, local, far, remote)

            def call():
                state = nx.transfer(handle)
                while state == "PROC":
                    state = nx.check_xfer_state(handle)
                if state != "DONE":
                    raise RuntimeError("NIXL %s of %d bytes ended in state %s" % (op, size, state))

            row[op.lower() + "_gbps"] = peer_common.time_loop(args.seconds, call, size * k) / 1e9
            nx.release_xfer_handle(handle)
        results.append(row)
    return "UCX (UCX_TLS=%s)" % os.environ.get("UCX_TLS", "default"), results


def main():
    return peer_common.main("nixl", "nixl", __file__, target, measure)


if __name__ == "__main__":
    sys.exit(main())
