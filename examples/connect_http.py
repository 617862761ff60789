#!/usr/bin/env python3
"""ferry.connect between two processes, with the metadata carried over HTTP.

The owner (this process) exposes a block as a readable operation and a buffer as a writable one,
and serves their metadata at http://127.0.0.1:PORT/readable and /writable. The peer (the same
script, run with --peer URL) fetches the metadata, reads the block into its own memory, and writes
its answer into the owner's buffer. Both sides await completion; the owner checks what it got.

    PYTHONPATH=build/python python3 examples/connect_http.py
"""

import asyncio
import http.server
import subprocess
import sys
import threading
import urllib.request

import numpy as np

from ferry.connect import Connector, Descriptor, RdmaMetadata

SIZE = 8 << 20


def block(seed):
    return (np.arange(SIZE, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


async def owner():
    connector = Connector("connect-owner")
    await connector.initialize()
    source = block(7)
    answer = np.zeros(SIZE, np.uint8)
    readable = connector.create_readable(Descriptor(source))
    writable = connector.create_writable(Descriptor(answer))
    pages = {"/readable": readable.metadata().model_dump_json().encode(),
             "/writable": writable.metadata().model_dump_json().encode()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % server.server_address[1]
    peer = subprocess.Popen([sys.executable, __file__, "--peer", url])
    try:
        await asyncio.wait_for(readable.wait_for_completion(), 60)
        print("owner: the peer read the block")
        await asyncio.wait_for(writable.wait_for_completion(), 60)
        ok = np.array_equal(answer, block(8))
        print("owner: the peer's answer arrived, %s" % ("verified" if ok else "CORRUPT"))
        if peer.wait(60) != 0:
            raise SystemExit("the peer failed")
        return 0 if ok else 1
    finally:
        server.shutdown()
        connector.shutdown()


async def peer(url):
    async with Connector("connect-peer") as connector:
        def fetch(path):
            with urllib.request.urlopen(url + path, timeout=10) as r:
                return RdmaMetadata.model_validate_json(r.read())

        got = np.zeros(SIZE, np.uint8)
        read = await connector.begin_read(fetch("/readable"), Descriptor(got))
        await asyncio.wait_for(read.wait_for_completion(), 60)
        print("peer: read %d bytes, %s" % (SIZE, "verified" if np.array_equal(got, block(7)) else "CORRUPT"))
        write = await connector.begin_write(Descriptor(block(8)), fetch("/writable"))
        await asyncio.wait_for(write.wait_for_completion(), 60)
        print("peer: wrote the answer")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        sys.exit(asyncio.run(peer(sys.argv[2])))
    sys.exit(asyncio.run(owner()))
