"""The client process of the object store tests (tests/python/test_objects.py).

``python objects_peer.py URL [--http] [--piece N] [--access-key K] [--secret-key S]`` connects a
``ferry.objects.ObjectClient`` to the store at URL (by RDMA unless ``--http``), prints
``{"ready": true}`` (or ``{"ready": false, "error": class, "message": text}``) and serves JSON
commands, one per line on stdin, answering each with one line: ``{"ok": true, ...}``, or
``{"ok": false, "error": "<ferry exception class>", "message": ...}``. Every answer carries
``progress``: the ``(done, total)`` calls of the client's progress callable during the command.

Payloads are ``payload(seed, size)`` (NumPy's generator: the test computes the same bytes), made
as a ``kind`` of memory: bytes, bytearray, memoryview, numpy, float32 (a 2-D NumPy array of
another dtype), torch (a CPU tensor) or readonly (a bytes object, for get_into).

- ``mb`` / ``rb`` ``{bucket}``; ``buckets``; ``ls`` ``{bucket, prefix}``; ``head`` / ``rm``
  ``{bucket, key}``.
- ``put`` ``{bucket, key, size, seed, kind}``: answers the payload's ``sha256``.
- ``get`` ``{bucket, key, kind, capacity, announce}``: ``kind`` "bytes" calls ``get()``, the others
  ``get_into()`` a zeroed buffer of ``capacity`` bytes; answers ``n``, the ``sha256`` of the
  object's bytes and ``in_place`` (the NumPy array's memory is the one it had). ``announce``
  prints ``{"event": "started"}`` at the first progress call of an unfinished transfer.
- ``put_file`` / ``get_file`` ``{bucket, key, path}``.
- ``quit``.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import ferry  # noqa: E402
from ferry.objects import ObjectClient  # noqa: E402


def payload(seed, size):
    return np.random.default_rng(seed).bytes(size)


def digest(data):
    return hashlib.sha256(data).hexdigest()


def make(kind, raw):
    if kind == "bytes":
        return raw
    if kind == "bytearray":
        return bytearray(raw)
    if kind == "memoryview":
        return memoryview(bytearray(raw))
    if kind == "numpy":
        return np.frombuffer(raw, dtype=np.uint8).copy()
    if kind == "float32":
        return np.frombuffer(raw, dtype=np.float32).copy().reshape(-1, 4)
    if kind == "torch":
        import torch
        return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
    raise ValueError("unknown kind %r" % kind)


def zeros(kind, size):
    if kind == "bytearray":
        return bytearray(size)
    if kind == "memoryview":
        return memoryview(bytearray(size))
    if kind == "numpy":
        return np.zeros(size, dtype=np.uint8)
    if kind == "float32":
        return np.zeros((size // 16, 4), dtype=np.float32)
    if kind == "torch":
        import torch
        return torch.zeros(size, dtype=torch.uint8)
    if kind == "readonly":
        return bytes(size)
    raise ValueError("unknown kind %r" % kind)


def as_bytes(buffer, n):
    if hasattr(buffer, "numpy"):  # a tensor
        buffer = buffer.numpy()
    return memoryview(buffer).cast("B")[:n]


def say(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class Peer:
    def __init__(self, args):
        self.calls = []
        self.announce = False
        self.client = ObjectClient.connect(args.url, access_key=args.access_key, secret_key=args.secret_key,
                                           rdma=not args.http, piece_bytes=args.piece, progress=self.progress)

    def progress(self, done, total):
        self.calls.append((done, total))
        if self.announce and done < total:
            self.announce = False
            say({"event": "started", "done": done, "total": total})

    def run(self, cmd):
        c = self.client
        name = cmd["cmd"]
        if name == "mb":
            c.create_bucket(cmd["bucket"])
        elif name == "rb":
            c.delete_bucket(cmd["bucket"])
        elif name == "buckets":
            return {"buckets": c.buckets()}
        elif name == "ls":
            return {"objects": c.list(cmd["bucket"], cmd.get("prefix", ""))}
        elif name == "head":
            return {"info": c.head(cmd["bucket"], cmd["key"])}
        elif name == "rm":
            c.remove(cmd["bucket"], cmd["key"])
        elif name == "put":
            raw = payload(cmd["seed"], cmd["size"])
            c.put(cmd["bucket"], cmd["key"], make(cmd.get("kind", "bytes"), raw))
            return {"sha256": digest(raw)}
        elif name == "get":
            kind = cmd.get("kind", "bytes")
            self.announce = cmd.get("announce", False)
            if kind == "bytes":
                data = c.get(cmd["bucket"], cmd["key"])
                return {"n": len(data), "sha256": digest(data), "type": type(data).__name__}
            buffer = zeros(kind, cmd["capacity"])
            before = buffer.ctypes.data if isinstance(buffer, np.ndarray) else None
            n = c.get_into(cmd["bucket"], cmd["key"], buffer)
            in_place = before is None or buffer.ctypes.data == before
            return {"n": n, "sha256": digest(as_bytes(buffer, n)), "in_place": in_place}
        elif name == "put_file":
            c.put_file(cmd["bucket"], cmd["key"], cmd["path"])
        elif name == "get_file":
            c.get_file(cmd["bucket"], cmd["key"], cmd["path"])
        else:
            raise ValueError("unknown command %r" % name)
        return {}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--piece", type=int, default=64 << 20)
    parser.add_argument("--access-key")
    parser.add_argument("--secret-key")
    args = parser.parse_args()
    try:
        peer = Peer(args)
    except ferry.Error as exc:
        say({"ready": False, "error": type(exc).__name__, "message": str(exc)})
        return
    say({"ready": True})
    with peer.client:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            peer.calls = []
            try:
                answer = dict(peer.run(cmd), ok=True)
            except ferry.Error as exc:
                answer = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            answer["progress"] = peer.calls
            say(answer)


if __name__ == "__main__":
    main()
