"""The agent from asyncio: every future is awaitable (no polling thread).

    python examples/agent_asyncio.py

Two agents in one process, connected by address (no store): one sends a message and writes a
region; the other awaits the message and reads the region back.
"""

import asyncio
import sys

import numpy as np

import ferry


async def main():
    with ferry.start_peer_agent(store="", alias="left") as left, \
            ferry.start_peer_agent(store="", alias="right") as right:
        src = np.arange(1 << 16, dtype=np.uint8)
        dst = np.zeros(1 << 16, dtype=np.uint8)
        inbox = np.zeros(256, dtype=np.uint8)
        left.register_memory_region("src", src)
        right.register_memory_region("dst", dst)
        right.register_memory_region("inbox", inbox)

        conn = left.connect_address(right.address)
        await conn.ready()
        await conn.write([("src", "dst", 0, 0, src.nbytes)])
        back = right.peer("left")  # the reply endpoint left's REQUEST made
        message = back.recv(("inbox", 0, 256))
        await conn.send(("src", 0, 100))
        length = await message
        ok = np.array_equal(dst, src) and length == 100 and np.array_equal(inbox[:100], src[:100])
        print("asyncio: wrote %d bytes and sent a %d-byte message, %s" % (src.nbytes, length,
                                                                         "verified" if ok else "CORRUPT"))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
