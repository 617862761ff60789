"""The other process of the connector tests (tests/python/test_connect.py).

``python connect_peer.py [--worker-id NAME] [--namespace NS] [--chunk-bytes N] [--window N]
[--metadata-ttl S] [--cancel-grace S]`` starts a ``ferry.connect.Connector``, prints
``{"ready": true, "name": ..., "namespace": ...}`` and serves JSON commands, one per line on stdin.
Commands run concurrently (each in its own asyncio task): every command carries an ``"id"`` and
every line answered for it carries the same ``"id"``. A command that fails answers
``{"id": I, "event": "done", "error": "<ferry exception class>", "message": ...}``.

Memory is made of ``sizes`` (one descriptor each) of a ``kind`` (or a list of kinds, one per
size): numpy, float32 (a NumPy array of another dtype), bytes, bytearray, memoryview, mmap or torch
(a CPU tensor, float32 where the size allows); ``"list": false`` passes a single Descriptor (one
size) instead of a list. ``seeds`` fill it with ``pattern(seed, size)`` (``"big": true``:
``big_fill``, the cheap pattern of large buffers); without seeds it is zeros. ``equal`` answers, per
descriptor, whether the memory holds its seed's pattern. ``form`` says how each Descriptor is
made: ``"object"`` (the default, ``Descriptor(obj)``), ``"array_device"`` (``Descriptor((obj,
"cpu"))``) or ``"ptr_size"`` (``Descriptor((ptr, size, "cpu", obj))``). ``metadata`` may be the
JSON text or the ``model_dump()`` dict, which is then given to ``RdmaMetadata.model_validate``.

- ``create``  ``{op, what: "readable"|"writable", sizes, kind, list, seeds, form, awaited}``: create
  a passive operation named ``op`` (``"awaited": true``: ``await connector.create_readable(...)``);
  answers ``{"metadata": text}``.
- ``read`` / ``write``  ``{op, metadata, sizes, kind, list, seeds, big, delay, timeout}``: after
  ``delay`` seconds, begin a read of ``metadata`` into new zeroed memory (a write of memory filled
  with ``seeds``); answers ``{"event": "begun", "status"}`` once begun, then ``{"event": "done",
  "status", "error", "message", "equal"}`` when it ended (``equal``: a read's memory checked
  against ``seeds``; ``"report_zeros": true`` adds ``zeros``, whether the memory is still all
  zeros; ``"keep": true`` keeps the memory and the op afterwards; ``"results": true`` adds a read's
  ``results``, whether ``op.results()`` gave back the Descriptors it was begun with).
- ``wait``  ``{op, timeout, seeds, big, report_zeros}``: await a (passive or active) operation;
  answers ``{"event": "done", "status", "error", "message", "equal"}``.
- ``status``  ``{op}``: ``{"status", "bytes"}``.
- ``cancel``  ``{op, settle}``: cancel the operation, snapshot its memory at once, wait ``settle``
  seconds and compare: ``{"before": status before, "status", "unchanged": bool}``.
- ``read_many``  ``{metadata: [texts], sizes: [...], seeds: [...], timeout}``: begin one read per
  metadata concurrently (asyncio.gather), await them all; answers ``{"statuses": {name: count},
  "bad": [indices whose bytes differ], "errors": [...]}``.
- ``drop``  ``{op}``: forget an operation and its memory.
- ``quit``: shut the connector down and exit.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import ferry  # noqa: E402
from ferry.connect import Connector, Descriptor, RdmaMetadata  # noqa: E402

BIG_STEP = 4 << 20  # words per step of big_fill / big_check (32 MiB)


def pattern(seed, length, offset=0):
    i = np.arange(offset, offset + length, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def _big_words(seed, start, stop):
    w = np.arange(start, stop, dtype=np.uint64)
    w *= np.uint64(0x9E3779B97F4A7C15)  # odd: every 8-byte word of the buffer differs
    w += np.uint64(seed * 0x100000001B3 + 1)
    return w


def big_fill(array, seed):
    """Fills a uint8 array (length a multiple of 8) with seed's pattern of large buffers, by steps."""
    words = array.view(np.uint64)
    for start in range(0, words.size, BIG_STEP):
        stop = min(words.size, start + BIG_STEP)
        words[start:stop] = _big_words(seed, start, stop)


