"""The other side of the two-process Endpoint API tests (tests/python/test_endpoint_two_process.py).

Started as ``python endpoint_peer.py --num-qp N --size BYTES [--device NAME]``. It prints its
``endpoint_info()`` as one JSON line, reads the initiator's as one line, connects, prints
``{"ready": true}`` and then serves one JSON command per line on stdin, answering each with one
JSON line on stdout:

- ``{"cmd": "fill", "seed": S}``: fill the buffer "buf" with pattern S.
- ``{"cmd": "check", "seed": S, "offset": O, "length": L, "pattern_offset": P}``: compare.
- ``{"cmd": "imm_recv", "count": N}``: wait for N immediates, return them in order.
- ``{"cmd": "recv", "sizes": [...]}``: receive len(sizes) messages into "msg" (one after the other)
  and return each one's length and whether it matches the pattern of the same seed as its index.
- ``{"cmd": "send", "sizes": [...]}``: send messages of those sizes from "msg", filled with the
  pattern of their index.
- ``{"cmd": "quit"}``: shut down and exit.
"""

import argparse
import json
import sys

import numpy as np

import ferry


def pattern(seed, length, offset=0):
    i = np.arange(offset, offset + length, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-qp", type=int, default=1)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--device", default="")
    args = parser.parse_args()

    ep = ferry.RDMAEndpoint(device_name=args.device, ib_port=1, link_type="RoCE", num_qp=args.num_qp)
    buf = np.zeros(args.size, dtype=np.uint8)
    msg = np.zeros(args.size, dtype=np.uint8)
    ep.register_memory_region("buf", buf)
    msg_handle = ep.register_memory_region("msg", msg)
    reply({"info": ep.endpoint_info()})
    peer = json.loads(sys.stdin.readline())
    ep.connect(peer)
    reply({"ready": True})

    for line in sys.stdin:
        cmd = json.loads(line)
        name = cmd["cmd"]
        try:
            if name == "fill":
                buf[:] = pattern(cmd["seed"], args.size)
                reply({"ok": True})
            elif name == "check":
                off, length = cmd["offset"], cmd["length"]
                want = pattern(cmd["seed"], length, cmd.get("pattern_offset", 0))
                bad = np.nonzero(buf[off:off + length] != want)[0]
                reply({"ok": bad.size == 0, "first_bad": int(bad[0]) if bad.size else -1})
            elif name == "imm_recv":
                futures = [ep.imm_recv(None) for _ in range(cmd["count"])]
                values = []
                for f in futures:
                    f.wait(30)
                    values.append(f.imm_data())
                reply({"ok": True, "imms": values})
            elif name == "recv":
                results = []
                for index, size in enumerate(cmd["sizes"]):
                    f = ep.recv([(msg_handle, 0, args.size)], None)
                    f.wait(30)
                    n = f.nbytes()
                    results.append([n, bool(np.array_equal(msg[:n], pattern(index, n)))])
                reply({"ok": True, "results": results})
            elif name == "send":
                for index, size in enumerate(cmd["sizes"]):
                    msg[:size] = pattern(index, size)
                    ep.send([(msg_handle, 0, size)], None).wait(30)
                reply({"ok": True})
            elif name == "quit":
                ep.shutdown()
                reply({"ok": True})
                return 0
            else:
                reply({"ok": False, "error": "unknown command %r" % name})
        except ferry.Error as exc:
            reply({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
