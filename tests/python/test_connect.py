"""ferry.connect across two processes: readable and writable operations over serialized metadata.

Every test runs one asyncio loop in this process with a Connector, and drives a second Connector in
another process (connect_peer.py) by JSON lines on its stdin/stdout, read and written by this loop
(no thread). The metadata goes to the peer as its JSON text, as it would over any channel. Bytes are
checked exactly: ``pattern(seed, length)`` for ordinary buffers, and for the 512 MiB-1 GiB ones
``big_fill`` / ``big_check`` (every 8-byte word distinct, made and checked in steps), on both sides.

What is tested: the document's flow in both directions with every kind of memory a Descriptor takes
(NumPy, bytes, bytearray, memoryview, mmap, CPU torch tensors), single and list descriptors; 1 GiB
each way; that the passive side's wait burns no CPU and starts no thread; cancel on each side before
and during a transfer (the cancelling side's memory does not change after cancel() returns, the
other side ends ERRORED with ferry.Cancelled); tampered, truncated, expired and replayed metadata,
mismatched sizes and counts, the wrong kind, CUDA descriptors without a usable CUDA driver; a peer
killed in the middle of a transfer, and an owner paused (SIGSTOP) in the middle of one; a reader
killed right after begin_read (the owner's wait ends with PeerGone, its memory serves the next
reader); metadata nobody used (the owner's operation ends at its expiry); 1,000 concurrent
operations; the Connector's properties and ``with`` / ``async with``.

Every wait has a timeout. Where no event exists (an operation's status turning IN_PROGRESS, bytes
landing), the test looks at short intervals with a deadline; the only sleeps are the ones whose
passing is the point (metadata expiring, memory staying still after a cancel).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import asyncio  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pydantic  # noqa: E402
import pytest  # noqa: E402

import ferry  # noqa: E402
import ferry._core  # noqa: E402
from ferry.connect import (Connector, Descriptor, Device, DeviceKind, OperationKind,  # noqa: E402
                           OperationStatus, RdmaMetadata, ReadableOperation, ReadOperation,
                           WritableOperation, WriteOperation)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from connect_peer import Memory, big_check, big_fill, pattern  # noqa: E402

PEER = os.path.join(HERE, "connect_peer.py")
GiB = 1 << 30
WAIT = 30.0          # seconds for any one wait
TEST_LIMIT = 240.0   # seconds for a whole test's coroutine
S = OperationStatus

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def run(coro):
    asyncio.run(asyncio.wait_for(coro, TEST_LIMIT))


class PeerDied(Exception):
    pass


class Peer:
    """connect_peer.py in a subprocess: ``send`` a command, await its ``reply`` lines by id."""

    def __init__(self, *options):
        self.argv = [sys.executable, PEER] + [str(o) for o in options]
        self.ids = itertools.count(1)
        self.queues = {}
        self.eof = False
        self.proc = None

    async def __aenter__(self):
        loop = asyncio.get_running_loop()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=dict(os.environ, FERRY_LOG_LEVEL="error"))
        self.reader = asyncio.StreamReader(limit=256 << 20)
        self.rtransport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.reader),
                                                          self.proc.stdout)
        self.wtransport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, self.proc.stdin)
        self.writer = asyncio.StreamWriter(self.wtransport, protocol, None, loop)
        self.pump = None
        try:
            line = await asyncio.wait_for(self.reader.readline(), WAIT)
            self.hello = json.loads(line) if line else {}
            assert self.hello.get("ready"), "the peer did not start: %r (exit %s)" % (line, self.proc.poll())
        except BaseException:
            await self.close(kill=True)
            raise
        self.pump = asyncio.ensure_future(self._pump())
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False

    async def _pump(self):
        while True:
            line = await self.reader.readline()
            if not line:
                break
            msg = json.loads(line)
            queue = self.queues.get(msg.get("id"))
            if queue is not None:
                queue.put_nowait(msg)
        self.eof = True
        for queue in self.queues.values():
            queue.put_nowait(None)

    async def send(self, cmd, **fields):
        ident = next(self.ids)
        self.queues[ident] = asyncio.Queue()
        if self.eof:
            self.queues[ident].put_nowait(None)
        self.writer.write((json.dumps(dict(fields, cmd=cmd, id=ident)) + "\n").encode())
        await asyncio.wait_for(self.writer.drain(), WAIT)
        return ident

    async def reply(self, ident, timeout=WAIT):
        msg = await asyncio.wait_for(self.queues[ident].get(), timeout)
        if msg is None:
            raise PeerDied("the peer process ended (exit %s)" % self.proc.poll())
        return msg

    async def call(self, cmd, timeout=WAIT, **fields):
        return await self.reply(await self.send(cmd, **fields), timeout)

    async def transfer(self, cmd, timeout=WAIT, **fields):
        """A read or write by the peer: (its "begun" answer or None when refused at once, its "done")."""
        ident = await self.send(cmd, timeout=timeout, **fields)
        first = await self.reply(ident, timeout + 10)
        if first["event"] == "done":
            return None, first
        return first, await self.reply(ident, timeout + 10)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def close(self, kill=False):
        if self.proc.poll() is None and not kill:
            try:
                self.writer.write(b'{"cmd": "quit"}\n')
                if self.pump is not None:
                    await asyncio.wait_for(asyncio.shield(self.pump), 20)
                self.proc.wait(10)
            except (asyncio.TimeoutError, subprocess.TimeoutExpired, ConnectionError):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
        self.wtransport.close()
        self.rtransport.close()


async def waited(op, timeout=WAIT):
    """Awaits op's completion: None when it completed, else the ferry error it ended with."""
    try:
        await asyncio.wait_for(op.wait_for_completion(), timeout)
    except ferry.Error as e:
        return e
    return None


