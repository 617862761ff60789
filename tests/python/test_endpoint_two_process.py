"""The Endpoint API across two processes: this one is the initiator, tests/python/endpoint_peer.py
the target; the two exchange endpoint_info() over the peer's stdin/stdout."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "endpoint_peer.py")
SIZE = 4 << 20


def pattern(seed, length, offset=0):
    i = np.arange(offset, offset + length, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


class Peer:
    """The target process: commands in, one JSON answer per command out (every read has a deadline)."""

    def __init__(self, num_qp):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen([sys.executable, PEER, "--num-qp", str(num_qp), "--size", str(SIZE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self.read(30)["info"]

    def read(self, timeout=30):
        result = {}

        def reader():
            result["line"] = self.proc.stdout.readline()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout)
        if "line" not in result or not result["line"]:
            raise AssertionError("the peer process did not answer within %s s (exit code %s)"
                                 % (timeout, self.proc.poll()))
        return json.loads(result["line"])

    def send(self, obj):
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def call(self, timeout=30, **cmd):
        self.send(cmd)
        answer = self.read(timeout)
        assert answer.get("ok"), answer
        return answer

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call(cmd="quit", timeout=10)
            except (AssertionError, BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def connected(request):
    num_qp = getattr(request, "param", 2)
    peer = Peer(num_qp)
    ep = ferry.RDMAEndpoint(device_name="", ib_port=1, link_type="RoCE", num_qp=num_qp)
    buf = np.zeros(SIZE, dtype=np.uint8)
    msg = np.zeros(SIZE, dtype=np.uint8)
    handles = {"buf": ep.register_memory_region("buf", buf), "msg": ep.register_memory_region("msg", msg)}
    peer.send(ep.endpoint_info())
    ep.connect(peer.info)
    assert peer.read()["ready"]
    yield ep, peer, buf, msg, handles
    ep.shutdown()
    peer.close()


@pytest.mark.parametrize("connected", [1, 2], indirect=True)
def test_document_examples_across_processes(connected):
    ep, peer, buf, msg, h = connected
    # The peer's regions came with its endpoint_info(); connect() recorded them by name.
    remote = ep.register_remote_memory_region("buf", peer.info["mr_info"]["buf"])

    # write: (mr_key, remote_mr_key, target_offset=remote, source_offset=local, length)
    buf[:] = pattern(1, SIZE)
    ep.write([(h["buf"], remote, 4096, 0, SIZE - 8192)], None).wait(30)
    assert peer.call(cmd="check", seed=1, offset=4096, length=SIZE - 8192)["ok"]

    # read: (mr_key, remote_mr_key, target_offset=local, source_offset=remote, length)
    peer.call(cmd="fill", seed=2)
    buf[:] = 0
    ep.read([(h["buf"], "buf", 0, 8, SIZE - 8)], None).wait(30)
    assert np.array_equal(buf[:SIZE - 8], pattern(2, SIZE - 8, 8))

    # write_with_imm: the peer's imm_recv sees 7 once the data is there.
    buf[:] = pattern(3, SIZE)
    peer.send({"cmd": "imm_recv", "count": 3})
    for imm in (7, 8, 9):
        ep.write_with_imm([(h["buf"], remote, 0, 0, SIZE)], imm_data=imm, stream=None).wait(30)
    assert peer.read()["imms"] == [7, 8, 9]
    assert peer.call(cmd="check", seed=3, offset=0, length=SIZE)["ok"]

    # send/recv both ways, sizes around the receive-buffer size.
    sizes = [0, 1, 4096, 65536, 65537, 300000]
    peer.send({"cmd": "recv", "sizes": sizes})
    for index, size in enumerate(sizes):
        msg[:size] = pattern(index, size)
        ep.send([(h["msg"], 0, size)], None).wait(30)
    assert peer.read()["results"] == [[s, True] for s in sizes]
    recvs = [ep.recv([(h["msg"], i * 400000, 400000)], None) for i in range(len(sizes))]
    peer.call(cmd="send", sizes=sizes)
    for index, (f, size) in enumerate(zip(recvs, sizes)):
        f.wait(30)
        assert f.nbytes() == size
        assert np.array_equal(msg[index * 400000:index * 400000 + size], pattern(index, size))


def test_killed_peer_fails_pending_futures():
    peer = Peer(2)
    ep = ferry.RDMAEndpoint(num_qp=2)
    buf = np.zeros(SIZE, dtype=np.uint8)
    handle = ep.register_memory_region("buf", buf)
    peer.send(ep.endpoint_info())
    ep.connect(peer.info)
    assert peer.read()["ready"]
    ep.write([(handle, "buf", 0, 0, 4096)], None).wait(30)  # the peer has answered once
    pending = [ep.recv([(handle, 0, 4096)], None), ep.imm_recv(None)]
    peer.proc.kill()
    peer.proc.wait()
    start = time.monotonic()
    # Nothing is in flight: the endpoint's liveness probe finds the peer gone.
    for f in pending:
        with pytest.raises(ferry.WorkCompletionError, match="gone or unreachable|flushed"):
            f.wait(20)
    assert time.monotonic() - start < 6
    with pytest.raises(ferry.WorkCompletionError):
        ep.write([(handle, "buf", 0, 0, 8)], None)
    ep.shutdown()


def test_killed_peer_fails_transfers_in_flight():
    peer = Peer(1)
    ep = ferry.RDMAEndpoint(num_qp=1, send_depth=4)
    buf = np.zeros(SIZE, dtype=np.uint8)
    handle = ep.register_memory_region("buf", buf)
    peer.send(ep.endpoint_info())
    ep.connect(peer.info)
    assert peer.read()["ready"]
    # Far more than can finish before the kill: 4 GiB in 4 MiB writes.
    futures = [ep.write([(handle, "buf", 0, 0, SIZE)] * 64, None) for _ in range(16)]
    peer.proc.kill()
    peer.proc.wait()
    start = time.monotonic()
    failed = 0
    for f in futures:
        try:
            f.wait(20)
        except ferry.WorkCompletionError:
            failed += 1
    assert failed > 0
    assert time.monotonic() - start < 6
    ep.shutdown()


def test_paused_peer_resumes_with_its_connection_intact():
    """A peer stopped (SIGSTOP: a debugger, a long pause) for less than the transport timeout
    (FERRY_TRANSPORT_TIMEOUT, 30 s by default) resumes with everything intact: the transfers and
    receives pending meanwhile complete, byte-checked."""
    peer = Peer(2)
    ep = ferry.RDMAEndpoint(num_qp=2)
    buf = np.zeros(SIZE, dtype=np.uint8)
    msg = np.zeros(SIZE, dtype=np.uint8)
    handle = ep.register_memory_region("buf", buf)
    msg_handle = ep.register_memory_region("msg", msg)
    peer.send(ep.endpoint_info())
    ep.connect(peer.info)
    assert peer.read()["ready"]
    ep.write([(handle, "buf", 0, 0, 4096)], None).wait(30)  # the peer has answered once
    waiting = ep.recv([(msg_handle, 0, 4096)], None)  # the endpoint probes its peer meanwhile
    peer.proc.send_signal(signal.SIGSTOP)
    try:
        buf[:] = pattern(11, SIZE)
        write = ep.write([(handle, "buf", 0, 0, SIZE)], None)
        time.sleep(3)  # longer than the 2 s that used to end the connection
    finally:
        peer.proc.send_signal(signal.SIGCONT)
    write.wait(30)
    assert peer.call(cmd="check", seed=11, offset=0, length=SIZE)["ok"]
    peer.call(cmd="send", sizes=[4096])
    waiting.wait(30)
    assert waiting.nbytes() == 4096
    assert np.array_equal(msg[:4096], pattern(0, 4096))
    ep.shutdown()
    peer.close()
