"""The other process of the agent tests (tests/python/test_agent.py).

``python agent_peer.py --store URL --alias NAME [--size BYTES] [--secret S]`` starts an agent,
registers a buffer "kv" of --size bytes (zeros), prints ``{"ready": true, "uuid": ...}`` and serves one
JSON command per line on stdin, answering each with one JSON line:

- ``{"cmd": "check", "seed": S, "offset": O, "length": L}``: compare kv[O:O+L] with pattern S.
- ``{"cmd": "fill", "seed": S}``: fill kv with pattern S.
- ``{"cmd": "write", "peer": P, "seed": S, "length": L}``: fill kv[0:L] with pattern S and write it
  to the same bytes of P's "kv" (P need not have connected to us: a reply endpoint, or a lookup).
- ``{"cmd": "imm_recv", "peer": P}``: wait for P's next immediate.
- ``{"cmd": "recv", "peer": P, "length": L}``: receive one message into kv[0:L].
- ``{"cmd": "lanes", "peer": P}``: this side's lanes to P.
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
    parser.add_argument("--store", required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--peer-timeout", type=float, default=5.0)
    args = parser.parse_args()

    agent = ferry.start_peer_agent(store=args.store, alias=args.alias, device="soft_lo",
                                   secret=args.secret, peer_timeout=args.peer_timeout)
    kv = np.zeros(args.size, dtype=np.uint8)
    agent.register_memory_region("kv", kv)
    reply({"ready": True, "uuid": agent.uuid})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        try:
            if op == "check":
                o, n = cmd["offset"], cmd["length"]
                reply({"ok": bool((kv[o:o + n] == pattern(cmd["seed"], n)).all())})
            elif op == "fill":
                kv[:] = pattern(cmd["seed"], args.size)
                reply({"ok": True})
            elif op == "write":
                n = cmd["length"]
                kv[:n] = pattern(cmd["seed"], n)
                agent.write(cmd["peer"], [("kv", 0, 0, n)]).wait(30)
                reply({"ok": True})
            elif op == "imm_recv":
                f = agent.imm_recv(cmd["peer"])
                f.wait(30)
                reply({"ok": True, "imm": f.imm_data()})
            elif op == "recv":
                f = agent.recv(cmd["peer"], ("kv", 0, cmd["length"]))
                f.wait(30)
                reply({"ok": True, "nbytes": f.nbytes()})
            elif op == "lanes":
                reply({"ok": True, "lanes": agent.lanes(cmd["peer"])})
            elif op == "quit":
                agent.shutdown()
                reply({"ok": True})
                return
            else:
                reply({"ok": False, "error": "unknown command"})
        except ferry.Error as e:
            reply({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})


if __name__ == "__main__":
    main()
