#!/usr/bin/env python3
"""bench/peers/nixl_peer.py, a program written for NIXL's Python API, run unchanged on ferry.nixl.

ferry.nixl.install_as_nixl() makes `import nixl` give ferry.nixl in this process and in the target
process this driver starts (it runs this file too); nixl_peer's target and measure then run as they
do on NIXL. Its agents ask for the UCX backend, which ferry.nixl serves with ferry's engine. The
path follows ferry's settings: FERRY_SOFT_SAME_HOST=0 in the environment keeps it on TCP, otherwise
two processes of one host take the same-host path. NIXL_PEER_DESCS sets the descriptors per request
as for nixl_peer.py. ferry must be importable (PYTHONPATH=build/python, or an installed wheel).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402


def main():
    try:
        import ferry.nixl
        ferry.nixl.install_as_nixl()
    except Exception as e:  # report, as every driver does, instead of a traceback
        peer_common.emit({"peer": "ferry.nixl", "error": "cannot import ferry.nixl: %s" % e})
        return 1
    import nixl_peer

    def measure(hello, args):
        _, results = nixl_peer.measure(hello, args)
        path = "tcp" if os.environ.get("FERRY_SOFT_SAME_HOST") == "0" else "default (same host)"
        return "ferry.nixl (%s path)" % path, results

    return peer_common.main("ferry.nixl", "nixl._api", __file__, nixl_peer.target, measure)


if __name__ == "__main__":
    sys.exit(main())
