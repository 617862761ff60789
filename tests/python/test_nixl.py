"""ferry.nixl: NIXL's Python API served by ferry (docs/nixl.md; the numbers in brackets are the
rows of its table of what is served).

Run as a script (``python test_nixl.py --peer NAME``) this file is the other process of the
two-process tests: it starts a NIXL agent with a 1 MiB registered buffer, prints its metadata and
the buffer's address as one JSON line, and serves one JSON command per line on stdin.
"""

import asyncio
import importlib
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry._core

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
SIZE = 1 << 20


def pattern(seed, n, offset=0):
    i = np.arange(offset, offset + n, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def wait_for(cond, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.002)
    return cond()


def wait_done(agent, handle, timeout=10.0):
    state = wait_for(lambda: agent.check_xfer_state(handle) == "DONE", timeout)
    assert state, "the transfer did not finish within %s s" % timeout


# ---------------------------------------------------------------- the peer process

def peer_main(name):
    import ferry.nixl as nixl
    agent = nixl.nixl_agent(name)
    buf = np.zeros(SIZE, dtype=np.uint8)
    agent.register_memory(buf)
    out = {"md": agent.get_agent_metadata().hex(), "addr": int(buf.ctypes.data)}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "load":
            r = {"name": agent.add_remote_agent(bytes.fromhex(cmd["md"])).decode()}
        elif op == "notifs":
            got = {}
            deadline = time.time() + cmd.get("timeout", 5)
            while sum(len(v) for v in got.values()) < cmd["count"] and time.time() < deadline:
                for k, v in agent.get_new_notifs().items():
                    got.setdefault(k, []).extend(v)
                time.sleep(0.002)
            r = {k: [m.hex() for m in v] for k, v in got.items()}
        elif op == "check":
            o, n = cmd["offset"], cmd["length"]
            r = {"ok": bool((buf[o:o + n] == pattern(cmd["seed"], n, o)).all())}
        elif op == "sum":
            r = {"sum": int(buf.sum(dtype=np.uint64))}
        elif op == "diff":
            bad = np.nonzero(buf != pattern(cmd["seed"], SIZE))[0]
            r = {"n": int(len(bad)), "first": int(bad[0]) if len(bad) else -1, "last": int(bad[-1]) if len(bad) else -1}
        elif op == "fill":
            buf[:] = pattern(cmd["seed"], SIZE)
            r = {"ok": True}
        elif op == "notify":
            agent.send_notif(cmd["to"].encode(), bytes.fromhex(cmd["msg"]))
            r = {"ok": True}
        elif op == "die":
            os._exit(0)
        elif op == "quit":
            # Leaves with the agent, its registration and listener alive: the exit must be prompt and clean.
            return 0
        sys.stdout.write(json.dumps(r) + "\n")
        sys.stdout.flush()
    return 0


class Peer:
    def __init__(self, name):
        env = dict(os.environ, FERRY_DEVICES=os.environ.get("FERRY_DEVICES", "soft_lo"))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer", name], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline())
        self.md = bytes.fromhex(hello["md"])
        self.addr = hello["addr"]
        self.name = name

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def tell(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def peer():
    p = Peer("target")
    yield p
    p.close()


@pytest.fixture(scope="module")
def nixl():
    import ferry.nixl
    ferry.nixl.install_as_nixl()
    return ferry.nixl


@pytest.fixture
def pair(nixl):
    a = nixl.nixl_agent("A")
    b = nixl.nixl_agent("B")
    ba = np.zeros(SIZE, dtype=np.uint8)
    bb = np.zeros(SIZE, dtype=np.uint8)
    a.register_memory(ba)
    b.register_memory(bb)
    assert a.add_remote_agent(b.get_agent_metadata()) == b"B"
    yield a, b, ba, bb
    a.agent.close()
    b.agent.close()


# ---------------------------------------------------------------- [0] package, install hook

def test_install_as_nixl_aliases_every_module(nixl):
    import nixl as imported
    assert imported is nixl
    for sub in ("_api", "_bindings", "_utils", "logging"):
        assert importlib.import_module("nixl." + sub) is getattr(nixl, sub)
    assert "nixl" in sys.modules
    assert nixl.install_as_nixl() is nixl  # idempotent
    from nixl._api import nixl_agent, nixl_agent_config  # noqa: F401
    from nixl._bindings import DRAM_SEG, nixlNotFoundError, nixlXferDList  # noqa: F401
    assert nixl.nixl_agent is nixl._api.nixl_agent and nixl.nixlRegDList is nixl._bindings.nixlRegDList
    assert nixl._bindings.HAVE_UCX_GPU_DEVICE_API is False


def test_ferry_installs_no_top_level_nixl():
    r = subprocess.run([sys.executable, "-c", "import sys, ferry, ferry.nixl; print('nixl' in sys.modules, "
                        "any(n.startswith('nixl.') for n in sys.modules))"], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False False", r.stdout + r.stderr


def test_run_module_runs_an_unmodified_program(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom nixl._api import nixl_agent\n"
                    "print(nixl_agent('x').get_plugin_list(), sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-m", "ferry.nixl.run", str(prog), "--flag"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "['FERRY', 'UCX'] ['--flag']" in r.stdout


# ---------------------------------------------------------------- [1] [2] backends, agent, config

def test_config_and_sync_modes(nixl):
    from nixl._api import nixl_agent_config, nixl_thread_sync_t
    assert [m.name for m in nixl_thread_sync_t] == ["NIXL_THREAD_SYNC_NONE", "NIXL_THREAD_SYNC_STRICT",
                                                    "NIXL_THREAD_SYNC_RW"]
    assert nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT is nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
    c = nixl_agent_config(True, True, 0)
    assert (c.enable_pthread, c.enable_listen, c.port, c.backends, c.num_threads) == (True, True, 0, ["UCX"], 0)
    with pytest.raises(TypeError, match="sync_mode must be a nixl_thread_sync_t"):
        nixl_agent_config(sync_mode=1)
    with pytest.raises(ValueError):
        nixl.nixl_agent("")


def test_agent_builds_through_bindings_at_call_time(nixl, monkeypatch):
    seen = []
    real = nixl._bindings.nixlAgent

    def spy(name, cfg):
        seen.append(cfg.syncMode)
        return real(name, cfg)

    monkeypatch.setattr(nixl._bindings, "nixlAgent", spy)
    from nixl._api import nixl_agent_config, nixl_thread_sync_t
    nixl.nixl_agent("s1", nixl_agent_config(sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_RW))
    nixl.nixl_agent("s2", nixl_agent_config(True, True, 0))
    assert seen == [nixl._bindings.NIXL_THREAD_SYNC_RW, nixl._bindings.NIXL_THREAD_SYNC_STRICT]


def test_backends(nixl, caplog):
    a = nixl.nixl_agent("b1", nixl.nixl_agent_config(backends=[]))
    assert a.get_plugin_list() == ["FERRY", "UCX"] and a.backends == {}
    served = ["DRAM_SEG", "VRAM_SEG"] if ferry._core.cuda()["usable"] else ["DRAM_SEG"]
    assert a.get_plugin_mem_types("UCX") == served and a.get_plugin_mem_types("GDS") == []
    assert "num_threads" in a.get_plugin_params("FERRY") and a.get_plugin_params("POSIX") == {}
    a.create_backend("FERRY", {"num_threads": "4"})
    assert a.get_backend_mem_types("FERRY") == served and a.get_backend_params("FERRY")["num_threads"] == "4"
    with pytest.raises(nixl.nixlInvalidParamError):
        a.create_backend("FERRY")
    with pytest.raises(nixl.nixlNotFoundError):
        a.create_backend("GDS")
    b = nixl.nixl_agent("b2", nixl.nixl_agent_config(backends=["LIBFABRIC", "UCX"]))
    assert list(b.backends) == ["UCX"]
    # A FERRY agent and a UCX agent are one engine: they move bytes to each other.
    buf_a, buf_b = pattern(3, 4096), np.zeros(4096, np.uint8)
    a.register_memory(buf_a)
    b.register_memory(buf_b)
    a.add_remote_agent(b.get_agent_metadata())
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(buf_a), b.get_xfer_descs(buf_b), "b2")
    a.transfer(h)
    wait_done(a, h)
    assert (buf_b == buf_a).all()
    assert a.query_xfer_backend(h) == "FERRY"


# ---------------------------------------------------------------- [4] descriptor lists

def test_descriptor_lists(nixl):
    from nixl._bindings import DRAM_SEG, FILE_SEG, nixlRegDList, nixlXferDList
    x = nixlXferDList(DRAM_SEG, [(1000, 64, 0), (1064, 64, 0), (1000, 128, 0)])  # overlapping is allowed
    assert x.descCount() == 3 and not x.isEmpty() and x.getType() == DRAM_SEG and x[1] == (1064, 64, 0)
    assert pickle.loads(pickle.dumps(x)) == x
    y = nixlXferDList(DRAM_SEG, np.array([[1000, 64, 0], [1064, 64, 0], [1000, 128, 0]], dtype=np.uint64))
    assert y == x
    y[2] = (5, 5, 0)
    assert y != x and y.index((5, 5, 0)) == 2
    with pytest.raises(nixl.nixlNotFoundError):
        y.index((6, 6, 0))
    y.remDesc(2)
    y.addDesc((7, 7, 0))
    assert y.descCount() == 3 and y[2] == (7, 7, 0)
    y.clear()
    assert y.isEmpty() and bool(y)
    r = nixlRegDList(FILE_SEG, [(0, 10, 3, "meta"), (10, 10, 3, b"m\0")])
    assert r[0] == (0, 10, 3, b"meta") and r[1][3] == b"m\0"
    assert pickle.loads(pickle.dumps(r)) == r and r.trim() == nixlXferDList(FILE_SEG, [(0, 10, 3), (10, 10, 3)])
    with pytest.raises(ValueError):
        nixlXferDList(DRAM_SEG, np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(TypeError):
        nixlXferDList(DRAM_SEG, [[1, 2, 3]])


def test_get_descs_inputs(nixl):
    a = nixl.nixl_agent("d1")
    arr = np.zeros((100000, 3), dtype=np.uint64)
    arr[:, 0] = np.arange(100000) * 64
    arr[:, 1] = 64
    t0 = time.perf_counter()
    x = a.get_xfer_descs(arr)
    assert time.perf_counter() - t0 < 0.5 and x.descCount() == 100000 and x[99999] == (99999 * 64, 64, 0)
    assert a.get_reg_descs(arr)[5] == (320, 64, 0, b"")
    assert a.get_xfer_descs(arr.astype(np.int64)) == x
    with pytest.raises(ValueError):
        a.get_xfer_descs(arr.astype(np.int32))
    assert a.get_xfer_descs([(1, 2, 0)]) is None  # tuples need a mem_type
    assert a.get_xfer_descs([(1, 2, 0, "")], "DRAM") is None  # 4-tuples are not transfer descriptors
    assert a.get_reg_descs([(1, 2, 0)], "DRAM") is None
    assert a.get_reg_descs(x) is None and a.get_xfer_descs(a.get_reg_descs(arr)) is None
    with pytest.raises(KeyError):
        a.get_xfer_descs([(1, 2, 0)], "HBM")
    assert a.get_xfer_descs([(1, 2, 0)], "cpu") == a.get_xfer_descs([(1, 2, 0)], "DRAM")
    buf = np.zeros(4096, np.uint8)
    assert a.get_xfer_descs(buf)[0] == (buf.ctypes.data, 4096, 0)
    torch = pytest.importorskip("torch")
    t = torch.zeros(256, dtype=torch.float32)
    assert a.get_xfer_descs(t)[0] == (t.data_ptr(), 1024, 0)
    assert a.get_xfer_descs([t, t[:10]])[1] == (t.data_ptr(), 40, 0)
    assert a.get_xfer_descs(t.view(16, 16).t()) is None  # not contiguous


# ---------------------------------------------------------------- [4] [5] [6] transfers in one process

def test_write_read_notifications_and_repost(pair):
    a, b, ba, bb = pair
    ba[:] = pattern(1, SIZE)
    local = a.get_xfer_descs([(ba.ctypes.data, 4096, 0), (ba.ctypes.data + 8192, 100, 0)], "DRAM")
    remote = a.get_xfer_descs([(bb.ctypes.data + 4096, 4096, 0), (bb.ctypes.data + 100000, 100, 0)], "DRAM")
    h = a.initialize_xfer("WRITE", local, remote, b"B", b"tag\0one")
    assert a.transfer(h) in ("DONE", "PROC")
    wait_done(a, h)
    assert (bb[4096:8192] == ba[:4096]).all() and (bb[100000:100100] == ba[8192:8292]).all()
    assert not bb[:4096].any() and not bb[8192:100000].any()
    # Delivered without the sender polling again, keyed by the sender's name, bytes intact.
    assert wait_for(lambda: b.update_notifs().get("A")) == [b"tag\0one"]
    # Reposting a finished request, with a new notification for this post.
    bb[:] = 0
    assert a.transfer(h, b"tag two") in ("DONE", "PROC")
    wait_done(a, h)
    assert (bb[4096:8192] == ba[:4096]).all()
    assert wait_for(lambda: b.check_remote_xfer_done("A", b"two", tag_is_prefix=False))
    assert b.check_remote_xfer_done("A", b"tag")  # the first message, still there
    assert not b.check_remote_xfer_done("A", b"")
    # A request that completed while nobody polled is posted again without a check in between.
    h3 = a.initialize_xfer("WRITE", local, remote, "B")
    a.transfer(h3)
    time.sleep(0.2)
    bb[:] = 0
    a.transfer(h3)
    wait_done(a, h3)
    assert (bb[4096:8192] == ba[:4096]).all()
    # READ brings the remote bytes here.
    bb[:] = pattern(2, SIZE)
    ba[:] = 0
    h2 = a.initialize_xfer(operation="READ", local_descs=local, remote_descs=remote, remote_agent="B")
    a.transfer(h2)
    wait_done(a, h2)
    assert (ba[:4096] == bb[4096:8192]).all() and (ba[8192:8292] == bb[100000:100100]).all()
    a.release_xfer_handle(h2)
    h.release()
    with pytest.raises(nixl_errors().nixlNotFoundError):
        a.check_xfer_state(h2)
    # Standalone notifications, str or bytes, a few KB.
    a.send_notif("B", "x" * 8192)
    with pytest.raises(nixl_errors().nixlNotFoundError):
        b.send_notif("A", b"back")  # B never loaded A's metadata
    b.add_remote_agent(a.get_agent_metadata())
    b.send_notif(b"A", notif_msg=b"back")
    assert wait_for(lambda: b.get_new_notifs().get("A")) == [b"x" * 8192]
    assert wait_for(lambda: a.get_new_notifs().get("B")) == [b"back"]


def nixl_errors():
    import ferry.nixl
    return ferry.nixl


def test_prepped_lists_loopback_and_index_arrays(pair):
    a, b, ba, bb = pair
    blocks = 64
    ba[:] = pattern(4, SIZE)
    rows = np.zeros((blocks, 3), dtype=np.uint64)
    rows[:, 0] = ba.ctypes.data + np.arange(blocks) * 4096
    rows[:, 1] = 4096
    rrows = rows.copy()
    rrows[:, 0] = bb.ctypes.data + np.arange(blocks) * 4096
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows)
    remote = a.prep_xfer_dlist(b"B", rrows, "DRAM")
    idx = np.array([3, 5, 6, 7, 63], dtype=np.int64)
    ridx = np.array([0, 1, 2, 10, 11], dtype=np.int64)
    h = a.make_prepped_xfer("WRITE", local, idx, remote, ridx, b"prepped")
    a.transfer(h)
    wait_done(a, h)
    for l, r in zip(idx, ridx):
        assert (bb[r * 4096:(r + 1) * 4096] == ba[l * 4096:(l + 1) * 4096]).all()
    assert not bb[3 * 4096:10 * 4096].any()
    assert wait_for(lambda: b.get_new_notifs().get("A")) == [b"prepped"]
    # Loopback: this agent's own name is a target in its own memory.
    self_side = a.prep_xfer_dlist("A", rows)
    h2 = a.make_prepped_xfer("WRITE", local, [0], self_side, [1])
    assert a.transfer(h2) == "DONE" and (ba[4096:8192] == ba[:4096]).all()
    with pytest.raises(nixl_errors().nixlInvalidParamError):
        a.make_prepped_xfer("READ", local, [0, 1], remote, [0])
    with pytest.raises(nixl_errors().nixlInvalidParamError):
        a.make_prepped_xfer("READ", local, [64], remote, [0])
    with pytest.raises(KeyError):
        a.make_prepped_xfer("MOVE", 0, [0], 0, [0])
    a.release_dlist_handle(local)
    remote.release()


def test_telemetry(nixl, monkeypatch):
    monkeypatch.delenv("NIXL_TELEMETRY_ENABLE", raising=False)
    a = nixl.nixl_agent("t1", nixl.nixl_agent_config(capture_telemetry=True))
    buf = np.zeros(256, np.uint8)
    a.register_memory(buf)
    d = a.get_xfer_descs([(buf.ctypes.data, 64, 0), (buf.ctypes.data + 64, 64, 0)], "DRAM")
    s = a.get_xfer_descs([(buf.ctypes.data + 128, 64, 0), (buf.ctypes.data + 192, 64, 0)], "DRAM")
    h = a.initialize_xfer("WRITE", d, s, "t1")
    a.transfer(h)
    wait_done(a, h)
    t = a.get_xfer_telemetry(h)
    assert (t.totalBytes, t.descCount) == (128, 2)
    assert t.postDuration > 0 and t.xferDuration >= t.postDuration and t.startTime > 1.6e15
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "off")
    off = nixl.nixl_agent("t2", nixl.nixl_agent_config(capture_telemetry=True))
    off.register_memory(buf)
    h = off.initialize_xfer("WRITE", d, s, "t2")
    off.transfer(h)
    with pytest.raises(nixl.nixlNoTelemetryError):
        off.get_xfer_telemetry(h)
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "maybe")
    with pytest.raises(nixl.nixlInvalidParamError):
        nixl.nixl_agent("t3")


# ---------------------------------------------------------------- [3] metadata

def test_metadata_listener_and_partial_metadata(nixl, capfd):
    target = nixl.nixl_agent("L1", nixl.nixl_agent_config(True, True, 0))
    port = int(capfd.readouterr().err.split("MD listener is listening on port")[1].split()[0])
    tbuf = pattern(5, 8192)
    target.register_memory(tbuf)
    init = nixl.nixl_agent("L2")
    ibuf = np.zeros(8192, np.uint8)
    init.register_memory(ibuf)
    init.fetch_remote_metadata("L1", "127.0.0.1", port)
    assert wait_for(lambda: init.check_remote_metadata("L1"))
    assert init.check_remote_metadata("L1", init.get_xfer_descs(tbuf))
    assert not init.check_remote_metadata("L1", init.get_xfer_descs([(tbuf.ctypes.data + 8000, 400, 0)], "DRAM"))
    init.send_local_metadata("127.0.0.1", port)
    assert wait_for(lambda: target.check_remote_metadata("L2"))
    init.invalidate_local_metadata("127.0.0.1", port)
    assert wait_for(lambda: not target.check_remote_metadata("L2"))
    # Partial metadata: a second region reaches the peer by itself and merges with the first.
    more = pattern(6, 4096)
    reg2 = target.register_memory(more)
    part = target.get_partial_agent_metadata(reg2, inc_conn_info=False)
    init.remove_remote_agent("L1")
    init.remove_remote_agent("never-loaded")  # not an error
    first = target.get_partial_agent_metadata(target.get_reg_descs(tbuf), inc_conn_info=True)
    init.add_remote_agent(first)
    h = init.initialize_xfer("READ", init.get_xfer_descs(ibuf), init.get_xfer_descs(tbuf), "L1")
    init.transfer(h)
    wait_done(init, h)
    assert (ibuf == tbuf).all()
    with pytest.raises(nixl.nixlNotFoundError):
        init.initialize_xfer("READ", init.get_xfer_descs(ibuf[:4096]), init.get_xfer_descs(more), "L1")
    init.add_remote_agent(part)
    h = init.initialize_xfer("READ", init.get_xfer_descs(ibuf[:4096]), init.get_xfer_descs(more), "L1")
    init.transfer(h)
    wait_done(init, h)
    assert (ibuf[:4096] == more).all()
    # Harmless when nobody listens any more.
    target.agent.close()
    init.send_local_metadata("127.0.0.1", port)
    init.invalidate_local_metadata("127.0.0.1", port)


def test_metadata_through_etcd(nixl, monkeypatch):
    """NIXL_ETCD_ENDPOINTS: metadata without an address goes through a real etcd on loopback, under
    {NIXL_ETCD_NAMESPACE}{agent}/{label}; a fetch made before the publish sees it arrive."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_agent import server_or_skip
    from ferry._core.agent import Store
    # Without the variable, an address-less exchange says what is missing.
    plain = nixl.nixl_agent("E0")
    with pytest.raises(nixl.nixlNotSupportedError, match="NIXL_ETCD_ENDPOINTS"):
        plain.send_local_metadata()
    etcd = server_or_skip("etcd")
    try:
        namespace = "/ferry-test-%d/agents/" % os.getpid()
        monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:%d" % etcd.port)
        monkeypatch.setenv("NIXL_ETCD_NAMESPACE", namespace)
        store = Store("etcd://127.0.0.1:%d" % etcd.port)
        target = nixl.nixl_agent("E1")
        tbuf = pattern(7, 8192)
        target.register_memory(tbuf)
        init = nixl.nixl_agent("E2")
        ibuf = np.zeros(8192, np.uint8)
        init.register_memory(ibuf)
        init.fetch_remote_metadata("E1")  # before it is published: the watch sees the put
        time.sleep(0.2)
        target.send_local_metadata()
        assert wait_for(lambda: init.check_remote_metadata("E1"))
        assert store.get(namespace + "E1/metadata") == target.get_agent_metadata()
        h = init.initialize_xfer("READ", init.get_xfer_descs(ibuf), init.get_xfer_descs(tbuf), "E1")
        init.transfer(h)
        wait_done(init, h)
        assert (ibuf == tbuf).all()
        # Partial metadata under a label of its own.
        more = pattern(8, 4096)
        reg2 = target.register_memory(more)
        with pytest.raises(nixl.nixlNotFoundError):
            init.initialize_xfer("READ", init.get_xfer_descs(ibuf[:4096]), init.get_xfer_descs(more), "E1")
        with pytest.raises(nixl.nixlInvalidParamError):
            target.send_partial_agent_metadata(reg2)  # etcd needs a label
        target.send_partial_agent_metadata(reg2, label="second")
        assert wait_for(lambda: store.get(namespace + "E1/second") is not None)
        init.fetch_remote_metadata("E1", label="second")
        assert wait_for(lambda: init.check_remote_metadata("E1", init.get_xfer_descs(more)))
        h = init.initialize_xfer("READ", init.get_xfer_descs(ibuf[:4096]), init.get_xfer_descs(more), "E1")
        init.transfer(h)
        wait_done(init, h)
        assert (ibuf[:4096] == more).all()
        # Invalidation removes every key of the agent, and only those.
        init.send_local_metadata()
        assert wait_for(lambda: store.get(namespace + "E2/metadata") is not None)
        target.invalidate_local_metadata()
        assert wait_for(lambda: store.list(namespace + "E1/") == [])
        assert store.get(namespace + "E2/metadata") is not None
        # A malformed endpoint is refused when the agent is made.
        monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "https://127.0.0.1:%d" % etcd.port)
        with pytest.raises(nixl.nixlInvalidParamError, match="NIXL_ETCD_ENDPOINTS"):
            nixl.nixl_agent("E3")
        for a in (target, init):
            a.agent.close()
    finally:
        plain.agent.close()
        etcd.close()


@pytest.mark.parametrize("blob", [b"", b"\xff\x00garbage", b"{}", b'{"ferry_nixl": 1}', b'[1, 2]',
                                  b'{"ferry_nixl": 1, "name": "x", "regions": [["k", -1, 2, 0]]}',
                                  b'{"ferry_nixl": 1, "name": "x", "regions": [], "conn": {"address": "zz", '
                                  b'"notify": []}}', pickle.dumps({"name": "x"})])
def test_malformed_metadata_is_refused(nixl, blob):
    a = nixl.nixl_agent("m1")
    with pytest.raises((nixl.nixlInvalidParamError, nixl.nixlNotFoundError)):
        a.add_remote_agent(blob)
    assert not a.check_remote_metadata("x")


def test_newer_metadata_version_is_a_mismatch(nixl):
    a = nixl.nixl_agent("m2")
    with pytest.raises(nixl.nixlMismatchError, match="version 2"):
        a.add_remote_agent(b'{"ferry_nixl": 2, "name": "x", "regions": []}')


# ---------------------------------------------------------------- [6] [8] bad input, nothing moved

def test_bad_input_raises_nixl_errors_and_moves_nothing(pair):
    a, b, ba, bb = pair
    n = nixl_errors()
    ba[:] = 9
    bb[:] = 0
    loc = a.get_xfer_descs([(ba.ctypes.data, 4096, 0)], "DRAM")
    with pytest.raises(KeyError):
        a.initialize_xfer("COPY", loc, loc, "B")
    with pytest.raises(n.nixlNotFoundError, match="'C'"):
        a.initialize_xfer("WRITE", loc, loc, "C")
    outside = a.get_xfer_descs([(bb.ctypes.data + SIZE - 100, 4096, 0)], "DRAM")
    with pytest.raises(n.nixlNotFoundError, match="outside every registration"):
        a.initialize_xfer("WRITE", loc, outside, "B")
    unregistered = np.zeros(4096, np.uint8)
    with pytest.raises(n.nixlNotFoundError):
        a.initialize_xfer("WRITE", a.get_xfer_descs(unregistered), a.get_xfer_descs(bb[:4096]), "B")
    two = a.get_xfer_descs([(bb.ctypes.data, 4096, 0), (bb.ctypes.data + 4096, 4096, 0)], "DRAM")
    with pytest.raises(n.nixlInvalidParamError):
        a.initialize_xfer("WRITE", loc, two, b"B")
    short = a.get_xfer_descs([(bb.ctypes.data, 100, 0)], "DRAM")
    with pytest.raises(n.nixlInvalidParamError):
        a.initialize_xfer("WRITE", loc, short, "B")
    with pytest.raises(n.nixlNotFoundError):
        a.send_notif("nobody", b"x")
    with pytest.raises(n.nixlNotFoundError):
        a.prep_xfer_dlist("nobody", loc)
    reg = a.register_memory(unregistered)
    a.deregister_memory(reg)
    with pytest.raises(n.nixlNotFoundError):
        a.deregister_memory(reg)
    # A region the peer deregistered after its metadata was sent: found missing when posted.
    breg = b.register_memory(unregistered)
    a.add_remote_agent(b.get_agent_metadata())
    h = a.initialize_xfer("WRITE", loc, a.get_xfer_descs(unregistered), "B")
    b.deregister_memory(breg)
    with pytest.raises(n.nixlNotFoundError):
        a.transfer(h)
        wait_done(a, h)
    assert not bb.any() and not unregistered.any()
    with pytest.raises(n.nixlNotSupportedError):
        a.prep_mem_view(loc)
    # Read-only memory stays read-only: a WRITE into it is refused, the bytes untouched.
    owner = n.nixl_agent("RO")
    frozen = np.frombuffer(b"k" * 4096, np.uint8)
    owner.register_memory(frozen)
    a.add_remote_agent(owner.get_agent_metadata())
    h = a.initialize_xfer("WRITE", loc, a.get_xfer_descs(frozen), "RO")
    with pytest.raises(n.nixlInvalidParamError, match="read-only"):
        a.transfer(h)
        wait_done(a, h)
    assert bytes(frozen) == b"k" * 4096
    ro_self = a.register_memory(frozen)
    h = a.initialize_xfer("WRITE", loc, a.get_xfer_descs(frozen), "A")  # loopback
    with pytest.raises(n.nixlInvalidParamError, match="read-only"):
        a.transfer(h)
    assert bytes(frozen) == b"k" * 4096
    a.deregister_memory(ro_self)
    # Memory that is not mapped is refused at registration.
    with pytest.raises(n.nixlInvalidParamError, match="not mapped"):
        a.register_memory([(0x1000, 4096, 0, "")], "DRAM")


def test_dlpack_and_tensor_registration_move_bytes(pair):
    a, b, ba, bb = pair

    class Producer:  # an object that only speaks DLPack, on the CPU
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kwargs):
            return self.arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    src = pattern(40, 4096)
    reg = a.register_memory(Producer(src))
    assert reg.descCount() == 1 and reg[0][1] == 4096
    h = a.initialize_xfer("WRITE", reg.trim(), a.get_xfer_descs(bb[:4096]), "B")
    a.transfer(h)
    wait_done(a, h)
    assert (bb[:4096] == src).all()
    a.deregister_memory(reg)
    torch = pytest.importorskip("torch")
    t = torch.zeros(1024, dtype=torch.int32)
    regt = b.register_memory([t])
    a.add_remote_agent(b.get_agent_metadata())
    ba[:4096] = pattern(41, 4096)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(ba[:4096]), a.get_xfer_descs(t), "B")
    a.transfer(h)
    wait_done(a, h)
    assert (t.numpy().view(np.uint8) == pattern(41, 4096)).all()
    b.deregister_memory(regt)


class TensorOn:
    """What ferry.nixl sees of a tensor on a device: data_ptr(), numel(), element_size(), device."""

    class Device:
        def __init__(self, kind):
            self.type, self.index = kind, 0

    def __init__(self, kind, array):
        self.array, self.device = array, TensorOn.Device(kind)

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True


class CudaArray:
    """A DLPack producer on a CUDA device, with ``__cuda_array_interface__`` (as CuPy) when given
    one; its DLPack capsule is never asked for."""

    def __init__(self, interface=None):
        if interface is not None:
            self.__cuda_array_interface__ = interface

    def __dlpack__(self, stream=None):
        raise AssertionError("exported")

    def __dlpack_device__(self):
        return (2, 0)


def test_storage_and_other_devices_refused_naming_the_type(nixl):
    a = nixl.nixl_agent("v0")
    with pytest.raises(nixl.nixlNotFoundError, match="FILE_SEG"):
        a.register_memory([(0, 4096, 3, "f")], "FILE")
    with pytest.raises(nixl.nixlNotFoundError, match="BLK_SEG"):
        a.prep_xfer_dlist("", nixl.nixlXferDList(nixl.BLK_SEG, [(0x1000, 16, 0)]))
    with pytest.raises(nixl.nixlNotFoundError, match="tensor on mps"):
        a.register_memory([TensorOn("mps", np.zeros(64, np.uint8))])
    with pytest.raises(nixl.nixlNotFoundError, match="tensor on mps"):
        a.get_xfer_descs(TensorOn("mps", np.zeros(64, np.uint8)))


@pytest.mark.skipif(ferry._core.cuda()["usable"], reason="CUDA's driver is usable here: VRAM_SEG registers "
                    "(tests/python/test_gpu.py)")
def test_vram_refused_without_a_usable_driver_naming_why(nixl):
    reason = ferry._core.cuda()["reason"]
    a = nixl.nixl_agent("v1")
    with pytest.raises(nixl.nixlNotFoundError, match="VRAM_SEG.*CUDA") as refused:
        a.register_memory([(0x1000, 4096, 0, "")], "VRAM")
    assert reason and reason in str(refused.value)
    vram = nixl.nixlXferDList(nixl.VRAM_SEG, [(0x1000, 16, 0)])
    with pytest.raises(nixl.nixlNotFoundError, match="VRAM_SEG"):
        a.prep_xfer_dlist("", vram)
    with pytest.raises(nixl.nixlNotFoundError, match="VRAM_SEG"):
        a.initialize_xfer("READ", vram, vram, "v1")
    memory = np.zeros(64, np.uint8)
    interface = {"data": (memory.ctypes.data, False), "shape": (64,), "typestr": "|u1", "strides": None,
                 "version": 3}
    # Neither a CUDA array (with or without an address) nor a CUDA tensor is taken for host memory.
    for cuda in (CudaArray(), CudaArray(interface), TensorOn("cuda", memory)):
        with pytest.raises(nixl.nixlNotFoundError, match="VRAM_SEG") as refused:
            a.register_memory(cuda)
        assert reason in str(refused.value)


# ---------------------------------------------------------------- two processes

def test_two_processes_write_read_and_notifications(nixl, peer):
    a = nixl.nixl_agent("initiator")
    buf = pattern(11, SIZE)
    a.register_memory(buf)
    assert a.add_remote_agent(peer.md) == b"target"
    local = a.get_xfer_descs(buf)
    remote = a.get_xfer_descs([(peer.addr, SIZE, 0)], "DRAM")
    h = a.initialize_xfer("WRITE", local, remote, "target", b"w1")
    a.transfer(h)
    wait_done(a, h)
    # The target never loaded the initiator's metadata, and still gets its notification.
    assert peer.ask(cmd="notifs", count=1) == {"initiator": [b"w1".hex()]}
    assert peer.ask(cmd="check", seed=11, offset=0, length=SIZE) == {"ok": True}
    peer.ask(cmd="fill", seed=12)
    h2 = a.initialize_xfer("READ", a.get_xfer_descs(buf[4096:8192]),
                           a.get_xfer_descs([(peer.addr + 4096, 4096, 0)], "DRAM"), "target")
    a.transfer(h2)
    wait_done(a, h2)
    assert (buf[4096:8192] == pattern(12, 4096, 4096)).all() and (buf[:4096] == pattern(11, 4096)).all()
    # Standalone notifications from the target, in order, once it loaded our metadata.
    assert peer.ask(cmd="load", md=a.get_agent_metadata().hex()) == {"name": "initiator"}
    for i in range(3):
        peer.ask(cmd="notify", to="initiator", msg=(b"n%d" % i).hex())
    got = []
    wait_for(lambda: got.extend(a.get_new_notifs().get("target", [])) or len(got) == 3)
    assert got == [b"n0", b"n1", b"n2"]


def test_peer_gone_fails_with_remote_disconnect(nixl, peer):
    a = nixl.nixl_agent("survivor")
    buf = np.zeros(SIZE, np.uint8)
    a.register_memory(buf)
    a.add_remote_agent(peer.md)
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(buf), a.get_xfer_descs([(peer.addr, SIZE, 0)], "DRAM"), "target")
    a.transfer(h)
    wait_done(a, h)
    peer.tell(cmd="die")
    peer.proc.wait(timeout=10)
    t0 = time.time()
    with pytest.raises(nixl.nixlRemoteDisconnectError):
        a.transfer(h)
        wait_for(lambda: a.check_xfer_state(h) != "PROC", timeout=20)
    assert time.time() - t0 < 20


def test_repost_active_and_release_of_a_running_request(nixl, peer):
    """A request that cannot finish yet (its peer is stopped): posting it again is refused, and
    releasing it returns only once it settled (its bytes landed), without its notification."""
    import signal
    from stopped import stop_process
    a = nixl.nixl_agent("releaser")
    buf = pattern(21, SIZE)
    a.register_memory(buf)
    a.add_remote_agent(peer.md)
    stop_process(peer.proc.pid)
    timer = threading.Timer(0.5, os.kill, (peer.proc.pid, signal.SIGCONT))
    try:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs(buf), a.get_xfer_descs([(peer.addr, SIZE, 0)], "DRAM"),
                              "target", b"must not arrive")
        assert a.transfer(h) == "PROC"
        assert a.check_xfer_state(h) == "PROC"
        with pytest.raises(nixl.nixlRepostActiveError):
            a.transfer(h)
        timer.start()
        t0 = time.time()
        a.release_xfer_handle(h)
        assert time.time() - t0 >= 0.3  # it waited for the peer to come back and the bytes to land
    finally:
        timer.cancel()
        os.kill(peer.proc.pid, signal.SIGCONT)
    assert peer.ask(cmd="check", seed=21, offset=0, length=SIZE) == {"ok": True}
    with pytest.raises(nixl.nixlNotFoundError):
        a.check_xfer_state(h)
    h2 = a.initialize_xfer("WRITE", a.get_xfer_descs(buf[:16]), a.get_xfer_descs([(peer.addr, 16, 0)], "DRAM"),
                           "target", b"after")
    a.transfer(h2)
    wait_done(a, h2)
    assert peer.ask(cmd="notifs", count=2, timeout=1) == {"releaser": [b"after".hex()]}


def test_release_stops_a_request_that_moves_in_batches(nixl, peer, monkeypatch):
    """A request above BATCH_BYTES moves WINDOW batches at a time: releasing it while it runs posts
    nothing more, waits for the batches in flight, and after that no byte of it lands."""
    import signal
    from ferry.nixl import _engine
    from stopped import stop_process
    batch = 64 << 10
    monkeypatch.setattr(_engine, "BATCH_BYTES", batch)
    monkeypatch.setattr(_engine, "WINDOW", 2)
    a = nixl.nixl_agent("stopper")
    buf = pattern(22, SIZE)
    a.register_memory(buf)
    a.add_remote_agent(peer.md)
    peer.ask(cmd="fill", seed=0)
    # Released while its first two batches cannot end: the target's process is stopped before the
    # first connection to it, so they wait for its wireup.
    stop_process(peer.proc.pid)
    timer = threading.Timer(0.3, os.kill, (peer.proc.pid, signal.SIGCONT))
    try:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs(buf), a.get_xfer_descs([(peer.addr, SIZE, 0)], "DRAM"),
                              "target", b"must not arrive")
        assert a.transfer(h) == "PROC"
        timer.start()
        a.release_xfer_handle(h)
    finally:
        timer.cancel()
        os.kill(peer.proc.pid, signal.SIGCONT)
    landed = peer.ask(cmd="diff", seed=0)
    time.sleep(0.3)
    assert peer.ask(cmd="diff", seed=0) == landed, "bytes landed after release_xfer_handle returned"
    # Exactly the two batches in flight landed over what was there, and nothing else.
    assert landed == {"n": 2 * batch - int((pattern(0, 2 * batch) == buf[:2 * batch]).sum()),
                      "first": 0, "last": 2 * batch - 1}, landed
    assert peer.ask(cmd="check", seed=22, offset=0, length=2 * batch) == {"ok": True}
    assert peer.ask(cmd="notifs", count=1, timeout=0.5) == {}
    # Whole, it moves every byte, and its notification arrives once.
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(buf), a.get_xfer_descs([(peer.addr, SIZE, 0)], "DRAM"),
                          "target", b"whole")
    assert a.transfer(h) in ("PROC", "DONE")
    wait_done(a, h)
    assert peer.ask(cmd="check", seed=22, offset=0, length=SIZE) == {"ok": True}
    assert peer.ask(cmd="notifs", count=1) == {"stopper": [b"whole".hex()]}
    a.release_xfer_handle(h)


def test_a_callers_polls_keep_a_request_of_many_batches_moving(pair, monkeypatch):
    """check_xfer_state posts the next batches itself as the ones in flight end: with the agent's
    loop thread kept busy, a caller's poll loop still moves the whole request (before, only the
    first WINDOW batches moved until the loop thread ran); the loop thread then ends it."""
    from ferry.nixl import _engine
    batch = 64 << 10
    monkeypatch.setattr(_engine, "BATCH_BYTES", batch)
    monkeypatch.setattr(_engine, "WINDOW", 2)
    a, b, ba, bb = pair
    ba[:] = pattern(31, SIZE)
    release = threading.Event()

    async def hold_the_loop():
        release.wait(10)  # blocks a's loop thread until the polls below are done

    held = asyncio.run_coroutine_threadsafe(hold_the_loop(), a.agent._loop)
    try:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs(ba), b.get_xfer_descs(bb), "B")
        a.transfer(h)
        landed = wait_for(lambda: a.check_xfer_state(h) == "PROC" and np.array_equal(ba, bb), timeout=5)
        assert landed, "only %d of %d bytes moved while the caller polled" % (int((ba == bb).sum()), SIZE)
        assert SIZE // batch > 2 * 2, "the request must have more batches than its window"
    finally:
        release.set()
        held.result(5)
    wait_done(a, h)
    a.release_xfer_handle(h)


def test_process_exits_promptly_with_agents_and_handles_alive(peer):
    code = ("import json, sys, numpy as np, ferry.nixl as n\n"
            "a = n.nixl_agent('leaver', n.nixl_agent_config(True, True, 0))\n"
            "buf = np.ones(1 << 20, np.uint8); a.register_memory(buf)\n"
            "a.add_remote_agent(bytes.fromhex(sys.argv[1]))\n"
            "h = a.initialize_xfer('WRITE', a.get_xfer_descs(buf), "
            "a.get_xfer_descs([(int(sys.argv[2]), 1 << 20, 0)], 'DRAM'), 'target', b'bye')\n"
            "a.transfer(h); p = a.prep_xfer_dlist('', a.get_xfer_descs(buf))\n"
            "while a.check_xfer_state(h) != 'DONE': pass\n"
            "print('posted')\n")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code, peer.md.hex(), str(peer.addr)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert "posted" in r.stdout and time.time() - t0 < 15
    assert peer.ask(cmd="sum") == {"sum": 1 << 20}  # the leaver's ones landed before it left
    assert peer.ask(cmd="notifs", count=1) == {"leaver": [b"bye".hex()]}
    # The peer too ends with its agent alive, and exits 0.
    peer.tell(cmd="quit")
    assert peer.proc.wait(timeout=15) == 0


def test_framework_call_shapes(nixl):
    """The calls as Dynamo, vLLM and SGLang make them: keywords, "cpu", bytes names, backends=[]."""
    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t
    sg = nixl_agent("sglang", nixl_agent_config(backends=[], num_threads=2,
                                                sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
    assert "UCX" in sg.get_plugin_list()
    sg.create_backend("UCX", {"num_threads": "2"})
    dyn = nixl_agent("dynamo")
    src = pattern(30, 8192)
    dst = np.zeros(8192, np.uint8)
    reg = dyn.register_memory([(src.ctypes.data, 8192, 0, "")], mem_type="cpu")
    sg.register_memory(dst)
    name = dyn.add_remote_agent(sg.get_agent_metadata())
    assert name == b"sglang"
    local = dyn.get_xfer_descs(descs=[(src.ctypes.data, 8192, 0)], mem_type="cpu")
    remote = dyn.get_xfer_descs(descs=[(dst.ctypes.data, 8192, 0)], mem_type="cpu")
    h = dyn.initialize_xfer(operation="WRITE", local_descs=local, remote_descs=remote, remote_agent=name.decode(),
                            notif_msg="dyn-done")
    dyn.transfer(h)
    assert wait_for(lambda: dyn.check_xfer_state(h) == "DONE")
    assert (dst == src).all()
    assert wait_for(lambda: sg.update_notifs().get("dynamo")) == [b"dyn-done"]
    assert sg.notifs == {"dynamo": [b"dyn-done"]}
    side = dyn.prep_xfer_dlist(name, np.array([[dst.ctypes.data, 8192, 0]], dtype=np.int64), "DRAM")
    mine = dyn.prep_xfer_dlist("", np.array([[src.ctypes.data, 8192, 0]], dtype=np.uint64), "DRAM")
    h2 = dyn.make_prepped_xfer("READ", mine, np.arange(1), side, np.arange(1, dtype=np.int64), b"")
    assert dyn.transfer(h2) in ("DONE", "PROC")
    dyn.release_xfer_handle(h)
    dyn.release_xfer_handle(h2)
    dyn.release_dlist_handle(side)
    dyn.release_dlist_handle(mine)
    dyn.remove_remote_agent(name)
    with pytest.raises(nixl.nixlNotFoundError):
        dyn.send_notif(name, notif_msg=b"gone")
    dyn.deregister_memory(reg)


def test_concurrent_callers(pair):
    a, b, ba, bb = pair
    ba[:] = pattern(7, SIZE)
    errors = []

    def worker(k):
        try:
            off = k * 65536
            d = a.get_xfer_descs([(ba.ctypes.data + off, 65536, 0)], "DRAM")
            r = a.get_xfer_descs([(bb.ctypes.data + off, 65536, 0)], "DRAM")
            for i in range(5):
                h = a.initialize_xfer("WRITE", d, r, "B", b"%d.%d" % (k, i))
                a.transfer(h)
                wait_done(a, h)
                h.release()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert (bb[:8 * 65536] == ba[:8 * 65536]).all()
    got = []
    wait_for(lambda: got.extend(b.get_new_notifs().get("A", [])) or len(got) == 40)
    assert sorted(got) == sorted(b"%d.%d" % (k, i) for k in range(8) for i in range(5))
    for k in range(8):  # from one sender, in order
        mine = [m for m in got if m.startswith(b"%d." % k)]
        assert mine == [b"%d.%d" % (k, i) for i in range(5)]


def test_example_two_peers():
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "nixl", "two_peers.py")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "two peers: 1 MiB written and read back over ferry, verified" in r.stdout
    assert "CORRUPT" not in r.stdout


if __name__ == "__main__" and sys.argv[1:2] == ["--peer"]:
    sys.exit(peer_main(sys.argv[2]))


# ---- the side channel's bounds (docs/security.md) ----

def _frame_server(monkeypatch, secret=None, first_frame=10.0):
    from ferry.nixl import _wire
    if secret is None:
        monkeypatch.delenv("FERRY_AGENT_SECRET", raising=False)
    else:
        monkeypatch.setenv("FERRY_AGENT_SECRET", secret)
    monkeypatch.setattr(_wire, "FIRST_FRAME_SECONDS", first_frame)
    got = []
    server = _wire.FrameServer("127.0.0.1", 0, lambda header, body, sock: got.append((header["type"], body)))
    return _wire, server, got


def _closed_within(sock, seconds):
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_side_channel_closes_a_connection_that_sends_no_frame(monkeypatch):
    _wire, server, got = _frame_server(monkeypatch, first_frame=0.5)
    try:
        idle = socket.create_connection(("127.0.0.1", server.port))
        assert _closed_within(idle, 3.0), "a silent connection was kept past its first-frame deadline"
        with socket.create_connection(("127.0.0.1", server.port)) as s:  # a peer that speaks is served
            s.sendall(_wire.pack_frame("notif", "peer", b"hello"))
            time.sleep(1.0)  # past the first-frame deadline: its connection stays open
            s.sendall(_wire.pack_frame("notif", "peer", b"again"))
            deadline = time.time() + 5
            while len(got) < 2 and time.time() < deadline:
                time.sleep(0.02)
        assert got == [("notif", b"hello"), ("notif", b"again")]
        idle.close()
    finally:
        server.close()


def test_side_channel_frames_carry_the_secrets_mac(monkeypatch):
    _wire, server, got = _frame_server(monkeypatch, secret="s3cret")
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(_wire.pack_frame("notif", "peer", b"signed"))
            deadline = time.time() + 5
            while not got and time.time() < deadline:
                time.sleep(0.02)
        assert got == [("notif", b"signed")]
        monkeypatch.setenv("FERRY_AGENT_SECRET", "another")  # a sender with another secret
        forged = _wire.pack_frame("notif", "peer", b"forged")
        monkeypatch.setenv("FERRY_AGENT_SECRET", "s3cret")
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(forged)
            assert _closed_within(s, 3.0), "a frame with a wrong MAC was kept"
        monkeypatch.delenv("FERRY_AGENT_SECRET")
        unsigned = _wire.pack_frame("notif", "peer", b"unsigned")
        monkeypatch.setenv("FERRY_AGENT_SECRET", "s3cret")
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(unsigned)
            assert _closed_within(s, 3.0), "a frame without a MAC was kept"
        assert got == [("notif", b"signed")]
    finally:
        server.close()


def test_side_channel_in_protected_mode_takes_peers_of_this_host_only():
    from ferry.nixl import _wire

    class Conn:
        def __init__(self, peer, mine):
            self._peer, self._mine = peer, mine

        def getpeername(self):
            return (self._peer, 1)

        def getsockname(self):
            return (self._mine, 2)

    assert _wire._from_this_host(Conn("127.0.0.1", "127.0.0.1"))
    assert _wire._from_this_host(Conn("::ffff:127.0.0.1", "::ffff:127.0.0.1"))
    assert _wire._from_this_host(Conn("10.1.2.3", "10.1.2.3"))  # this host dialing its own address
    assert not _wire._from_this_host(Conn("203.0.113.9", "10.1.2.3"))