async def until(predicate, what, timeout=WAIT, step=0.001):
    """Looks at predicate() every `step` seconds (no event exists for it) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        await asyncio.sleep(step)


def text_of(op):
    return op.metadata().model_dump_json()


def kinds(*names):
    return [k for k in names if k != "torch" or HAVE_TORCH]


# ---------------------------------------------------------------------------------------------
# 1. The document's flow, both directions, every kind of memory.

@pytest.mark.parametrize("kind", ["numpy", "bytes", "bytearray", "memoryview", "mmap", "torch"])
def test_the_documents_flow_both_ways(kind):
    if kind == "torch" and not HAVE_TORCH:
        pytest.skip("torch is not installed")
    size = (1 << 20) + 12  # not a power of two; a multiple of 4 for a float32 tensor

    async def main():
        async with Connector() as connector, Peer() as peer:
            await connector.initialize()
            # The peer reads a readable of ours (a single Descriptor, as the document shows).
            src = Memory(kind, [size], [11])
            readable = connector.create_readable(src.descriptors(as_list=False))
            assert isinstance(readable, ReadableOperation) and readable.status == S.INITIALIZED
            into = kind if kind != "bytes" else "numpy"
            begun, done = await peer.transfer("read", metadata=text_of(readable), sizes=[size], kind=into,
                                              list=False, seeds=[11])
            assert begun and begun["status"] in ("IN_PROGRESS", "COMPLETE"), begun  # COMPLETE if it was quick
            assert (done["status"], done.get("error"), done["equal"]) == ("COMPLETE", None, [True]), done
            assert await waited(readable) is None      # the passive side's wait returns
            assert readable.status == S.COMPLETE and readable.nbytes == size
            assert src.check([11]) == [True], "the source changed"

            # The peer writes into a writable of ours.
            if kind == "bytes":
                # bytes is read-only: exposed to be written, or read into, it is refused.
                with pytest.raises(ferry.InvalidArgument):
                    connector.create_writable(Descriptor(b"\0" * size))
                other = await peer.call("create", op="r", what="readable", sizes=[size], seeds=[13])
                with pytest.raises(ferry.InvalidArgument):
                    await connector.begin_read(other["metadata"], Descriptor(bytes(size)))
                # ... and by the peer: its read into bytes is refused before anything moves.
                mine = connector.create_readable(Descriptor(pattern(14, size)))
                begun, done = await peer.transfer("read", metadata=text_of(mine), sizes=[size], kind="bytes",
                                                  list=False)
                assert begun is None and done["error"] == "InvalidArgument", done
                assert mine.status == S.INITIALIZED
                mine.cancel()
                # The peer's readable of bytes is still whole: read it here, into NumPy.
                got = np.zeros(size, np.uint8)
                op = await connector.begin_read(RdmaMetadata.model_validate_json(other["metadata"]), Descriptor(got))
                assert await waited(op) is None and op.status == S.COMPLETE
                assert np.array_equal(got, pattern(13, size))
                dst = Memory("numpy", [size])
            else:
                dst = Memory(kind, [size])
            writable = connector.create_writable(dst.descriptors(as_list=False))
            assert isinstance(writable, WritableOperation) and writable.status == S.INITIALIZED
            begun, done = await peer.transfer("write", metadata=text_of(writable), sizes=[size], kind=kind,
                                              list=False, seeds=[12])
            assert begun and (done["status"], done.get("error")) == ("COMPLETE", None), done
            assert await waited(writable) is None
            assert writable.status == S.COMPLETE and writable.nbytes == size
            assert dst.check([12]) == [True], "the written bytes differ"

    run(main())


def test_list_descriptors_of_mixed_memory_both_ways():
    sizes = [4097, 8192, 3, 65536, 1 << 20, 4096 * 3]
    src_kinds = kinds("numpy", "bytes", "bytearray", "memoryview", "mmap", "torch" if HAVE_TORCH else "float32")
    dst_kinds = kinds("mmap", "numpy", "bytearray", "memoryview", "numpy", "torch" if HAVE_TORCH else "float32")

    async def main():
        async with Connector() as connector, Peer() as peer:
            seeds = [21, 22, 23, 24, 25, 26]
            src = Memory(src_kinds, sizes, seeds)
            readable = connector.create_readable(src.descriptors())
            assert [d.size for d in src.descriptors()] == sizes
            begun, done = await peer.transfer("read", metadata=text_of(readable), sizes=sizes, kind=dst_kinds,
                                              seeds=seeds)
            assert begun and done["status"] == "COMPLETE" and done["equal"] == [True] * len(sizes), done
            assert await waited(readable) is None and readable.status == S.COMPLETE
            assert readable.nbytes == sum(sizes)

            dst = Memory(dst_kinds, sizes)
            writable = connector.create_writable(dst.descriptors())
            assert [d.size for d in writable.metadata().descriptors] == sizes
            seeds = [31, 32, 33, 34, 35, 36]
            begun, done = await peer.transfer("write", metadata=text_of(writable), sizes=sizes, kind=src_kinds,
                                              seeds=seeds)
            assert begun and done["status"] == "COMPLETE", done
            assert await waited(writable) is None and writable.status == S.COMPLETE
            assert dst.check(seeds) == [True] * len(sizes)

            # The other way round: the peer owns both, this process reads and writes.
            r = await peer.call("create", op="r", what="readable", sizes=sizes, kind=src_kinds, seeds=seeds)
            got = Memory(dst_kinds, sizes)
            op = await connector.begin_read(RdmaMetadata.model_validate_json(r["metadata"]), got.descriptors())
            assert isinstance(op, ReadOperation) and op.kind == OperationKind.READ
            assert await waited(op) is None and op.status == S.COMPLETE
            assert got.check(seeds) == [True] * len(sizes)
            w = await peer.call("create", op="w", what="writable", sizes=sizes, kind=dst_kinds)
            out = Memory(src_kinds, sizes, [41, 42, 43, 44, 45, 46])
            op = await connector.begin_write(out.descriptors(), w["metadata"])  # the JSON text itself
            assert isinstance(op, WriteOperation) and op.kind == OperationKind.WRITE
            assert await waited(op) is None and op.status == S.COMPLETE
            for name, seeds_ in (("r", None), ("w", [41, 42, 43, 44, 45, 46])):
                got_ = await peer.call("wait", op=name, seeds=seeds_)
                assert got_["status"] == "COMPLETE" and got_.get("error") is None, got_
                assert seeds_ is None or got_["equal"] == [True] * len(sizes), got_

    run(main())


# ---------------------------------------------------------------------------------------------
# 2. 1 GiB each way.

def test_one_gib_each_way():
    async def main():
        async with Connector() as connector, Peer() as peer:
            src = np.empty(GiB, np.uint8)
            big_fill(src, 51)
            readable = connector.create_readable(Descriptor(src))
            begun, done = await peer.transfer("read", metadata=text_of(readable), sizes=[GiB], seeds=[51], big=True,
                                              timeout=120)
            assert begun and (done["status"], done["equal"]) == ("COMPLETE", [True]), done
            assert await waited(readable) is None and readable.status == S.COMPLETE
            assert readable.nbytes == GiB
            del src

            dst = np.zeros(GiB, np.uint8)
            writable = connector.create_writable(Descriptor(dst))
            begun, done = await peer.transfer("write", metadata=text_of(writable), sizes=[GiB], seeds=[52], big=True,
                                              timeout=120)
            assert begun and done["status"] == "COMPLETE", done
            assert await waited(writable) is None and writable.status == S.COMPLETE
            assert writable.nbytes == GiB
            assert big_check(dst, 52), "the 1 GiB written by the peer differs"

    run(main())


# ---------------------------------------------------------------------------------------------
# 3. The passive side's wait: no polling in Python, no thread.

def test_the_passive_wait_burns_no_cpu_and_starts_no_thread():
    async def main():
        async with Connector() as connector, Peer() as peer:
            # A first operation wires the two agents up, so the one measured is only a wait.
            warm = connector.create_readable(Descriptor(pattern(60, 4096)))
            begun, done = await peer.transfer("read", metadata=text_of(warm), sizes=[4096], seeds=[60])
            assert done["status"] == "COMPLETE" and await waited(warm) is None

            size = 64 << 10
            readable = connector.create_readable(Descriptor(pattern(61, size)))
            threads_before = {t.ident for t in threading.enumerate()}
            count_before = threading.active_count()
            ident = await peer.send("read", metadata=text_of(readable), sizes=[size], seeds=[61], delay=0.6)
            wall0, usage0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
            waiting = asyncio.ensure_future(readable.wait_for_completion())
            # Half-way through the peer's delay: still waiting, and no thread was started for it.
            await asyncio.wait({waiting}, timeout=0.3)
            assert not waiting.done(), "the wait returned before the peer began"
            count_during = threading.active_count()
            threads_during = {t.ident for t in threading.enumerate()}
            await asyncio.wait_for(waiting, WAIT)
            wall1, usage1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
            cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
            assert readable.status == S.COMPLETE
            assert wall1 - wall0 >= 0.4, "the wait did not wait for the peer's late begin"
            assert cpu < 0.2, "the process used %.3f s of CPU in a %.3f s wait" % (cpu, wall1 - wall0)
            assert count_during == count_before == threading.active_count()
            assert threads_during == threads_before
            for event in ("begun", "done"):
                got = await peer.reply(ident)
                assert got["event"] == event
            assert got["status"] == "COMPLETE" and got["equal"] == [True], got

    run(main())


# ---------------------------------------------------------------------------------------------
# 4. Cancel, on each side, before and during a transfer.

CHUNK = ["--chunk-bytes", 1 << 20]
# An owner that moves 256 KiB at a time, one batch in flight: a 256 MiB transfer takes a thousand
# round trips to its agent's thread, long enough for a cancel made right after the begin.
SLOW = ["--chunk-bytes", 256 << 10, "--window", 1]


async def still(mem_views, seconds=0.5):
    """True when memory does not change for `seconds` after this call (snapshot, wait, compare)."""
    snapshot = [v.copy() for v in mem_views]
    await asyncio.sleep(seconds)  # nothing to await: the point is that nothing happens meanwhile
    return all(np.array_equal(v, s) for v, s in zip(mem_views, snapshot))


def test_the_owner_cancels_before_the_peer_begins():
    async def main():
        async with Connector() as connector, Peer() as peer:
            dst = np.zeros(1 << 20, np.uint8)
            writable = connector.create_writable(Descriptor(dst))
            text = text_of(writable)
            writable.cancel()
            assert writable.status == S.CANCELLED
            assert isinstance(await waited(writable), ferry.Cancelled)
            # The metadata of an operation cancelled before anyone began it grants nothing now.
            begun, done = await peer.transfer("write", metadata=text, sizes=[dst.size], seeds=[71])
            assert begun, done
            assert done["status"] == "ERRORED" and done["error"] in ("PermissionDenied", "Cancelled"), done
            assert not dst.any(), "a cancelled writable was written"
            assert writable.status == S.CANCELLED

            # A readable the same way: the peer's read ends ERRORED and nothing reaches its memory.
            readable = connector.create_readable(Descriptor(pattern(72, 1 << 20)))
            text = text_of(readable)
            readable.cancel()
            begun, done = await peer.transfer("read", metadata=text, sizes=[1 << 20], report_zeros=True)
            assert done["status"] == "ERRORED" and done["error"] in ("PermissionDenied", "Cancelled"), done
            assert done["zeros"], "bytes of a cancelled readable reached the peer"

    run(main())


def test_the_reader_cancels_right_after_it_began():
    size = 256 << 20

    async def main():
        async with Connector(chunk_bytes=1 << 20) as connector, Peer(*SLOW) as peer:
            warm = await peer.call("create", op="warm", what="readable", sizes=[4096], seeds=[80])
            op = await connector.begin_read(warm["metadata"], Descriptor(np.zeros(4096, np.uint8)))
            assert await waited(op) is None  # connected: the next BEGIN leaves at once
            r = await peer.call("create", op="r", what="readable", sizes=[size], seeds=[81], big=True)
            dst = np.zeros(size, np.uint8)
            op = await connector.begin_read(r["metadata"], Descriptor(dst))
            assert op.status == S.IN_PROGRESS
            op.cancel()
            after = op.status
            unchanged = await still([dst])
            owner = await peer.call("wait", op="r")
            if after == S.COMPLETE:
                # Legitimate only if all of it landed before the owner saw the CANCEL.
                assert owner["status"] == "COMPLETE" and big_check(dst, 81)
                pytest.fail("256 MiB were read before a cancel made right after the begin: cannot test it")
            assert after == S.CANCELLED
            assert isinstance(await waited(op), ferry.Cancelled)
            assert unchanged, "the reader's memory changed after cancel() returned"
            assert (owner["status"], owner["error"]) == ("ERRORED", "Cancelled"), owner
            assert not big_check(dst, 81)

    run(main())


def test_the_owner_cancels_during_a_transfer():
    async def attempt(connector, peer, n):
        dst = np.zeros(GiB, np.uint8)
        writable = connector.create_writable(Descriptor(dst))
        ident = await peer.send("write", metadata=text_of(writable), sizes=[GiB], seeds=[90 + n], big=True)
        await until(lambda: writable.nbytes > 0 or writable.status >= S.COMPLETE, "the owner's first batch")
        before, moved = writable.status, writable.nbytes
        writable.cancel()
        after = writable.status
        unchanged = await still([dst])
        begun = await peer.reply(ident)
        done = await peer.reply(ident)
        assert begun["event"] == "begun", begun
        if before != S.IN_PROGRESS or moved >= GiB or after == S.COMPLETE:
            # It ended first: then both sides completed and every byte is there.
            assert (after, done["status"]) == (S.COMPLETE, "COMPLETE"), (after, done)
            assert big_check(dst, 90 + n)
            return False
        assert after == S.CANCELLED
        assert isinstance(await waited(writable), ferry.Cancelled)
        assert unchanged, "the owner's memory changed after cancel() returned"
        assert (done["status"], done["error"]) == ("ERRORED", "Cancelled"), done
        assert not big_check(dst, 90 + n), "the whole transfer landed although it was cancelled during it"
        return True

    async def main():
        async with Connector(chunk_bytes=1 << 20) as connector, Peer(*CHUNK) as peer:
            for n in range(3):
                if await attempt(connector, peer, n):
                    return
            pytest.fail("three 1 GiB writes all completed before the owner could cancel one during it")

    run(main())


async def read_under_way(connector, peer, name, seed):
    """A 1 GiB readable of the peer's (op `name`), read by us until its first bytes landed: (dst, op)."""
    r = await peer.call("create", op=name, what="readable", sizes=[GiB], seeds=[seed], big=True, timeout=60)
    dst = np.zeros(GiB, np.uint8)
    words = dst.view(np.uint64)
    op = await connector.begin_read(r["metadata"], Descriptor(dst))
    await until(lambda: words[0] != 0 or op.status >= S.COMPLETE, "the first bytes to land")
    return dst, op