def big_check(array, seed):
    words = array.view(np.uint64)
    for start in range(0, words.size, BIG_STEP):
        stop = min(words.size, start + BIG_STEP)
        if not np.array_equal(words[start:stop], _big_words(seed, start, stop)):
            return False
    return True


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Memory:
    """The objects handed to Descriptor, and uint8 NumPy views of them to fill and check."""

    def __init__(self, kind, sizes, seeds=None, big=False):
        self.objects, self.views = [], []
        kinds = kind if isinstance(kind, list) else [kind] * len(sizes)
        for i, (kind, size) in enumerate(zip(kinds, sizes)):
            seed = seeds[i] if seeds else None
            if seed is None:
                data = np.zeros(size, dtype=np.uint8)
            elif big:
                data = np.empty(size, dtype=np.uint8)
                big_fill(data, seed)
            else:
                data = pattern(seed, size)
            if kind == "numpy":
                obj = data
            elif kind == "bytes":
                obj = data.tobytes()
            elif kind == "bytearray":
                obj = bytearray(data.tobytes())
            elif kind == "memoryview":
                obj = memoryview(bytearray(data.tobytes()))
            elif kind == "mmap":
                obj = mmap.mmap(-1, size)
                obj[:] = data.tobytes()
            elif kind == "float32":
                obj = data.view(np.float32)  # another dtype: the descriptor is its bytes
            elif kind == "torch":
                import torch
                # float32 where the size allows it: the descriptor is numel * element_size bytes
                obj = torch.from_numpy(data.view(np.float32) if size % 4 == 0 else data)
            else:
                raise ValueError("unknown kind %r" % kind)
            self.objects.append(obj)
            self.views.append(self._view(obj))

    @staticmethod
    def _view(obj):
        if isinstance(obj, np.ndarray):
            return obj.view(np.uint8)
        if hasattr(obj, "numpy"):
            return obj.numpy().view(np.uint8)
        return np.frombuffer(obj, dtype=np.uint8)

    def descriptors(self, as_list=True, form="object"):
        if form == "array_device":
            ds = [Descriptor((o, "cpu")) for o in self.objects]
        elif form == "ptr_size":
            ds = [Descriptor((v.ctypes.data, v.nbytes, "cpu", o)) for o, v in zip(self.objects, self.views)]
        else:
            ds = [Descriptor(o) for o in self.objects]
        self.made = ds
        if not as_list:
            assert len(ds) == 1
            return ds[0]
        return ds

    def check(self, seeds, big=False):
        if not seeds:
            return None
        return [bool(big_check(v, s)) if big else bool(np.array_equal(v, pattern(s, v.size)))
                for v, s in zip(self.views, seeds)]

    def zeros(self):
        return all(not v.any() for v in self.views)

    def snapshot(self):
        return [v.copy() for v in self.views]

    def same_as(self, snapshot):
        return all(np.array_equal(v, s) for v, s in zip(self.views, snapshot))


def error_fields(e):
    if isinstance(e, ferry.Error):
        return {"error": type(e).__name__, "message": str(e)}
    if isinstance(e, asyncio.TimeoutError):
        return {"error": "TimeoutError", "message": "the wait timed out"}
    return {"error": "Python:" + type(e).__name__, "message": str(e)}


