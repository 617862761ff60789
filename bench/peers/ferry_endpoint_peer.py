#!/usr/bin/env python3
"""ferry's Endpoint API (`from ferry import RDMAEndpoint`): one-sided WRITE and READ between two
processes on one device, verified and then timed, for bench/rxe-compare (endpoint_peer.py has the
method, dlslime_peer.py runs the same against DLSlime).

ferry's tuple `(mr_key, remote_mr_key, target_offset, source_offset, length)` names its offsets
after the direction of the bytes (docs/endpoint.md): for a WRITE the target offset is the remote
one, for a READ it is the local one.

    FERRY_DEVICES=rxe0 PYTHONPATH=build/python ferry_endpoint_peer.py --device rxe0
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import endpoint_peer  # noqa: E402


def make_endpoint(args):
    from ferry import RDMAEndpoint
    return RDMAEndpoint(device_name=args.device, ib_port=1, link_type=args.link_type, num_qp=1)


def assignment(op, local, remote, local_offset, remote_offset, length):
    if op == "write":
        return (local, remote, remote_offset, local_offset, length)
    return (local, remote, local_offset, remote_offset, length)


def version():
    import ferry
    return "ferry %s (%s)" % (getattr(ferry, "__version__", "?"), os.path.dirname(ferry.__file__))


LIBRARY = endpoint_peer.Library("ferry", "ferry", make_endpoint, assignment, version)

if __name__ == "__main__":
    sys.exit(endpoint_peer.main(LIBRARY, __file__))