def read_ended_first(before, last, after, owner, dst, seed):
    """Whether the read of read_under_way() had ended before our cancel() (then both sides
    completed and every byte is there), from its status and last word before the cancel, its
    status after, and the owner's end."""
    if before == S.IN_PROGRESS and last == 0 and after != S.COMPLETE:
        return False
    assert (after, owner["status"]) == (S.COMPLETE, "COMPLETE"), (after, owner)
    assert big_check(dst, seed)
    return True


def test_the_reader_cancels_during_a_transfer():
    async def attempt(connector, peer, n):
        dst, op = await read_under_way(connector, peer, "r%d" % n, 100 + n)
        before, last = op.status, int(dst.view(np.uint64)[-1])
        op.cancel()
        after = op.status
        unchanged = await still([dst])
        owner = await peer.call("wait", op="r%d" % n)
        if read_ended_first(before, last, after, owner, dst, 100 + n):
            return False
        assert after == S.CANCELLED
        assert isinstance(await waited(op), ferry.Cancelled)
        assert unchanged, "the reader's memory changed after cancel() returned"
        assert (owner["status"], owner["error"]) == ("ERRORED", "Cancelled"), owner
        assert not big_check(dst, 100 + n)
        await peer.call("drop", op="r%d" % n)
        return True

    async def main():
        async with Connector(chunk_bytes=1 << 20) as connector, Peer(*CHUNK) as peer:
            for n in range(3):
                if await attempt(connector, peer, n):
                    return
            pytest.fail("three 1 GiB reads all completed before the reader could cancel one during it")

    run(main())


