"""Two processes that name each other and move a KV-cache block, through ferry's agent.

    python examples/agent_prefill_decode.py            # starts `ferry store`, then both sides

The "decode" process registers where the block should land and waits for an immediate; the
"prefill" process writes the block with WRITE_WITH_IMM, naming only the peer and the region. Neither
side exchanges addresses or keys by hand: they find each other through the embedded store
(`ferry store`), and the prefill side's write is queued until the wireup finished.
Runs on any Linux machine (ferry's software devices); uses an RDMA NIC where both sides have one.
"""

import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np

import ferry

BLOCK = 1 << 20


def block(seed):
    return ((np.arange(BLOCK, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed)) >> np.uint64(9)).astype(
        np.uint8)


def decode(store):
    with ferry.start_peer_agent(store=store, alias="decode-0") as agent:
        kv = np.zeros(BLOCK, dtype=np.uint8)
        agent.register_memory_region("kv", kv)
        print("decode: registered 'kv', waiting for prefill-0", flush=True)
        imm = agent.imm_recv("prefill-0")  # connects on first use; prefill's REQUEST may come first
        imm.wait(60)
        ok = np.array_equal(kv, block(imm.imm_data()))
        print("decode: block %d arrived, %s" % (imm.imm_data(), "verified" if ok else "CORRUPT"), flush=True)
        return 0 if ok else 1


def prefill(store):
    with ferry.start_peer_agent(store=store, alias="prefill-0") as agent:
        kv = block(7)
        agent.register_memory_region("kv", kv)
        conn = agent.connect_to("decode-0")             # returns at once
        agent.write_with_imm("decode-0", [("kv", 0, 0, BLOCK)], imm_data=7).wait(60)
        print("prefill: wrote 1 MiB to decode-0 over lane %s" % conn.lanes()["rma"], flush=True)
        # Stay until decode-0 has taken the block and left: leaving first would make its wait for
        # the immediate end with PeerGone if it had not received it yet.
        deadline = time.monotonic() + 60
        while conn.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
        return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) == 3:
        return {"decode": decode, "prefill": prefill}[sys.argv[1]](sys.argv[2])
    ferry_cmd = os.environ.get("FERRY", shutil.which("ferry") or "ferry")
    port = free_port()
    store = subprocess.Popen([ferry_cmd, "store", "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        store.stdout.readline()  # "ferry store: listening on ..."
        url = "ferry://127.0.0.1:%d" % port
        sides = [subprocess.Popen([sys.executable, __file__, role, url]) for role in ("decode", "prefill")]
        codes = [p.wait(120) for p in sides]
        return max(codes)
    finally:
        store.terminate()
        store.wait(10)


if __name__ == "__main__":
    sys.exit(main())
