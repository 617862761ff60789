#!/usr/bin/env python3
"""DLSlime's RDMAEndpoint (`dlslime` from PyPI): one-sided WRITE and READ between two processes on
one device, verified and then timed, for bench/rxe-compare (endpoint_peer.py has the method,
ferry_endpoint_peer.py runs the same against ferry).

DLSlime's tuple `(mr_key, remote_mr_key, target_offset, source_offset, length)` puts the remote
offset first for both operations: its one-sided post (engine/rdma/rdma_channel.cpp,
post_rc_oneside_batch) takes the local address from `source_offset` and the remote one from
`target_offset`, for a READ as for a WRITE. The verification in endpoint_peer.py checks that.

    dlslime_peer.py --device rxe0        # with dlslime installed in this interpreter
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import endpoint_peer  # noqa: E402


def make_endpoint(args):
    from dlslime import RDMAEndpoint
    return RDMAEndpoint(device_name=args.device, ib_port=1, link_type=args.link_type, num_qp=1)


def assignment(op, local, remote, local_offset, remote_offset, length):
    return (local, remote, remote_offset, local_offset, length)


def version():
    from importlib.metadata import version as dist_version
    return "dlslime " + dist_version("dlslime")


LIBRARY = endpoint_peer.Library("dlslime", "dlslime", make_endpoint, assignment, version)

if __name__ == "__main__":
    sys.exit(endpoint_peer.main(LIBRARY, __file__))
