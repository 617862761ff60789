"""asyncio for ferry's futures: ``await future`` on any future of the Endpoint API or the agent.

    import asyncio, ferry
    async def main(agent):
        await agent.connect_to("decode-0").ready()
        await agent.write("decode-0", [("kv", 0, 0, 4096)])
        n = await agent.recv("decode-0", ("kv", 0, 4096))     # the message's length

The futures complete on ferry's own threads; each running event loop gets one file descriptor
(an eventfd) it watches with ``add_reader``, which those threads signal: no polling thread, no sleep.
An awaited future gives what its ``wait()`` gives, except ``recv`` (the message's length) and
``imm_recv`` (the immediate). Cancelling the awaiting task does not stop the operation (RDMA work
in flight cannot be recalled); the future goes on and can be waited for again.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any, Dict, Generator, Tuple

from ._core import endpoint as _ep

__all__ = ["wait"]


class _LoopWaiter:
    """One event loop's descriptor and the futures it waits for."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._notifier = _ep.DoneNotifier()
        self._waiting: Dict[int, Tuple[_ep.Future, asyncio.Future[int]]] = {}
        self._tokens = itertools.count(1)
        loop.add_reader(self._notifier.fileno(), self._dispatch)

    def wait(self, future: _ep.Future) -> asyncio.Future[int]:
        waiter = self._loop.create_future()
        token = next(self._tokens)
        self._waiting[token] = (future, waiter)
        self._notifier.watch(future, token)  # may report at once: _dispatch runs from the loop
        return waiter

    def _dispatch(self) -> None:
        for token in self._notifier.drain():
            entry = self._waiting.pop(token, None)
            if entry is None or entry[1].done():
                continue
            future, waiter = entry
            try:
                result = future.wait(0)
                if isinstance(future, _ep.RecvFuture):
                    result = future.nbytes()
                elif isinstance(future, _ep.ImmRecvFuture):
                    result = future.imm_data()
            except BaseException as error:  # the operation's ferry error, as wait() raises it
                waiter.set_exception(error)
            else:
                waiter.set_result(result)


_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaiter] = weakref.WeakKeyDictionary()


def wait(future: _ep.Future) -> asyncio.Future[int]:
    """An asyncio future of the running loop that completes with ``future``: with what its
    ``wait()`` returns (0), the message's length for a ``recv``, the immediate for an
    ``imm_recv``, or the operation's error. Cancelling it leaves the operation running. Call it
    from a coroutine (RuntimeError without a running loop)."""
    loop = asyncio.get_running_loop()
    waiter = _waiters.get(loop)
    if waiter is None:
        waiter = _waiters[loop] = _LoopWaiter(loop)
    return waiter.wait(future)


def _await(self: _ep.Future) -> Generator[Any, None, int]:
    return wait(self).__await__()


_ep.Future.__await__ = _await  # type: ignore[method-assign]
