"""Run with an installed ferry wheel and nothing else (no NumPy): `ferry store` from PATH, then two
processes that find each other through it by alias; one WRITEs 4 MiB with an immediate into the
other's bytearray, which checks every byte. Exit code 0 when the block arrived intact.

    python wheel_transfer.py                 # the whole run
    python wheel_transfer.py receiver|sender STORE_URL
"""

import shutil
import socket
import subprocess
import sys

import ferry

SIZE = 4 << 20


def pattern(seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(256)) * (SIZE // 256)


def receiver(store):
    with ferry.start_peer_agent(store=store, alias="wheel-receiver") as agent:
        buf = bytearray(SIZE)
        agent.register_memory_region("block", buf)
        imm = agent.imm_recv("wheel-sender")
        print("receiver: ready", flush=True)  # the sender starts now: "block" is registered
        imm.wait(60)
        ok = bytes(buf) == pattern(imm.imm_data())
        print("receiver: %d bytes with immediate %d, %s" % (SIZE, imm.imm_data(), "verified" if ok else "CORRUPT"))
        return 0 if ok else 1


def sender(store):
    with ferry.start_peer_agent(store=store, alias="wheel-sender") as agent:
        buf = bytearray(pattern(5))
        agent.register_memory_region("block", buf)
        agent.write_with_imm("wheel-receiver", [("block", 0, 0, SIZE)], imm_data=5).wait(60)
        print("sender: wrote %d bytes" % SIZE)
        return 0


def main():
    if len(sys.argv) == 3:
        return {"receiver": receiver, "sender": sender}[sys.argv[1]](sys.argv[2])
    ferry_cmd = shutil.which("ferry")
    if ferry_cmd is None:
        print("wheel_transfer: no ferry program on PATH", file=sys.stderr)
        return 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = subprocess.Popen([ferry_cmd, "store", "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        store.stdout.readline()
        url = "ferry://127.0.0.1:%d" % port
        # The sender starts once the receiver has registered its region: a WRITE to a region not
        # registered yet is refused (NotFound), as it should be.
        receiving = subprocess.Popen([sys.executable, __file__, "receiver", url], stdout=subprocess.PIPE, text=True)
        ready = receiving.stdout.readline()
        if not ready.startswith("receiver: ready"):
            print("wheel_transfer: the receiver did not start: %r" % ready, file=sys.stderr)
            receiving.kill()
            return 1
        sending = subprocess.Popen([sys.executable, __file__, "sender", url])
        rc = max(p.wait(120) for p in (receiving, sending))
        print(receiving.stdout.read(), end="")
        return rc
    finally:
        store.terminate()
        store.wait(10)


if __name__ == "__main__":
    sys.exit(main())
