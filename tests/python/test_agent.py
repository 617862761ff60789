"""The agent from Python (ferry.start_peer_agent / PeerAgent), across processes.

A real discovery store serves every test: ``ferry store`` (ferry's embedded server) started here on
loopback, and for the discovery tests also a real ``redis-server`` and ``etcd`` (Debian packages),
started here on loopback and skipped with a reason where the program is missing (unless
FERRY_REQUIRE_STORES names them). The peer is another process (agent_peer.py).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(HERE, "..", "..", "build", "tests"))
FERRY = os.path.join(BIN_DIR, "..", "ferry")
REQUIRED = set(filter(None, os.environ.get("FERRY_REQUIRE_STORES", "").split(",")))


def pattern(seed, length, offset=0):
    i = np.arange(offset, offset + length, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not listen on %d" % port)


class Server:
    """A store server process on loopback; restartable on the same port."""

    def __init__(self, kind):
        self.kind = kind
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="ferry-store-")
        self.proc = None

    def argv(self):
        if self.kind == "ferry":
            return [FERRY, "store", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.kind == "redis":
            return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--daemonize", "no"]
        peer = "http://127.0.0.1:%d" % free_port()
        client = "http://127.0.0.1:%d" % self.port
        return ["etcd", "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", "t=" + peer]

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % (self.kind, self.port)

    def start(self):
        log = open(os.path.join(self.dir, "log"), "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        wait_port(self.port, self.proc)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_or_skip(kind):
    program = {"ferry": FERRY, "redis": "redis-server", "etcd": "etcd"}[kind]
    if shutil.which(program) is None and not os.path.exists(program):
        if kind in REQUIRED:
            pytest.fail("%s is required (FERRY_REQUIRE_STORES) but %s is missing" % (kind, program))
        pytest.skip("%s is not installed" % program)
    s = Server(kind)
    s.start()
    return s


@pytest.fixture
def store():
    s = server_or_skip("ferry")
    yield s
    s.close()


class Peer:
    def __init__(self, store_url, alias, size=1 << 20, secret=None, peer_timeout=5.0):
        argv = [sys.executable, os.path.join(HERE, "agent_peer.py"), "--store", store_url, "--alias", alias,
                "--size", str(size), "--peer-timeout", str(peer_timeout)]
        if secret:
            argv += ["--secret", secret]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, FERRY_LOG_LEVEL="error"))
        hello = self._read()
        assert hello.get("ready"), hello
        self.uuid = hello["uuid"]

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the peer process ended (exit %s)" % self.proc.wait())
        return json.loads(line)

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call(cmd="quit")
            except (RuntimeError, BrokenPipeError):
                pass
            self.proc.wait(10)


def test_the_documents_example_runs_as_written(store):
    # The example, with the store this test serves.
    from ferry import start_peer_agent, PeerAgent
    peer = Peer(store.url, "decode-0")
    try:
        agent = start_peer_agent(store=store.url, alias="prefill-0", device=None, scope=None)
        assert isinstance(agent, PeerAgent)
        kv = np.zeros(1 << 20, dtype=np.uint8)
        kv[:] = pattern(5, kv.size)
        agent.register_memory_region("kv", kv.ctypes.data, 0, kv.nbytes)
        conn = agent.connect_to("decode-0", qp_num=1)      # PeerConnection, usable at once
        conn.wait(timeout=60.0)
        assert conn.is_connected()
        assert conn.endpoint is not None
        assert conn.peer_alias == "decode-0"
        info = agent.get_mr_info("decode-0", "kv")
        assert info["length"] == 1 << 20
        assert agent.list_agents() == ["decode-0", "prefill-0"]
        local_off, remote_off, length = 0, 0, 4096
        agent.write("decode-0", [("kv", local_off, remote_off, length)]).wait()
        assert peer.call(cmd="check", seed=5, offset=0, length=4096)["ok"]
        into = np.zeros(4096, dtype=np.uint8)
        agent.register_memory_region("kv_remote", into)
        assert peer.call(cmd="fill", seed=9)["ok"]
        agent.read("decode-0", [("kv_remote", "kv", 0, 0, 4096)]).wait()
        assert (into == pattern(9, 4096)).all()
        agent.write_with_imm("decode-0", ("kv", 0, 0, 4096), imm_data=7).wait(30)
        assert peer.call(cmd="imm_recv", peer="prefill-0") == {"ok": True, "imm": 7}
        agent.send("decode-0", ("kv", 0, 1000)).wait(30)
        assert peer.call(cmd="recv", peer="prefill-0", length=4096) == {"ok": True, "nbytes": 1000}
        lanes = agent.lanes("decode-0")
        assert lanes == {"messages": "same_host", "rma": "same_host", "atomics": "same_host"}
        assert peer.call(cmd="lanes", peer="prefill-0")["lanes"] == lanes, "both sides must agree"
        agent.unregister_memory_region("kv")
        agent.shutdown()
    finally:
        peer.close()


def test_operations_before_the_peer_starts_are_replayed_in_order(store):
    with ferry.start_peer_agent(store=store.url, alias="early", device="soft_lo", connect_timeout=30) as agent:
        src = np.zeros(4 * 4096, dtype=np.uint8)
        for i in range(4):
            src[i * 4096:(i + 1) * 4096] = pattern(i + 1, 4096)
        agent.register_memory_region("kv", src)
        conn = agent.connect_to("late")
        assert not conn.is_connected()
        # Four writes to one remote range, queued: only in-order replay leaves the last one there.
        futures = [agent.write("late", [("kv", i * 4096, 0, 4096)]) for i in range(4)]
        time.sleep(0.5)
        assert not futures[0].done()
        peer = Peer(store.url, "late")
        try:
            for f in futures:
                f.wait(30)
            assert peer.call(cmd="check", seed=4, offset=0, length=4096)["ok"]
            assert agent.stats()["operations_queued"] >= 4
        finally:
            peer.close()


def test_a_peer_writes_back_through_its_reply_endpoint(store):
    with ferry.start_peer_agent(store=store.url, alias="front", device="soft_lo") as agent:
        buf = np.zeros(1 << 16, dtype=np.uint8)
        agent.register_memory_region("kv", buf)
        peer = Peer(store.url, "back")
        try:
            agent.connect_to("back").wait(30)
            # The peer never called connect_to: our REQUEST made its endpoint for replies.
            assert peer.call(cmd="write", peer="front", seed=3, length=8192)["ok"]
            assert (buf[:8192] == pattern(3, 8192)).all()
        finally:
            peer.close()


def test_kill_9_mid_transfer_fails_pending_work_and_a_restart_is_wired_again(store):
    with ferry.start_peer_agent(store=store.url, alias="writer", device="soft_lo", peer_timeout=2.0) as agent:
        size = 32 << 20
        src = np.frombuffer(np.random.default_rng(1).bytes(size), dtype=np.uint8).copy()
        agent.register_memory_region("kv", src)
        peer = Peer(store.url, "victim", size=size)
        agent.connect_to("victim").wait(30)
        # Keep writes in flight, then kill the peer in the middle of them.
        futures = [agent.write("victim", [("kv", 0, 0, size)]) for _ in range(8)]
        recv = agent.recv("victim", ("kv", 0, 16))
        peer.kill()
        started = time.monotonic()
        # Every pending operation fails with PeerGone (a write that landed before the kill is OK),
        # whichever noticed first: the queue pairs or the agent.
        outcomes = []
        for f in futures + [recv]:
            try:
                f.wait(20)
                outcomes.append("ok")
            except ferry.PeerGone:
                outcomes.append("gone")
        assert outcomes[-1] == "gone", outcomes
        assert time.monotonic() - started < 10, "a dead peer must fail pending work within the peer timeout"
        # The same alias comes back (a new process, a new uuid): the next operation wires it up.
        peer2 = Peer(store.url, "victim", size=size)
        try:
            assert peer2.uuid != peer.uuid
            deadline = time.monotonic() + 30
            while True:
                try:
                    agent.write("victim", [("kv", 0, 0, 1 << 20)]).wait(20)
                    break
                except ferry.PeerGone:
                    # The store may still hold the dead process's entry for a moment.
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            got = peer2.call(cmd="check", seed=0, offset=0, length=16)
            assert "ok" in got
            conn = agent.connect_to("victim")
            assert conn.peer_uuid == peer2.uuid
        finally:
            peer2.close()


def test_connect_to_an_alias_that_never_comes_fails_at_the_deadline(store):
    with ferry.start_peer_agent(store=store.url, alias="waiting", device="soft_lo", connect_timeout=1.0) as agent:
        buf = bytearray(4096)
        agent.register_memory_region("kv", buf)
        conn = agent.connect_to("ghost")
        f = agent.write(conn, [("kv", 0, 0, 4096)])
        started = time.monotonic()
        with pytest.raises(ferry.TimedOut, match="ghost"):
            f.wait(10)
        # The connection reports the failed wireup at once (it does not start another).
        with pytest.raises(ferry.TimedOut, match="not registered"):
            conn.wait(5)
        assert time.monotonic() - started < 4


def test_bad_input_is_a_clear_error(store):
    with ferry.start_peer_agent(store=store.url, alias="strict", device="soft_lo") as agent:
        buf = bytearray(4096)
        agent.register_memory_region("kv", buf)
        with pytest.raises(ferry.InvalidArgument):
            agent.write("someone", [("kv", 4090, 0, 16)])
        with pytest.raises(ferry.InvalidArgument):
            agent.write("someone", [("nope", 0, 0, 16)])
        with pytest.raises(ferry.InvalidArgument):
            agent.write("someone", [("kv", 0, 0)])
        with pytest.raises(ferry.InvalidArgument):
            agent.write("someone", [])
        with pytest.raises(ferry.InvalidArgument):
            agent.send("someone", [("kv", -1, 4)])
        with pytest.raises(ferry.InvalidArgument):
            agent.connect_to("strict")
        with pytest.raises(ferry.InvalidArgument):
            agent.connect_address(b"not an address")
        with pytest.raises(TypeError):
            agent.write(42, [("kv", 0, 0, 4)])
        with pytest.raises(ferry.InvalidArgument):
            agent.register_memory_region("a/b", buf)
        with pytest.raises(ferry.NotFound):
            agent.unregister_memory_region("never")
        assert agent.stats()["operations_queued"] == 0
    with pytest.raises(ferry.InvalidArgument):
        ferry.start_peer_agent(store="gopher://x", alias="x")
    with pytest.raises(ferry.InvalidArgument):
        ferry.start_peer_agent(store=store.url, alias="x", lanes="rma=smoke-signals")


def test_connect_by_address_needs_no_store():
    a = ferry.start_peer_agent(store="", alias="a", device="soft_lo")
    b = ferry.start_peer_agent(store="", alias="b", device="soft_lo")
    try:
        x = np.arange(8192, dtype=np.uint8)
        y = np.zeros(8192, dtype=np.uint8)
        a.register_memory_region("x", x)
        b.register_memory_region("y", y)
        conn = a.connect_address(b.address)
        conn.write([("x", "y", 0, 0, 8192)]).wait(30)
        assert (x == y).all()
        with pytest.raises(ferry.Unavailable):
            a.list_agents()
    finally:
        a.shutdown()
        b.shutdown()


def test_a_shared_secret_admits_only_its_holders(store):
    with ferry.start_peer_agent(store=store.url, alias="vault", device="soft_lo", secret="k1") as agent:
        buf = np.zeros(4096, dtype=np.uint8)
        buf[:] = pattern(2, 4096)
        agent.register_memory_region("kv", buf)
        good = Peer(store.url, "friend", secret="k1")
        try:
            agent.write("friend", [("kv", 0, 0, 4096)]).wait(30)
            assert good.call(cmd="check", seed=2, offset=0, length=4096)["ok"]
        finally:
            good.close()
        with ferry.start_peer_agent(store=store.url, alias="stranger", device="soft_lo", secret="k2",
                                    connect_timeout=1.5) as other:
            other.register_memory_region("kv", bytearray(4096))
            with pytest.raises(ferry.TimedOut, match="shared secret"):
                other.write("vault", [("kv", 0, 0, 4096)]).wait(10)


@pytest.mark.parametrize("kind", ["ferry", "redis", "etcd"])
def test_discovery_works_through_every_store(kind):
    server = server_or_skip(kind)
    try:
        peer = Peer(server.url, "remote-%s" % kind)
        try:
            with ferry.start_peer_agent(store=server.url, alias="local-%s" % kind, device="soft_lo") as agent:
                buf = np.zeros(1 << 16, dtype=np.uint8)
                buf[:] = pattern(11, buf.size)
                agent.register_memory_region("kv", buf)
                agent.write("remote-%s" % kind, [("kv", 0, 0, buf.size)]).wait(30)
                assert peer.call(cmd="check", seed=11, offset=0, length=buf.size)["ok"]
                assert agent.list_agents() == sorted(["local-%s" % kind, "remote-%s" % kind])
                # The store goes down: the connection keeps working (the store is not in the data
                # path); a lookup fails with a clear error; when it is back, lookups work again.
                server.stop()
                agent.write("remote-%s" % kind, [("kv", 0, 0, 4096)]).wait(30)
                with pytest.raises((ferry.Unavailable, ferry.TimedOut)):
                    agent.list_agents()
                server.start()
                deadline = time.monotonic() + 30
                while True:
                    try:
                        names = agent.list_agents()
                        if "local-%s" % kind in names:
                            break
                    except (ferry.Unavailable, ferry.TimedOut):
                        pass
                    assert time.monotonic() < deadline, "the agent did not register again after the store returned"
                    time.sleep(0.2)
        finally:
            peer.close()
    finally:
        server.close()


def test_ferry_info_shows_the_lanes_and_why(store):
    peer = Peer(store.url, "shown")
    try:
        with ferry.start_peer_agent(store=store.url, alias="looker", device="soft_lo") as agent:
            agent.connect_to("shown").wait(30)
            lanes = agent.lanes("shown")
            detail = agent.lanes_detail("shown")
        out = subprocess.run([FERRY, "info", "--peer", "shown", "--store", store.url], capture_output=True,
                             text=True, timeout=60, env=dict(os.environ, FERRY_DEVICES="soft_lo"))
        assert out.returncode == 0, out.stderr
        for cls, lane in lanes.items():
            line = [l for l in out.stdout.splitlines() if l.strip().startswith("lane %s " % cls)]
            assert line, out.stdout
            assert lane in line[0] and detail[cls]["why"] in line[0]
        missing = subprocess.run([FERRY, "info", "--peer", "nobody", "--store", store.url], capture_output=True,
                                 text=True, timeout=60)
        assert missing.returncode == 1 and "nobody" in missing.stderr
    finally:
        peer.close()


def test_a_paused_peer_keeps_its_connection_and_a_dead_one_is_found_at_once(store):
    with ferry.start_peer_agent(store=store.url, alias="patient", device="soft_lo", peer_timeout=1.0) as agent:
        buf = np.zeros(4096, dtype=np.uint8)
        buf[:] = pattern(6, 4096)
        agent.register_memory_region("kv", buf)
        peer = Peer(store.url, "sleeper")
        try:
            agent.connect_to("sleeper").wait(30)
            peer.proc.send_signal(signal.SIGSTOP)
            time.sleep(3)  # three peer timeouts: its kernel still answers, so it is not gone
            peer.proc.send_signal(signal.SIGCONT)
            agent.write("sleeper", [("kv", 0, 0, 4096)]).wait(30)
            assert peer.call(cmd="check", seed=6, offset=0, length=4096)["ok"]
            assert agent.stats()["peers_gone"] == 0
            assert agent.connect_to("sleeper").peer_uuid == peer.uuid
            # Killed: its kernel closes the wireup links, so a waiting receive fails at once, with
            # no heartbeat running.
            recv = agent.recv("sleeper", ("kv", 0, 16))
            started = time.monotonic()
            peer.kill()
            with pytest.raises(ferry.PeerGone):
                recv.wait(10)
            assert time.monotonic() - started < 2
        finally:
            peer.close()
