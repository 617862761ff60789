"""The other process of the GPU suite's two-process test (tests/python/test_gpu.py): an Endpoint
API target whose memory is on cuda:0 (torch or CuPy where they have CUDA, else the driver's own
cuMemAlloc, as test_gpu.cuda_buffer allocates).

It prints ``{"info": endpoint_info(), "mr": <its region "dst">}`` as one JSON line, reads the
initiator's endpoint_info as one line, connects, prints ``{"ready": true}``, then answers one JSON
command per line on stdin with one JSON line on stdout:

- ``{"cmd": "fill", "seed": S}``: fill "dst" with pattern S (through the device).
- ``{"cmd": "digest"}``: the SHA-256 of what "dst" holds, read back through the device.
- ``{"cmd": "quit"}``: shut down and exit.
"""

import hashlib
import json
import sys

import ferry
from test_gpu import NBYTES, cuda_buffer, fill, on_host, pattern


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ep = ferry.RDMAEndpoint()
    ptr, dst = cuda_buffer(NBYTES)
    fill(dst, pattern(0))
    ep.register_memory_region("dst", ptr, 0, NBYTES)
    reply({"info": ep.endpoint_info(), "mr": ep.mr_info()["dst"]})
    ep.connect(json.loads(sys.stdin.readline()))
    reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "fill":
            fill(dst, pattern(cmd["seed"]))
            reply({"ok": True})
        elif cmd["cmd"] == "digest":
            reply({"ok": True, "sha256": hashlib.sha256(on_host(dst).tobytes()).hexdigest()})
        elif cmd["cmd"] == "quit":
            reply({"ok": True})
            break
        else:
            reply({"ok": False, "error": "unknown command %r" % cmd["cmd"]})
    ep.shutdown()


if __name__ == "__main__":
    main()
