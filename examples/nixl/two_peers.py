"""Two processes moving bytes with NIXL's Python API, served by ferry.

The program uses only NIXL's names; ``install_as_nixl()`` makes ``import nixl`` give ferry.nixl.
The parent starts the target (this file with ``--target``), which listens for metadata on a port
the system picks and says so on stderr (``MD listener is listening on port N``, as NIXL does). The
initiator fetches the target's metadata through that port and sends its own, writes 1 MiB with a
notification, the target checks the bytes and answers with a notification, the initiator reads the
bytes back, and both check every byte.

    python examples/nixl/two_peers.py
"""

import os
import subprocess
import sys
import time

import numpy as np

import ferry.nixl

ferry.nixl.install_as_nixl()

import nixl._utils as nixl_utils  # noqa: E402
from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402
from nixl.logging import get_logger  # noqa: E402

logger = get_logger(__name__)
SIZE = 1 << 20


def pattern():
    return (np.arange(SIZE, dtype=np.uint64) * 2654435761 >> 7).astype(np.uint8)


def wait_notif(agent, sender, tag, timeout=30):
    deadline = time.time() + timeout
    while not agent.check_remote_xfer_done(sender, tag):
        if time.time() > deadline:
            raise SystemExit("no notification %r from %s within %d s" % (tag, sender, timeout))
        time.sleep(0.001)


def target():
    agent = nixl_agent("target", nixl_agent_config(True, True, 0))   # listener on a port the system picks
    buf = np.zeros(SIZE, dtype=np.uint8)
    agent.register_memory(buf)
    deadline = time.time() + 30
    while not agent.check_remote_metadata("initiator"):            # pushed by the initiator
        if time.time() > deadline:
            raise SystemExit("the initiator's metadata did not arrive")
        time.sleep(0.001)
    descs = agent.get_xfer_descs(buf)
    agent.send_notif("initiator", agent.get_serialized_descs(descs))
    wait_notif(agent, "initiator", b"written")
    ok = bool((buf == pattern()).all())
    agent.send_notif("initiator", b"checked:%d" % ok)
    wait_notif(agent, "initiator", b"read done")
    logger.info("target: %s", "bytes verified" if ok else "CORRUPT")
    return 0 if ok else 1


def initiator(port):
    agent = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    addr = nixl_utils.malloc_passthru(SIZE)
    src = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * SIZE).from_address(addr))
    src[:] = pattern()
    reg = agent.register_memory([(addr, SIZE, 0, "")], "DRAM")

    agent.fetch_remote_metadata("target", "127.0.0.1", port)
    agent.send_local_metadata("127.0.0.1", port)
    deadline = time.time() + 30
    notifs = {}
    while not notifs.get("target"):                                 # the target's descriptors
        if time.time() > deadline:
            raise SystemExit("the target's descriptors did not arrive")
        notifs = agent.get_new_notifs()
        time.sleep(0.001)
    assert agent.check_remote_metadata("target")
    remote = agent.deserialize_descs(notifs["target"][0])

    local = agent.get_xfer_descs([(addr, SIZE, 0)], "DRAM")
    handle = agent.initialize_xfer("WRITE", local, remote, "target", b"written")
    state = agent.transfer(handle)
    while state != "DONE":
        state = agent.check_xfer_state(handle)
    wait_notif(agent, "target", b"checked:1")

    src[:] = 0
    handle2 = agent.initialize_xfer("READ", local, remote, "target", b"read done")
    state = agent.transfer(handle2)
    while state != "DONE":
        state = agent.check_xfer_state(handle2)
    ok = bool((src == pattern()).all())
    agent.release_xfer_handle(handle)
    agent.release_xfer_handle(handle2)
    agent.deregister_memory(reg)
    agent.invalidate_local_metadata("127.0.0.1", port)
    agent.remove_remote_agent("target")
    nixl_utils.free_passthru(addr)
    logger.info("initiator: %d bytes written and read back, %s", SIZE, "verified" if ok else "CORRUPT")
    return 0 if ok else 1


def main():
    env = dict(os.environ, NIXL_LOG_LEVEL="INFO")
    peer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--target"], stderr=subprocess.PIPE,
                            text=True, env=env)
    port = None
    for line in peer.stderr:
        if "MD listener is listening on port" in line:
            port = int(line.split()[-1])
            break
        sys.stderr.write(line)
    if port is None:
        raise SystemExit("the target did not start its listener")
    rc = initiator(port)
    rc_target = peer.wait(timeout=60)
    sys.stderr.write(peer.stderr.read())
    if rc == 0 and rc_target == 0:
        logger.info("two peers: 1 MiB written and read back over ferry, verified")
    return rc or rc_target


if __name__ == "__main__":
    sys.exit(target() if "--target" in sys.argv else main())