class Server:
    def __init__(self, connector):
        self.connector = connector
        self.ops = {}       # name -> operation
        self.memory = {}    # name -> Memory

    async def finish(self, cmd, name, op, mem):
        out = {"id": cmd["id"], "event": "done"}
        try:
            await asyncio.wait_for(op.wait_for_completion(), cmd.get("timeout", 60))
        except (ferry.Error, asyncio.TimeoutError) as e:
            out.update(error_fields(e))
        out["status"] = op.status.name
        out["equal"] = mem.check(cmd.get("seeds"), cmd.get("big", False)) if out.get("error") is None else None
        if cmd.get("report_zeros"):
            out["zeros"] = mem.zeros()
        return out

    async def handle(self, cmd):
        what = cmd["cmd"]
        ident = cmd["id"]
        c = self.connector
        if what == "create":
            mem = Memory(cmd.get("kind", "numpy"), cmd["sizes"], cmd.get("seeds"), cmd.get("big", False))
            descs = mem.descriptors(cmd.get("list", True), cmd.get("form", "object"))
            op = c.create_readable(descs) if cmd["what"] == "readable" else c.create_writable(descs)
            if cmd.get("awaited"):
                op = await op
            self.ops[cmd["op"]], self.memory[cmd["op"]] = op, mem
            return {"id": ident, "metadata": op.metadata().model_dump_json(), "status": op.status.name}
        if what in ("read", "write"):
            if cmd.get("delay"):
                await asyncio.sleep(cmd["delay"])  # the test wants a late begin, not a synchronisation
            seeds = cmd.get("seeds")
            mem = Memory(cmd.get("kind", "numpy"), cmd["sizes"], seeds if what == "write" else None,
                         cmd.get("big", False))
            descs = mem.descriptors(cmd.get("list", True), cmd.get("form", "object"))
            metadata = cmd["metadata"]
            metadata = RdmaMetadata.model_validate(metadata) if isinstance(metadata, dict) \
                else RdmaMetadata.model_validate_json(metadata)
            if what == "read":
                op = await c.begin_read(metadata, descs)
            else:
                op = await c.begin_write(descs, metadata)
            name = cmd.get("op", "op-%d" % ident)
            self.ops[name], self.memory[name] = op, mem
            reply({"id": ident, "event": "begun", "status": op.status.name})
            out = await self.finish(dict(cmd, seeds=seeds if what == "read" else None), name, op, mem)
            if cmd.get("results") and out.get("error") is None:
                got = op.results()
                out["results"] = len(got) == len(mem.made) and all(a is b for a, b in zip(got, mem.made))
            if not cmd.get("keep"):
                self.ops.pop(name, None)
                self.memory.pop(name, None)
            return out
        if what == "wait":
            return await self.finish(cmd, cmd["op"], self.ops[cmd["op"]], self.memory[cmd["op"]])
        if what == "status":
            op = self.ops[cmd["op"]]
            return {"id": ident, "status": op.status.name, "bytes": op.nbytes}
        if what == "cancel":
            op, mem = self.ops[cmd["op"]], self.memory[cmd["op"]]
            before = op.status.name
            op.cancel()
            snap = mem.snapshot()
            # Nothing can be awaited here: the check is that nothing happens for a while.
            await asyncio.sleep(cmd.get("settle", 0.5))
            return {"id": ident, "before": before, "status": op.status.name, "unchanged": mem.same_as(snap)}
        if what == "read_many":
            texts, sizes, seeds = cmd["metadata"], cmd["sizes"], cmd["seeds"]
            mems = [Memory("numpy", [n]) for n in sizes]
            ops = await asyncio.gather(*[c.begin_read(RdmaMetadata.model_validate_json(t), m.descriptors(False))
                                         for t, m in zip(texts, mems)])
            results = await asyncio.wait_for(
                asyncio.gather(*[op.wait_for_completion() for op in ops], return_exceptions=True),
                cmd.get("timeout", 60))
            statuses = {}
            for op in ops:
                statuses[op.status.name] = statuses.get(op.status.name, 0) + 1
            errors = ["%s: %s" % (type(r).__name__, r) for r in results if isinstance(r, BaseException)]
            bad = [i for i, (m, s) in enumerate(zip(mems, seeds)) if not m.check([s])[0]]
            return {"id": ident, "event": "done", "statuses": statuses, "bad": bad, "errors": errors[:5]}
        if what == "drop":
            self.ops.pop(cmd["op"], None)
            self.memory.pop(cmd["op"], None)
            return {"id": ident, "ok": True}
        return {"id": ident, "event": "done", "error": "Python:ValueError", "message": "unknown command %r" % what}

    async def run(self, cmd):
        try:
            out = await self.handle(cmd)
        except Exception as e:  # noqa: BLE001  (reported to the test, which decides)
            out = dict({"id": cmd.get("id"), "event": "done"}, **error_fields(e))
        reply(out)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--chunk-bytes", type=int, default=64 << 20)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--metadata-ttl", type=float, default=600.0)
    parser.add_argument("--cancel-grace", type=float, default=2.0)
    args = parser.parse_args()

    connector = Connector(args.worker_id, namespace=args.namespace, chunk_bytes=args.chunk_bytes,
                          window=args.window, metadata_ttl=args.metadata_ttl, cancel_grace=args.cancel_grace)
    await connector.initialize()
    server = Server(connector)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=256 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    reply({"ready": True, "name": connector.name, "namespace": connector.namespace})
    tasks = set()
    while True:
        line = await stdin.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        task = asyncio.ensure_future(server.run(cmd))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()
    connector.shutdown()
    reply({"ok": True, "bye": True})


if __name__ == "__main__":
    asyncio.run(main())
