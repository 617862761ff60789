"""Every ferry future is awaitable from asyncio (ferry.aio): completed through one eventfd per event
loop that the loop watches, with no polling thread and no sleep loop."""

import asyncio
import threading
import time

import numpy as np
import pytest

import ferry
from ferry import RDMAEndpoint


def pattern(seed, length):
    return ((np.arange(length, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed)) >> np.uint64(7)).astype(
        np.uint8)


@pytest.fixture
def pair():
    a, b = RDMAEndpoint(num_qp=1), RDMAEndpoint(num_qp=1)
    b.connect(a.endpoint_info())
    a.connect(b.endpoint_info())
    yield a, b
    a.shutdown()
    b.shutdown()


def test_every_operation_can_be_awaited(pair):
    a, b = pair
    src, dst = pattern(1, 1 << 16), np.zeros(1 << 16, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    remote = a.register_remote_memory_region("d", b.mr_info()["d"])

    async def main():
        assert await a.write([(hs, remote, 0, 0, 4096)], None) == 0
        assert np.array_equal(dst[:4096], src[:4096])
        back = np.zeros(4096, dtype=np.uint8)
        hb = a.register_memory_region("back", back)
        await a.read([(hb, remote, 0, 0, 4096)], None)
        assert np.array_equal(back, src[:4096])
        recv = b.recv([(hd, 0, 1 << 16)], None)
        await a.send([(hs, 0, 1000)], None)
        assert await recv == 1000
        imm = b.imm_recv()
        await a.write_with_imm([(hs, remote, 0, 0, 8)], 42, None)
        assert await imm == 42

    asyncio.run(main())


def test_errors_are_raised_by_await(pair):
    a, b = pair
    src, dst = pattern(2, 5000), np.zeros(5000, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)

    async def main():
        recv = b.recv([(hd, 0, 100)], None)
        await a.send([(hs, 0, 5000)], None)
        with pytest.raises(ferry.InvalidArgument, match="longer than the receive buffer"):
            await recv

    asyncio.run(main())


def test_a_thousand_awaits_at_once_with_no_thread_and_no_spinning(pair):
    a, b = pair
    n = 1000
    src, dst = pattern(3, n * 64), np.zeros(n * 64, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    remote = a.register_remote_memory_region("d", b.mr_info()["d"])
    threads = threading.active_count()

    async def main():
        results = await asyncio.gather(*[a.write([(hs, remote, i * 64, i * 64, 64)], None) for i in range(n)])
        assert results == [0] * n
        assert np.array_equal(dst, src)
        # A receive that completes 0.6 s later: the loop sleeps in the meantime.
        recv = b.recv([(hd, 0, 64)], None)
        loop = asyncio.get_running_loop()
        loop.call_later(0.6, lambda: a.send([(hs, 0, 64)], None))
        cpu, wall = time.process_time(), time.monotonic()
        assert await recv == 64
        assert time.monotonic() - wall >= 0.5
        assert time.process_time() - cpu < 0.3, "the wait must not poll"

    asyncio.run(main())
    assert threading.active_count() == threads, "awaiting must not start a thread"


def test_cancelling_the_awaiting_task_leaves_the_operation_running(pair):
    a, b = pair
    src, dst = pattern(4, 64), np.zeros(64, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    recv = b.recv([(hd, 0, 64)], None)

    async def main():
        task = asyncio.ensure_future(asyncio.wait_for(recv, 0.2))
        with pytest.raises(asyncio.TimeoutError):
            await task
        await a.send([(hs, 0, 64)], None)
        assert await recv == 64
        assert np.array_equal(dst, src)

    asyncio.run(main())


def test_the_agent_is_awaitable_too():
    async def main():
        with ferry.start_peer_agent(store="", alias="a", device="soft_lo") as a, \
                ferry.start_peer_agent(store="", alias="b", device="soft_lo", connect_timeout=1.0) as b:
            x, y = pattern(5, 4096), np.zeros(4096, dtype=np.uint8)
            a.register_memory_region("x", x)
            b.register_memory_region("y", y)
            conn = a.connect_address(b.address)
            assert await conn.ready() == 0
            await a.write(conn, [("x", "y", 0, 0, 4096)])
            assert np.array_equal(x, y)
            # A wireup that cannot finish: its deadline's error comes out of await.
            with ferry.start_peer_agent(store="memory://aio", alias="c", device="soft_lo",
                                        connect_timeout=0.5) as c:
                with pytest.raises(ferry.TimedOut, match="nobody"):
                    await c.connect_to("nobody").ready()

    asyncio.run(main())
