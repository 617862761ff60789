#!/usr/bin/env python3
"""ferry.objects between two processes: an object store and a client that moves by RDMA.

This process starts an object store (what `ferry objects serve` runs) and then runs itself again
as the client (--client URL). The client creates a bucket, stores a NumPy array (the store READs
the client's memory, no copy on the client's side), reads it back into another array (the store
WRITEs it), lists the bucket, and checks every byte. Any S3 client can reach the same store with
the payload in the HTTP body.

    PYTHONPATH=build/python python3 examples/objects_store.py
"""

import subprocess
import sys

import numpy as np

from ferry.objects import ObjectClient, ObjectStore

SIZE = 32 << 20


def client(url: str) -> None:
    with ObjectClient.connect(url) as c:
        c.create_bucket("models")
        weights = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
        c.put("models", "layer0.bin", weights)              # the store reads it from here
        back = np.zeros(SIZE, dtype=np.uint8)
        n = c.get_into("models", "layer0.bin", back)        # the store writes it here
        listed = [(o["key"], o["size"]) for o in c.list("models")]
        assert n == SIZE and np.array_equal(back, weights), "the object came back changed"
        assert listed == [("layer0.bin", SIZE)], listed
        print(f"client: stored and fetched {SIZE} bytes by RDMA, verified")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client(sys.argv[2])
        return
    with ObjectStore.start(host="127.0.0.1", port=0) as store:
        print(f"store: serving {store.url}")
        subprocess.run([sys.executable, __file__, "--client", store.url], check=True, timeout=120)
        stats = store.stats()
        assert stats["rdma_bytes"] >= 2 * SIZE, stats
        print(f"store: {stats['objects']} object, {stats['rdma_bytes']} bytes moved by RDMA, verified")


if __name__ == "__main__":
    main()