def test_a_peer_cancel_is_seen_by_the_owner_during_a_transfer():
    # The peer is the reader and cancels: our readable ends ERRORED with ferry.Cancelled, and the
    # peer's memory did not change after its cancel() returned.
    async def main():
        async with Connector(chunk_bytes=1 << 20) as connector, Peer(*CHUNK) as peer:
            for n in range(3):
                src = np.empty(GiB, np.uint8)
                big_fill(src, 110 + n)
                readable = connector.create_readable(Descriptor(src))
                ident = await peer.send("read", op="x", metadata=text_of(readable), sizes=[GiB], keep=True,
                                        seeds=[110 + n], big=True)
                assert (await peer.reply(ident))["event"] == "begun"
                await until(lambda: readable.nbytes > 0 or readable.status >= S.COMPLETE, "the first batch")
                cancelled = await peer.call("cancel", op="x")
                done = await peer.reply(ident)
                error = await waited(readable)
                if cancelled["status"] == "COMPLETE":
                    assert readable.status == S.COMPLETE and error is None and done["equal"] == [True]
                    continue
                assert cancelled["before"] == "IN_PROGRESS" and cancelled["status"] == "CANCELLED", cancelled
                assert cancelled["unchanged"], "the peer's memory changed after its cancel() returned"
                assert done["error"] == "Cancelled", done
                assert readable.status == S.ERRORED and isinstance(error, ferry.Cancelled), error
                assert 0 < readable.nbytes < GiB
                return
            pytest.fail("three 1 GiB reads all completed before the peer could cancel one during it")

    run(main())


# ---------------------------------------------------------------------------------------------
# 5. Metadata that must be refused, and descriptors that do not fit.

def tampered(text, change):
    d = json.loads(text)
    change(d)
    return json.dumps(d)


def test_tampered_and_replayed_metadata_is_refused_by_the_owner():
    size = 64 << 10

    def flip(s):
        return s[:-1] + ("0" if s[-1] != "0" else "1")

    changes = {
        "size": lambda d: d["descriptors"][0].update(size=size + 8),
        "worker": lambda d: d.update(worker="mallory"),
        "nonce": lambda d: d.update(nonce=flip(d["nonce"])),
        "expires": lambda d: d.update(expires=d["expires"] + 3600 * 1000),
        "operation": lambda d: d.update(operation=d["operation"] ^ 1),
        "tag": lambda d: d.update(tag=flip(d["tag"])),
    }

    async def main():
        async with Connector() as connector, Peer() as peer:
            readable = connector.create_readable(Descriptor(pattern(121, size)))
            text = text_of(readable)
            for field, change in changes.items():
                bad = tampered(text, change)
                n = size + 8 if field == "size" else size
                begun, done = await peer.transfer("read", metadata=bad, sizes=[n], report_zeros=True)
                assert begun, (field, done)
                assert (done["status"], done["error"]) == ("ERRORED", "PermissionDenied"), (field, done)
                assert done["zeros"], "bytes moved for metadata with a changed %s" % field
                assert readable.status == S.INITIALIZED, field
            # The real metadata still works, once.
            begun, done = await peer.transfer("read", metadata=text, sizes=[size], seeds=[121])
            assert (done["status"], done["equal"]) == ("COMPLETE", [True]), done
            assert await waited(readable) is None
            begun, done = await peer.transfer("read", metadata=text, sizes=[size], report_zeros=True)
            assert (done["status"], done["error"], done["zeros"]) == ("ERRORED", "PermissionDenied", True), done
            assert readable.status == S.COMPLETE

            # A writable: tampered, then the real one, then replayed; the owner's memory shows it.
            dst = np.zeros(size, np.uint8)
            writable = connector.create_writable(Descriptor(dst))
            text = text_of(writable)
            for field in ("size", "nonce", "worker"):
                n = size + 8 if field == "size" else size
                begun, done = await peer.transfer("write", metadata=tampered(text, changes[field]), sizes=[n],
                                                  seeds=[122])
                assert (done["status"], done["error"]) == ("ERRORED", "PermissionDenied"), (field, done)
                assert not dst.any() and writable.status == S.INITIALIZED
            begun, done = await peer.transfer("write", metadata=text, sizes=[size], seeds=[123])
            assert done["status"] == "COMPLETE" and await waited(writable) is None
            assert np.array_equal(dst, pattern(123, size))
            begun, done = await peer.transfer("write", metadata=text, sizes=[size], seeds=[124])
            assert (done["status"], done["error"]) == ("ERRORED", "PermissionDenied"), done
            assert np.array_equal(dst, pattern(123, size)), "a replayed write changed the owner's memory"
            assert connector.stats()["refused"] >= len(changes) + 1 + 3 + 1

    run(main())


def test_truncated_or_malformed_metadata_is_refused_by_begin():
    size = 4096

    async def main():
        async with Connector() as connector, Peer() as peer:
            r = await peer.call("create", op="r", what="readable", sizes=[size], seeds=[131])
            text = r["metadata"]
            d = json.loads(text)
            bad = [text[:len(text) // 2], text[:-1], "", "null", "{}", "[]", "not json", text + "x",
                   json.dumps(dict(d, extra=1)),
                   json.dumps({k: v for k, v in d.items() if k != "tag"}),
                   json.dumps(dict(d, operation=str(d["operation"]))),
                   json.dumps(dict(d, descriptors=[])),
                   json.dumps(dict(d, descriptors=[{"size": size, "device": "tpu:0"}])),  # no such device
                   json.dumps(dict(d, descriptors=[{"size": size, "device": "cuda:x"}]))]
            dst = np.zeros(size, np.uint8)
            for text_ in bad:
                with pytest.raises(ferry.InvalidArgument):
                    await connector.begin_read(text_, Descriptor(dst))
                with pytest.raises(ferry.InvalidArgument):
                    await connector.begin_read(text_.encode(), Descriptor(dst))
            for text_ in bad[:3]:
                with pytest.raises(pydantic.ValidationError):  # the model refuses it too
                    RdmaMetadata.model_validate_json(text_)
            with pytest.raises(ferry.InvalidArgument):
                await connector.begin_read(42, Descriptor(dst))
            # Nothing reached the owner: its readable is still there, and still works.
            assert (await peer.call("status", op="r"))["status"] == "INITIALIZED"
            op = await connector.begin_read(RdmaMetadata.model_validate_json(text), Descriptor(dst))
            assert await waited(op) is None and np.array_equal(dst, pattern(131, size))

    run(main())


def test_expired_metadata_is_refused():
    async def main():
        async with Connector(metadata_ttl=0.2) as short, Peer() as peer:
            readable = short.create_readable(Descriptor(pattern(141, 4096)))
            dst = np.zeros(4096, np.uint8)
            writable = short.create_writable(Descriptor(dst))
            assert writable.metadata().expires - readable.metadata().expires < 1000
            await asyncio.sleep(0.5)  # the point: the TTL passes
            begun, done = await peer.transfer("read", metadata=text_of(readable), sizes=[4096], report_zeros=True)
            # Refused before it began (InvalidArgument), or by the owner (ERRORED, PermissionDenied).
            if begun is None:
                assert done["error"] == "InvalidArgument" and "expired" in done["message"], done
            else:
                assert (done["status"], done["error"], done["zeros"]) == ("ERRORED", "PermissionDenied", True)
            begun, done = await peer.transfer("write", metadata=text_of(writable), sizes=[4096], seeds=[142])
            if begun is None:
                assert done["error"] == "InvalidArgument" and "expired" in done["message"], done
            else:
                assert (done["status"], done["error"]) == ("ERRORED", "PermissionDenied"), done
            assert not dst.any(), "expired metadata let the peer write"
            # Expired, not used: neither operation was begun, and each ended at its expiry.
            for op in (readable, writable):
                error = await waited(op, 5)
                assert op.status == S.ERRORED and isinstance(error, ferry.TimedOut), error

    run(main())


def test_sizes_counts_and_kinds_that_do_not_fit_are_refused():
    size = 8192

    async def main():
        async with Connector() as connector, Peer() as peer:
            readable = connector.create_readable(Descriptor(pattern(151, size)))
            writable = connector.create_writable(Descriptor(np.zeros(size, np.uint8)))
            rtext, wtext = text_of(readable), text_of(writable)
            refused = [
                ("read", rtext, [size - 1]), ("read", rtext, [size + 1]), ("read", rtext, [size, 16]),
                ("write", wtext, [size * 2]), ("write", wtext, [size // 2, size // 2]),
                ("write", rtext, [size]),   # a readable's metadata to begin_write
                ("read", wtext, [size]),    # a writable's to begin_read
            ]
            for cmd, text, sizes in refused:
                begun, done = await peer.transfer(cmd, metadata=text, sizes=sizes, seeds=[1] * len(sizes))
                assert begun is None and done["error"] == "InvalidArgument", (cmd, sizes, done)
            assert readable.status == S.INITIALIZED and writable.status == S.INITIALIZED
            # Here too, and our own metadata is refused: a connector moves bytes between workers.
            with pytest.raises(ferry.InvalidArgument):
                await connector.begin_write(Descriptor(np.zeros(size, np.uint8)), rtext)
            with pytest.raises(ferry.InvalidArgument):
                await connector.begin_read(rtext, Descriptor(np.zeros(size, np.uint8)))
            with pytest.raises(ferry.InvalidArgument):
                await connector.begin_read(rtext, [])
            with pytest.raises(ferry.InvalidArgument):
                connector.create_readable([])
            with pytest.raises(ferry.InvalidArgument):
                Descriptor(np.zeros(0, np.uint8))
            with pytest.raises(ferry.InvalidArgument):
                Descriptor(np.zeros((64, 64), np.uint8)[:, ::2])   # not contiguous
            # Both still work with what fits.
            begun, done = await peer.transfer("read", metadata=rtext, sizes=[size], seeds=[151])
            assert done["status"] == "COMPLETE" and done["equal"] == [True], done
            begun, done = await peer.transfer("write", metadata=wtext, sizes=[size], seeds=[152])
            assert done["status"] == "COMPLETE", done
            assert await waited(readable) is None and await waited(writable) is None

    run(main())


@pytest.mark.skipif(ferry._core.cuda()["usable"], reason="CUDA's driver is usable here: CUDA descriptors "
                    "are used, not refused (tests/python/test_gpu.py)")
def test_cuda_descriptors_are_not_supported_without_a_usable_driver():
    reason = ferry._core.cuda()["reason"]

    async def main():
        async with Connector() as connector, Peer() as peer:
            assert connector.is_cuda_available is False
            ref = bytearray(4096)
            host = Descriptor(ref)
            cuda = Descriptor((host.ptr, 4096, Device("cuda:0"), ref))
            assert cuda.device == Device((DeviceKind.CUDA, 0)) and cuda.device.kind == DeviceKind.CUDA
            assert cuda.size == 4096 and Device("cpu").kind == DeviceKind.HOST
            with pytest.raises(ferry.NotSupported, match="cuda:0: CUDA memory cannot be registered here") as refused:
                connector.create_readable(cuda)
            assert reason and reason in str(refused.value)
            with pytest.raises(ferry.NotSupported):
                connector.create_writable([host, cuda])
            r = await peer.call("create", op="r", what="readable", sizes=[4096], seeds=[161])
            w = await peer.call("create", op="w", what="writable", sizes=[4096])
            with pytest.raises(ferry.NotSupported):
                await connector.begin_read(r["metadata"], cuda)
            with pytest.raises(ferry.NotSupported):
                await connector.begin_write([cuda], w["metadata"])
            assert not any(ref)
            for name in ("r", "w"):
                assert (await peer.call("status", op=name))["status"] == "INITIALIZED"
            # A host tuple descriptor works.
            op = await connector.begin_read(r["metadata"], Descriptor((host.ptr, 4096, Device("cpu"), ref)))
            assert await waited(op) is None and bytes(ref) == pattern(161, 4096).tobytes()

    run(main())


# ---------------------------------------------------------------------------------------------
# 6. A peer killed in the middle of a transfer.

def test_a_peer_killed_mid_transfer_errors_the_survivors_operation():
    async def owner_survives():
        for n in range(3):
            async with Connector(chunk_bytes=1 << 20) as connector, Peer(*CHUNK) as peer:
                dst = np.zeros(GiB, np.uint8)
                writable = connector.create_writable(Descriptor(dst))
                ident = await peer.send("write", metadata=text_of(writable), sizes=[GiB], seeds=[170 + n], big=True)
                assert (await peer.reply(ident))["event"] == "begun"
                await until(lambda: writable.nbytes > 0 or writable.status >= S.COMPLETE, "the first batch")
                if writable.status != S.IN_PROGRESS:
                    continue
                peer.kill()
                killed = time.monotonic()
                error = await waited(writable, 15)
                if writable.status == S.COMPLETE:
                    continue
                assert time.monotonic() - killed < 15
                assert writable.status == S.ERRORED and isinstance(error, ferry.Error), error
                return
        pytest.fail("three 1 GiB writes completed before the peer could be killed during one")

    async def reader_survives():
        for n in range(3):
            async with Connector() as connector, Peer(*CHUNK) as peer:
                r = await peer.call("create", op="r", what="readable", sizes=[GiB], seeds=[180 + n], big=True,
                                    timeout=60)
                dst = np.zeros(GiB, np.uint8)
                words = dst.view(np.uint64)
                op = await connector.begin_read(r["metadata"], Descriptor(dst))
                await until(lambda: words[0] != 0 or op.status >= S.COMPLETE, "the first bytes")
                if op.status != S.IN_PROGRESS or words[-1] != 0:
                    continue
                peer.kill()
                killed = time.monotonic()
                error = await waited(op, 15)
                if op.status == S.COMPLETE:
                    continue
                assert time.monotonic() - killed < 15
                assert op.status == S.ERRORED and isinstance(error, ferry.Error), error
                return
        pytest.fail("three 1 GiB reads completed before the peer could be killed during one")

    async def main():
        await owner_survives()
        await reader_survives()

    run(main())


def test_a_reader_cancels_against_a_paused_owner_and_reads_again_once_it_resumes():
    # The owner's process is paused (SIGSTOP) in the middle of a read: the reader's cancel() still
    # returns, within cancel_grace (the owner cannot answer), with the operation CANCELLED and its
    # memory unchanged after it. Once the owner resumes, its readable ends ERRORED, and a new read
    # between the two completes byte for byte (on a new connection where the old one failed).
    # Where the pause caught the owner inside a copy into our buffers (its mark on them set), the
    # deregistration waits for that copy, so cancel() returns only once the owner resumes (3 s
    # after the pause, from a timer: this thread is in cancel()), and then at once; our memory is
    # still unchanged from then on. Such a pause is rare (the copy is a small part of the owner's
    # time), so an attempt held that way is tried again: at least one must return within the
    # grace, else cancel() waits for a paused owner it should not wait for.
    async def attempt(connector, peer, n):
        dst, op = await read_under_way(connector, peer, "p%d" % n, 190 + n)
        peer.proc.send_signal(signal.SIGSTOP)
        resumed_at = []

        def resume():
            resumed_at.append(time.monotonic())
            peer.proc.send_signal(signal.SIGCONT)

        timer = threading.Timer(3.0, resume)
        timer.start()
        try:
            before, last = op.status, int(dst.view(np.uint64)[-1])
            started = time.monotonic()
            op.cancel()
            returned = time.monotonic()
            took = returned - started
            after = op.status
            unchanged = await still([dst], 1.0)  # past cancel_grace (0.5 s), the owner paused or not
        finally:
            timer.join()
        held = bool(resumed_at) and returned >= resumed_at[0]  # cancel() waited for the owner's copy
        owner = await peer.call("wait", op="p%d" % n)
        if read_ended_first(before, last, after, owner, dst, 190 + n):
            return "ended"
        assert after == S.CANCELLED
        if held:
            assert returned - resumed_at[0] < 2.0, "cancel() returned %.1f s after the owner resumed" % (
                returned - resumed_at[0])
        else:
            assert took < 2.5, "cancel() waited %.1f s for the paused owner" % took
        assert isinstance(await waited(op), ferry.Cancelled)
        assert unchanged, "the reader's memory changed after cancel() returned"
        assert owner["status"] == "ERRORED", owner
        print("paused owner: cancel() took %.3f s%s; the owner ended %s (%s)" % (
            took, " (held by the owner's copy until it resumed)" if held else "", owner["status"],
            owner.get("error")))
        await peer.call("drop", op="p%d" % n)
        small = await peer.call("create", op="q%d" % n, what="readable", sizes=[1 << 20], seeds=[200 + n])
        buf = np.zeros(1 << 20, np.uint8)
        again = await connector.begin_read(small["metadata"], Descriptor(buf))
        assert await waited(again) is None, again.status
        assert np.array_equal(buf, pattern(200 + n, 1 << 20))
        assert (await peer.call("wait", op="q%d" % n))["status"] == "COMPLETE"
        await peer.call("drop", op="q%d" % n)
        return "held" if held else "cancelled"

    async def main():
        async with Connector(chunk_bytes=1 << 20, cancel_grace=0.5) as connector, Peer(*CHUNK) as peer:
            outcomes = []
            for n in range(4):
                outcomes.append(await attempt(connector, peer, n))
                if outcomes[-1] == "cancelled":
                    return
            pytest.fail("no cancel() of a read during a pause returned within the grace in four attempts: %s "
                        "(ended: the read completed first; held: cancel() waited for the owner to resume)"
                        % outcomes)

    run(main())


# ---------------------------------------------------------------------------------------------
# 6b. Every wait ends: a reader killed right after begin_read, metadata nobody used.

PEER_TIMEOUT = 5.0  # the agent's peerTimeout (AgentOptions), which the Connector keeps


def test_an_owner_whose_reader_is_killed_after_begin_read_ends_with_peer_gone_and_serves_another():
    size = 256 << 20
    ttl = 4.0

    async def main():
        seed = 191
        src = np.empty(size, np.uint8)
        big_fill(src, seed)
        # Small batches, one at a time: the transfer outlasts the kill that follows begin_read.
        async with Connector(chunk_bytes=64 << 10, window=1, metadata_ttl=ttl) as owner:
            for n in range(3):
                async with Peer("--worker-id", "doomed-reader-%d" % n) as reader:
                    # A first read wires the two up, so the BEGIN leaves inside begin_read.
                    warm = owner.create_readable(Descriptor(pattern(190, 4096)))
                    begun, done = await reader.transfer("read", metadata=text_of(warm), sizes=[4096], seeds=[190])
                    assert done["status"] == "COMPLETE" and done["equal"] == [True], done
                    readable = owner.create_readable(Descriptor(src))
                    created = time.monotonic()
                    ident = await reader.send("read", metadata=text_of(readable), sizes=[size], big=True)
                    assert (await reader.reply(ident))["event"] == "begun"
                    reader.kill()
                    killed = time.monotonic()
                    error = await waited(readable, 15)
                    if readable.status == S.COMPLETE:
                        continue  # the whole transfer landed before the kill: try again
                    assert readable.status == S.ERRORED, readable.status
                    if isinstance(error, ferry.PeerGone):
                        # The BEGIN arrived: the owner knows its reader, and ends when the agent
                        # finds it dead (at once for a killed process: its kernel closes the links).
                        assert time.monotonic() - killed < PEER_TIMEOUT + 1.0
                        assert "doomed-reader-%d" % n in str(error), error
                    else:
                        # The BEGIN never left the killed process: the metadata's expiry ends it.
                        assert isinstance(error, ferry.TimedOut) and "expired" in str(error), error
                        assert ttl - 0.1 < time.monotonic() - created < ttl + 1.0
                    break
            else:
                pytest.fail("three 256 MiB reads completed before the reader could be killed after its begin")
            # The owner's memory is unchanged, and serves a new read by another reader.
            assert big_check(src, seed), "the owner's memory changed"
            async with Peer() as other:
                again = owner.create_readable(Descriptor(src))
                begun, done = await other.transfer("read", metadata=text_of(again), sizes=[size], seeds=[seed],
                                                   big=True, timeout=60)
                assert done["status"] == "COMPLETE" and done["equal"] == [True], done
                assert await waited(again) is None

    run(main())


def test_metadata_nobody_used_ends_the_owners_operation_at_its_expiry():
    async def main():
        ttl = 1.0
        async with Connector(metadata_ttl=ttl) as owner, Peer() as peer:
            dst = np.zeros(4096, np.uint8)
            created = time.monotonic()
            readable = owner.create_readable(Descriptor(pattern(201, 4096)))
            writable = owner.create_writable(Descriptor(dst))
            errors = await asyncio.gather(waited(readable, 10), waited(writable, 10))
            elapsed = time.monotonic() - created
            assert ttl - 0.05 < elapsed < ttl + 0.5, elapsed
            for op, error, kind in ((readable, errors[0], "readable"), (writable, errors[1], "writable")):
                assert op.status == S.ERRORED and isinstance(error, ferry.TimedOut), error
                assert "expired" in str(error) and kind in str(error) and str(op._op.id) in str(error), error
            # Its metadata is refused as expired, not as used, and nothing is written.
            begun, done = await peer.transfer("write", metadata=text_of(writable), sizes=[4096], seeds=[202])
            assert done["error"] in ("InvalidArgument", "PermissionDenied") and "expired" in done["message"], done
            assert not dst.any()

    run(main())


# ---------------------------------------------------------------------------------------------
# 7. 1,000 concurrent operations.

def test_a_thousand_concurrent_operations():
    n = 1000
    sizes = [4096 + (i * 7919) % (60 << 10) for i in range(n)]
    seeds = [1000 + i for i in range(n)]

    async def main():
        async with Connector() as connector, Peer() as peer:
            sources = [pattern(s, size) for s, size in zip(seeds, sizes)]
            readables = [connector.create_readable(Descriptor(src)) for src in sources]
            texts = [text_of(r) for r in readables]
            assert len({json.loads(t)["operation"] for t in texts}) == n
            ident = await peer.send("read_many", metadata=texts, sizes=sizes, seeds=seeds, timeout=120)
            results = await asyncio.wait_for(asyncio.gather(*[r.wait_for_completion() for r in readables],
                                                            return_exceptions=True), 120)
            got = await peer.reply(ident, 130)
            assert got.get("error") is None, got
            assert got["statuses"] == {"COMPLETE": n} and got["bad"] == [] and got["errors"] == [], got
            assert all(r is None for r in results), [r for r in results if r is not None][:3]
            assert all(r.status == S.COMPLETE for r in readables)
            assert sum(r.nbytes for r in readables) == sum(sizes)
            assert all(np.array_equal(src, pattern(s, size)) for src, s, size in zip(sources, seeds, sizes))
            assert connector.stats()["live"] == 0

    run(main())


# ---------------------------------------------------------------------------------------------
# 8. The Connector's properties, the enums, with / async with.

def test_connector_properties_and_enums():
    async def main():
        runtime = object()
        connector = Connector("prefill-0", namespace="ns-a", runtime=runtime)
        assert connector.name == "prefill-0" and connector.namespace == "ns-a"
        await connector.initialize()
        await connector.initialize()  # idempotent
        try:
            assert connector.name == "prefill-0" and connector.namespace == "ns-a"
            assert connector.is_cuda_available is ferry._core.cuda()["usable"]
            assert connector.runtime() is runtime
            readable = connector.create_readable(Descriptor(pattern(1, 64)))
            md = readable.metadata()
            assert md.worker == "prefill-0" and md.operation_kind == OperationKind.READ
            assert readable.kind == OperationKind.READ
            writable = connector.create_writable(Descriptor(bytearray(64)))
            assert writable.metadata().operation_kind == OperationKind.WRITE and writable.kind == OperationKind.WRITE
        finally:
            connector.shutdown()
        assert readable.status == S.ERRORED and isinstance(await waited(readable), ferry.Cancelled)
        async with Connector() as anonymous:
            assert anonymous.runtime() is None
            assert isinstance(anonymous.name, str) and anonymous.name
            assert anonymous.namespace == "default"
            assert anonymous.create_readable(Descriptor(b"x")).metadata().worker == anonymous.name
        async with Peer("--worker-id", "decode-0", "--namespace", "ns-b") as peer:
            assert (peer.hello["name"], peer.hello["namespace"]) == ("decode-0", "ns-b")
            r = await peer.call("create", op="r", what="readable", sizes=[64], seeds=[2])
            assert RdmaMetadata.model_validate_json(r["metadata"]).worker == "decode-0"
        assert (OperationKind.UNSPECIFIED, OperationKind.READ, OperationKind.WRITE) == (0, 1, 2)
        assert [s.name for s in OperationStatus] == ["UNINITIALIZED", "INITIALIZED", "IN_PROGRESS", "COMPLETE",
                                                     "CANCELLED", "ERRORED"]
        assert [int(s) for s in OperationStatus] == [0, 1, 2, 3, 4, 5]
        assert (DeviceKind.UNSPECIFIED, DeviceKind.HOST, DeviceKind.CUDA) == (0, 1, 2)

    run(main())


def test_leaving_with_or_async_with_cancels_an_operation_not_ended():
    async def main():
        async with Connector() as connector, Peer(*SLOW) as peer:
            # with, on an owner's operation nobody began: revoked.
            dst = np.zeros(4096, np.uint8)
            with connector.create_writable(Descriptor(dst)) as writable:
                assert writable.status == S.INITIALIZED
                text = text_of(writable)
            assert writable.status == S.CANCELLED and isinstance(await waited(writable), ferry.Cancelled)
            begun, done = await peer.transfer("write", metadata=text, sizes=[4096], seeds=[191])
            assert done["status"] == "ERRORED" and done["error"] in ("PermissionDenied", "Cancelled"), done
            assert not dst.any()

            # async with, on a read in progress: cancelled; the owner's readable ends ERRORED (Cancelled).
            r = await peer.call("create", op="r", what="readable", sizes=[256 << 20], seeds=[192], big=True)
            into = np.zeros(256 << 20, np.uint8)
            async with await connector.begin_read(r["metadata"], Descriptor(into)) as op:
                assert op.status == S.IN_PROGRESS
            assert op.status == S.CANCELLED and isinstance(await waited(op), ferry.Cancelled)
            owner = await peer.call("wait", op="r")
            assert (owner["status"], owner["error"]) == ("ERRORED", "Cancelled"), owner

            # Leaving a block of an operation that completed changes nothing.
            readable = connector.create_readable(Descriptor(pattern(193, 4096)))
            async with readable:
                begun, done = await peer.transfer("read", metadata=text_of(readable), sizes=[4096], seeds=[193])
                assert done["status"] == "COMPLETE" and await waited(readable) is None
            assert readable.status == S.COMPLETE

            # Dropping the last reference to an operation not ended cancels it too.
            dst2 = np.zeros(4096, np.uint8)
            dropped = connector.create_writable(Descriptor(dst2))
            text = text_of(dropped)
            del dropped
            gc.collect()
            begun, done = await peer.transfer("write", metadata=text, sizes=[4096], seeds=[194])
            assert done["status"] == "ERRORED" and done["error"] in ("PermissionDenied", "Cancelled"), done
            assert not dst2.any()

    run(main())
