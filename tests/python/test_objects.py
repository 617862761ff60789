"""ferry.objects: an object store started in this process, its clients in others.

Every store is a ``ferry.objects.ObjectStore`` on 127.0.0.1, port 0 (the kernel picks one); every
client that moves payloads is a ``ferry.objects.ObjectClient`` in another process (objects_peer.py,
driven by JSON lines), by RDMA or in the HTTP body, or the ``ferry`` program (``ferry objects``).
Payloads are NumPy's generator's bytes for a seed, computed here too, and compared by SHA-256 of
what each side holds: byte for byte.

What is tested: puts and gets of every kind of memory (bytes, bytearray, memoryview, NumPy arrays
of two dtypes, CPU torch tensors), get_into filling the caller's NumPy array in place, both ways of
moving payloads and each reading what the other wrote, a 100 MiB object each way; buckets, list
(with a prefix), head and remove; the progress callable (increasing, ending at the total, once per
piece by RDMA; its exception raised after the call); errors (ferry.NotFound for a missing object or
bucket, ferry.InvalidArgument for a buffer too small or read-only, a bad bucket name, a malformed
URL, ferry.Busy, ferry.Closed); the store's options, statistics and context manager; a store on a
data directory restarted with its objects; SigV4 (an unsigned or wrongly signed client refused, a
signed one served, keys from the arguments or the environment); ``ferry objects mb/put/get/ls/rm/rb``
with files compared byte for byte and a bad option refused with exit code 2 and one line; and a
client SIGKILLed in the middle of a 1 GiB RDMA GET, after which the store serves another client.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import hashlib  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ferry  # noqa: E402
from ferry.objects import ObjectClient, ObjectStore, parse_object_url  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from objects_peer import payload  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests"))
FERRY = os.path.join(BIN_DIR, "..", "ferry")
PEER = os.path.join(HERE, "objects_peer.py")
MiB = 1 << 20
GiB = 1 << 30
WAIT = 120.0  # seconds for any one answer
BIG_WAIT = 400.0  # for the 1 GiB transfers

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

CREDENTIALS = ("FERRY_OBJECTS_ACCESS_KEY", "FERRY_OBJECTS_SECRET_KEY")


def sha(seed, size):
    return hashlib.sha256(payload(seed, size)).hexdigest()


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS}
    env.setdefault("FERRY_LOG_LEVEL", "error")
    env.update(extra)
    return env


class Peer:
    """objects_peer.py in a subprocess: ``ask`` a command, get its answer (a dict)."""

    def __init__(self, url, *options, env=None):
        self.proc = subprocess.Popen([sys.executable, PEER, url, *[str(o) for o in options]], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env or clean_env())
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = self.line(WAIT)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def line(self, timeout=WAIT):
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the peer did not answer within %.0f s" % timeout) from None
        if msg is None:
            raise AssertionError("the peer exited (status %s)" % self.proc.poll())
        return msg

    def send(self, cmd, **fields):
        self.proc.stdin.write((json.dumps(dict(fields, cmd=cmd)) + "\n").encode())
        self.proc.stdin.flush()

    def ask(self, cmd, timeout=WAIT, **fields):
        self.send(cmd, **fields)
        return self.line(timeout)

    def ok(self, cmd, timeout=WAIT, **fields):
        answer = self.ask(cmd, timeout, **fields)
        assert answer["ok"], (cmd, fields, answer)
        return answer

    def fails(self, cmd, error, **fields):
        answer = self.ask(cmd, **fields)
        assert not answer["ok"] and answer["error"] == error, (cmd, fields, answer)
        return answer["message"]

    def put_fails(self, http, error, **fields):
        """A refused put: the store's refusal, by RDMA as in the HTTP body."""
        return self.fails("put", error, **fields)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def listening(store):
    """The store, once its listener takes a connection (no request: every request is counted,
    an unimplemented one as refused)."""
    with socket.create_connection(("127.0.0.1", store.port), timeout=WAIT):
        pass
    return store


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def store():
    with listening(ObjectStore("127.0.0.1", 0)) as s:
        yield s


@pytest.fixture
def peers():
    """``peers(url, *options, ready=True)`` starts a client process; all are closed afterwards."""
    started = []

    def start(url, *options, ready=True, env=None):
        p = Peer(url, *options, env=env)
        started.append(p)
        if ready:
            assert p.hello.get("ready"), p.hello
        return p

    yield start
    for p in started:
        p.close()


def modes():
    return pytest.mark.parametrize("http", [False, True], ids=["rdma", "http"])


def options(http, *more):
    return (["--http"] if http else []) + list(more)


KINDS = ["bytes", "bytearray", "memoryview", "numpy", "float32",
         pytest.param("torch", marks=pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"))]


# ---- payloads ----

@pytest.mark.parametrize("kind", KINDS)
@modes()
def test_put_and_get_every_kind_of_memory(store, peers, kind, http):
    p = peers(store.url, *options(http))
    p.ok("mb", bucket="kinds")
    size = 3 * MiB + 16 * 7
    put = p.ok("put", bucket="kinds", key="k/" + kind, size=size, seed=11, kind=kind)
    assert put["sha256"] == sha(11, size)
    got = p.ok("get", bucket="kinds", key="k/" + kind, kind="bytes")
    assert (got["type"], got["n"], got["sha256"]) == ("bytes", size, sha(11, size))
    if kind != "bytes":  # into a buffer larger than the object: its first `size` bytes
        into = p.ok("get", bucket="kinds", key="k/" + kind, kind=kind, capacity=size + 64)
        assert (into["n"], into["sha256"], into["in_place"]) == (size, sha(11, size), True)
    s = store.stats()
    assert (s["objects"], s["bytes"], s["buckets"]) == (1, size, 1)
    if http:
        assert (s["http_puts"], s["rdma_puts"], s["rdma_gets"]) == (1, 0, 0)
        assert s["http_gets"] == (1 if kind == "bytes" else 2)
    else:
        assert (s["http_puts"], s["http_gets"], s["rdma_puts"]) == (0, 0, 1)
        assert s["rdma_gets"] == (1 if kind == "bytes" else 2)
        assert s["rdma_bytes"] == size * (2 if kind == "bytes" else 3)


def test_rdma_and_http_clients_read_what_the_other_wrote(store, peers):
    rdma, http = peers(store.url), peers(store.url, "--http")
    rdma.ok("mb", bucket="both")
    rdma.ok("put", bucket="both", key="by-rdma", size=5 * MiB + 3, seed=1, kind="numpy")
    http.ok("put", bucket="both", key="by-http", size=5 * MiB + 5, seed=2, kind="bytearray")
    assert http.ok("get", bucket="both", key="by-rdma")["sha256"] == sha(1, 5 * MiB + 3)
    assert rdma.ok("get", bucket="both", key="by-http")["sha256"] == sha(2, 5 * MiB + 5)
    assert rdma.ok("get", bucket="both", key="by-http", kind="numpy", capacity=6 * MiB)["sha256"] == sha(2, 5 * MiB + 5)


@modes()
def test_a_100_mib_numpy_array_put_and_got_into_in_place(store, peers, http):
    size = 100 * MiB
    p = peers(store.url, *options(http))
    p.ok("mb", bucket="big")
    assert p.ok("put", bucket="big", key="w.bin", size=size, seed=100, kind="numpy")["sha256"] == sha(100, size)
    assert p.ok("head", bucket="big", key="w.bin")["info"]["size"] == size
    into = p.ok("get", bucket="big", key="w.bin", kind="numpy", capacity=size)
    assert (into["n"], into["sha256"], into["in_place"]) == (size, sha(100, size), True)
    got = p.ok("get", bucket="big", key="w.bin")
    assert (got["n"], got["sha256"]) == (size, sha(100, size))
    s = store.stats()
    if http:
        assert (s["http_bytes"], s["rdma_bytes"]) == (3 * size, 0)
    else:  # two pieces (64 MiB) each way
        assert (s["rdma_puts"], s["rdma_gets"], s["rdma_bytes"], s["http_bytes"]) == (2, 4, 3 * size, 0)


def test_an_empty_object(store, peers):
    p = peers(store.url)
    p.ok("mb", bucket="empty")
    p.ok("put", bucket="empty", key="nothing", size=0, seed=0, kind="numpy")
    assert p.ok("head", bucket="empty", key="nothing")["info"]["size"] == 0
    assert p.ok("get", bucket="empty", key="nothing")["n"] == 0
    assert p.ok("get", bucket="empty", key="nothing", kind="numpy", capacity=0)["n"] == 0


# ---- buckets, list, head, remove ----

@modes()
def test_buckets_list_head_and_remove(store, peers, http):
    p = peers(store.url, *options(http))
    assert p.ok("buckets")["buckets"] == []
    for b in ("zeta", "alpha", "mid.dle"):
        p.ok("mb", bucket=b)
    assert p.ok("buckets")["buckets"] == ["alpha", "mid.dle", "zeta"]
    sizes = {"logs/a": 10, "logs/b/c": 2000, "model/w0": 64 * 1024 + 1, "readme": 1}
    for i, (key, size) in enumerate(sizes.items()):
        p.ok("put", bucket="alpha", key=key, size=size, seed=i)
    listed = p.ok("ls", bucket="alpha")["objects"]
    assert [(o["key"], o["size"]) for o in listed] == sorted(sizes.items())
    assert [o["key"] for o in p.ok("ls", bucket="alpha", prefix="logs/")["objects"]] == ["logs/a", "logs/b/c"]
    assert p.ok("ls", bucket="alpha", prefix="nothing")["objects"] == []
    for o in listed:
        info = p.ok("head", bucket="alpha", key=o["key"])["info"]
        assert info == {"key": o["key"], "size": sizes[o["key"]], "etag": o["etag"]}
        assert info["etag"].startswith('"') and info["etag"].endswith('"')
    # Replacing an object changes its size and etag.
    old = p.ok("head", bucket="alpha", key="readme")["info"]
    p.ok("put", bucket="alpha", key="readme", size=77, seed=9)
    new = p.ok("head", bucket="alpha", key="readme")["info"]
    assert new["size"] == 77 and new["etag"] != old["etag"]
    assert p.ok("get", bucket="alpha", key="readme")["sha256"] == sha(9, 77)

    assert "BucketNotEmpty" in p.fails("rb", "Busy", bucket="alpha")
    p.fails("mb", "Busy", bucket="alpha")
    p.ok("rm", bucket="alpha", key="logs/a")
    p.ok("rm", bucket="alpha", key="logs/a")  # as in S3: no error for a key that is gone
    p.fails("get", "NotFound", bucket="alpha", key="logs/a")
    assert [o["key"] for o in p.ok("ls", bucket="alpha")["objects"]] == ["logs/b/c", "model/w0", "readme"]
    for key in ("logs/b/c", "model/w0", "readme"):
        p.ok("rm", bucket="alpha", key=key)
    p.ok("rb", bucket="alpha")
    p.fails("rb", "NotFound", bucket="alpha")
    assert p.ok("buckets")["buckets"] == ["mid.dle", "zeta"]
    assert store.stats()["buckets"] == 2 and store.stats()["objects"] == 0


# ---- progress ----

def check_progress(calls, total, pieces=None):
    done = [d for d, _ in calls]
    assert calls, "no progress call"
    assert all(t == total for _, t in calls), calls
    assert all(a < b for a, b in zip(done, done[1:])), done
    assert done[-1] == total and done[0] > 0
    if pieces is not None:
        assert len(calls) == pieces, calls


@modes()
def test_progress_increases_to_the_total(store, peers, http):
    size = 8 * MiB + 123
    p = peers(store.url, "--piece", MiB, *options(http))
    p.ok("mb", bucket="prog")
    pieces = None if http else 9  # by RDMA: once per piece of 1 MiB
    check_progress(p.ok("put", bucket="prog", key="o", size=size, seed=5, kind="numpy")["progress"], size, pieces)
    got = p.ok("get", bucket="prog", key="o")
    assert got["sha256"] == sha(5, size)
    check_progress(got["progress"], size, pieces)
    into = p.ok("get", bucket="prog", key="o", kind="numpy", capacity=size)
    check_progress(into["progress"], size, pieces)
    assert p.ok("head", bucket="prog", key="o")["progress"] == []


@modes()
def test_an_exception_in_progress_is_raised_when_the_call_returns(store, http):
    calls = []

    def progress(done, total):
        calls.append(done)
        raise KeyError("stop")

    with ObjectClient.connect(store.url, rdma=not http, piece_bytes=MiB, progress=progress) as c:
        c.create_bucket("raise")
        data = np.frombuffer(payload(3, 4 * MiB), dtype=np.uint8)
        with pytest.raises(KeyError, match="stop"):
            c.put("raise", "o", data)
        assert len(calls) == 1  # not called again in that call
        # The transfer itself went on: the object is whole.
        calls.clear()
        with pytest.raises(KeyError):
            got = c.get("raise", "o")
        calls.clear()
        out = np.zeros(4 * MiB, dtype=np.uint8)
        with pytest.raises(KeyError):
            c.get_into("raise", "o", out)
        assert bytes(out) == payload(3, 4 * MiB)
        assert c.head("raise", "o")["size"] == 4 * MiB  # no progress call, no error
    with ObjectClient(store.url, rdma=not http) as c:
        got = c.get("raise", "o")
        assert got == payload(3, 4 * MiB)


# ---- errors ----

@modes()
def test_errors_of_a_client(store, peers, http):
    p = peers(store.url, *options(http))
    p.ok("mb", bucket="errs")
    p.ok("put", bucket="errs", key="o", size=1000, seed=1)
    assert "404" in p.fails("get", "NotFound", bucket="errs", key="missing")
    p.fails("get", "NotFound", bucket="errs", key="missing", kind="numpy", capacity=10)
    p.fails("head", "NotFound", bucket="errs", key="missing")
    p.fails("get", "NotFound", bucket="nobucket", key="o")
    assert "NoSuchBucket" in p.put_fails(http, "NotFound", bucket="nobucket", key="o", size=10, seed=1)
    assert "NoSuchBucket" in p.fails("ls", "NotFound", bucket="nobucket")
    p.fails("rm", "NotFound", bucket="nobucket", key="o")
    msg = p.fails("get", "InvalidArgument", bucket="errs", key="o", kind="numpy", capacity=999)
    assert "1000" in msg and "999" in msg
    assert "read-only" in p.fails("get", "InvalidArgument", bucket="errs", key="o", kind="readonly", capacity=1000)
    assert "InvalidBucketName" in p.fails("mb", "InvalidArgument", bucket="Not_Valid")
    p.put_fails(http, "InvalidArgument", bucket="errs", key="a/../b", size=10, seed=1)
    # The client goes on working after its errors.
    assert p.ok("get", bucket="errs", key="o")["sha256"] == sha(1, 1000)


@pytest.mark.parametrize("url", [
    "ftp://127.0.0.1:9000", "http://127.0.0.1", "http://127.0.0.1:70000", "http://127.0.0.1:x", "127.0.0.1:9000", "",
    "http://:9000",
])
def test_a_malformed_url_is_invalid(url):
    with pytest.raises(ferry.InvalidArgument, match="not an object URL"):
        ObjectClient.connect(url, rdma=False)
    with pytest.raises(ferry.InvalidArgument):
        parse_object_url(url)


def test_a_malformed_url_in_a_client_process(peers):
    p = peers("http://127.0.0.1:port/bucket", ready=False)
    assert p.hello == {"ready": False, "error": "InvalidArgument", "message": p.hello["message"]}
    assert "not an object URL" in p.hello["message"]


def test_parse_object_url():
    assert parse_object_url("http://127.0.0.1:9000") == ("http://127.0.0.1:9000", "", "")
    assert parse_object_url("http://h:1/b") == ("http://h:1", "b", "")
    assert parse_object_url("http://[::1]:9000/b/k/e/y") == ("http://[::1]:9000", "b", "k/e/y")


def test_buffers_that_cannot_be_used(store):
    with ObjectClient(store.url, rdma=False) as c:
        c.create_bucket("bufs")
        with pytest.raises(ferry.InvalidArgument, match="expected a buffer"):
            c.put("bufs", "o", "text is not bytes")
        with pytest.raises(ferry.InvalidArgument, match="not a contiguous buffer"):
            c.put("bufs", "o", np.zeros((8, 8), dtype=np.uint8)[:, ::2])
        c.put("bufs", "o", b"12345678")
        with pytest.raises(ferry.InvalidArgument, match="not a contiguous buffer"):
            c.get_into("bufs", "o", np.zeros((8, 8), dtype=np.uint8)[:, ::2])
        with pytest.raises(ferry.InvalidArgument, match="read-only"):
            c.get_into("bufs", "o", memoryview(bytearray(8)).toreadonly())
        out = bytearray(8)
        assert c.get_into("bufs", "o", out) == 8 and out == b"12345678"


def test_a_closed_client_and_options(store):
    c = ObjectClient.connect(store.url, rdma=False)
    with c:
        c.create_bucket("closing")
        assert not c.closed
    assert c.closed
    with pytest.raises(ferry.Closed):
        c.buckets()
    c.close()  # idempotent
    with pytest.raises(ferry.InvalidArgument, match="piece"):
        ObjectClient(store.url, piece_bytes=0)
    with pytest.raises(ferry.InvalidArgument, match="piece"):
        ObjectClient(store.url, piece_bytes=GiB + 1)
    with pytest.raises(ferry.InvalidArgument, match="timeout"):
        ObjectClient(store.url, timeout=0)
    with pytest.raises(ferry.InvalidArgument, match="progress"):
        ObjectClient(store.url, progress=42)


# ---- the store ----

def test_the_store_object(tmp_path):
    with listening(ObjectStore.start(port=0, threads=2)) as s:
        assert s.url == "http://127.0.0.1:%d" % s.port and s.port > 0
        assert repr(s) == "<ferry ObjectStore %s>" % s.url
        assert s.stats() == dict.fromkeys(["objects", "bytes", "buckets", "rdma_gets", "rdma_puts", "http_gets",
                                           "http_puts", "rdma_bytes", "http_bytes", "refused", "memory_bytes",
                                           "cached_objects"], 0)
        with ObjectClient(s.url, rdma=False) as c:
            c.create_bucket("counted")
            with pytest.raises(ferry.NotFound):
                c.get("counted", "missing")
        assert s.stats()["refused"] == 1 and s.stats()["buckets"] == 1
    s.stop()  # idempotent
    with ObjectClient(s.url, rdma=False) as c:  # nothing listens any more
        with pytest.raises(ferry.Unavailable):
            c.buckets()
    for bad in ({"threads": 0}, {"threads": 257}, {"port": 70000}, {"rdma_port": -1},
                {"access_key": "only-the-access-key"}):
        with pytest.raises(ferry.InvalidArgument):
            ObjectStore(**bad)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"x")
    with pytest.raises(ferry.IoError):
        ObjectStore(data_dir=not_a_dir)


def test_a_port_in_use_is_unavailable(store):
    with pytest.raises(ferry.Unavailable):
        second = ObjectStore(port=store.port)
        # It started: connections to the port may reach either store, so wait for its listener
        # thread before stopping it (see test_a_store_stopped_at_once_stops).
        time.sleep(1.0)
        second.stop()


def test_a_store_stopped_at_once_stops():
    code = "from ferry.objects import ObjectStore\nfor _ in range(20):\n    ObjectStore().stop()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=clean_env())
    try:
        assert proc.wait(timeout=20) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("ObjectStore().stop() right after the start did not return within 20 s") from None


def test_a_store_on_a_data_dir_keeps_its_objects_across_a_restart(tmp_path, peers):
    data = tmp_path / "objects"
    objects = {"a.bin": (1 * MiB, 21), "dir/sub/b.bin": (3 * MiB + 1, 22), "empty": (0, 23)}
    with listening(ObjectStore(data_dir=data)) as first:
        p = peers(first.url)
        p.ok("mb", bucket="kept")
        p.ok("mb", bucket="unused")
        for key, (size, seed) in objects.items():
            p.ok("put", bucket="kept", key=key, size=size, seed=seed, kind="numpy")
        p.close()
    for key, (size, seed) in objects.items():  # the files, as they are
        assert (data / "kept" / key).read_bytes() == payload(seed, size)
    with listening(ObjectStore(data_dir=str(data))) as second:
        assert second.port != 0
        s = second.stats()
        assert (s["objects"], s["buckets"], s["bytes"]) == (3, 2, 4 * MiB + 1)
        for http in (False, True):
            p = peers(second.url, *options(http))
            assert p.ok("buckets")["buckets"] == ["kept", "unused"]
            assert [(o["key"], o["size"]) for o in p.ok("ls", bucket="kept")["objects"]] == sorted(
                (k, v[0]) for k, v in objects.items())
            for key, (size, seed) in objects.items():
                got = p.ok("get", bucket="kept", key=key, kind="numpy", capacity=size)
                assert (got["n"], got["sha256"]) == (size, sha(seed, size))
        p.ok("rm", bucket="kept", key="a.bin")
        p.ok("rb", bucket="unused")
    assert not (data / "kept" / "a.bin").exists() and not (data / "unused").exists()
    with listening(ObjectStore(data_dir=data)) as third:
        assert (third.stats()["objects"], third.stats()["buckets"]) == (2, 1)


def test_a_store_on_disk_holds_more_than_its_memory(tmp_path, peers):
    """With data_dir, memory is the objects' cache: puts past max_memory_bytes are stored, the least
    recently used objects leave memory, and RDMA and HTTP gets read every one back; an object larger
    than the memory bound (a file put there by hand) is sent by RDMA piece by piece."""
    data = tmp_path / "objects"
    cap = 4 * MiB
    objects = {"o%d" % i: (MiB + i, 40 + i) for i in range(6)}
    (data / "disk").mkdir(parents=True)
    (data / "disk" / "big").write_bytes(payload(50, 10 * MiB + 3))
    with listening(ObjectStore(data_dir=data, max_memory_bytes=cap)) as store:
        p = peers(store.url)
        for key, (size, seed) in objects.items():
            p.ok("put", bucket="disk", key=key, size=size, seed=seed, kind="numpy")
        s = store.stats()
        assert (s["objects"], s["bytes"]) == (7, 6 * MiB + 15 + 10 * MiB + 3)
        assert s["memory_bytes"] <= cap and 0 < s["cached_objects"] < 6, s
        objects["big"] = (10 * MiB + 3, 50)
        for http in (True, False):
            p = peers(store.url, *options(http))
            for key, (size, seed) in objects.items():
                got = p.ok("get", bucket="disk", key=key, kind="numpy", capacity=size)
                assert (got["n"], got["sha256"]) == (size, sha(seed, size)), key
                assert store.stats()["memory_bytes"] <= cap
        assert 0 < store.stats()["cached_objects"] < 6
        p.ok("rm", bucket="disk", key="o5")
        assert not (data / "disk" / "o5").exists() and not (data / ".ferry" / "meta" / "disk" / "o5").exists()
    with listening(ObjectStore(data_dir=data, max_memory_bytes=cap)) as again:
        assert (again.stats()["objects"], again.stats()["memory_bytes"]) == (6, 0)  # nothing read yet
        got = peers(again.url).ok("get", bucket="disk", key="o2", kind="numpy", capacity=MiB + 2)
        assert got["sha256"] == sha(42, MiB + 2)


# ---- SigV4 ----

KEYS = {"access_key": "AKIDFERRYTEST", "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}


@pytest.fixture
def signed_store():
    with listening(ObjectStore(**KEYS)) as s:
        yield s


@modes()
def test_a_signed_client_is_served(signed_store, peers, http):
    p = peers(signed_store.url, "--access-key", KEYS["access_key"], "--secret-key", KEYS["secret_key"],
              *options(http))
    p.ok("mb", bucket="signed")
    assert p.ok("put", bucket="signed", key="dir/o", size=2 * MiB + 1, seed=8, kind="numpy")["sha256"] == sha(
        8, 2 * MiB + 1)
    assert p.ok("get", bucket="signed", key="dir/o")["sha256"] == sha(8, 2 * MiB + 1)
    assert p.ok("get", bucket="signed", key="dir/o", kind="numpy", capacity=3 * MiB)["sha256"] == sha(8, 2 * MiB + 1)
    assert [o["key"] for o in p.ok("ls", bucket="signed", prefix="dir/")["objects"]] == ["dir/o"]
    assert p.ok("buckets")["buckets"] == ["signed"]
    p.ok("rm", bucket="signed", key="dir/o")
    p.ok("rb", bucket="signed")
    assert signed_store.stats()["refused"] == 0


def test_keys_from_the_environment_sign_too(signed_store, peers):
    env = clean_env(FERRY_OBJECTS_ACCESS_KEY=KEYS["access_key"], FERRY_OBJECTS_SECRET_KEY=KEYS["secret_key"])
    p = peers(signed_store.url, env=env)
    p.ok("mb", bucket="by-env")
    assert p.ok("put", bucket="by-env", key="o", size=1000, seed=4)["sha256"] == p.ok(
        "get", bucket="by-env", key="o")["sha256"]


@modes()
def test_a_wrongly_signed_client_is_permission_denied(signed_store, peers, http):
    owner = peers(signed_store.url, "--access-key", KEYS["access_key"], "--secret-key", KEYS["secret_key"])
    owner.ok("mb", bucket="guarded")
    owner.ok("put", bucket="guarded", key="o", size=4096, seed=6)
    for access, secret in ((KEYS["access_key"], "not-the-secret"), ("AKIDSOMEONEELSE", KEYS["secret_key"])):
        p = peers(signed_store.url, "--access-key", access, "--secret-key", secret, *options(http))
        p.fails("buckets", "PermissionDenied")
        p.fails("mb", "PermissionDenied", bucket="intruder")
        p.fails("get", "PermissionDenied", bucket="guarded", key="o")
        p.fails("get", "PermissionDenied", bucket="guarded", key="o", kind="numpy", capacity=4096)
        p.fails("ls", "PermissionDenied", bucket="guarded")
        p.fails("rm", "PermissionDenied", bucket="guarded", key="o")
        p.put_fails(http, "PermissionDenied", bucket="guarded", key="o", size=100, seed=7)
    assert owner.ok("buckets")["buckets"] == ["guarded"]
    assert owner.ok("get", bucket="guarded", key="o")["sha256"] == sha(6, 4096)


@modes()
def test_an_unsigned_client_is_refused(signed_store, peers, http):
    owner = peers(signed_store.url, "--access-key", KEYS["access_key"], "--secret-key", KEYS["secret_key"])
    owner.ok("mb", bucket="guarded")
    owner.ok("put", bucket="guarded", key="o", size=4096, seed=6)
    p = peers(signed_store.url, *options(http))
    for cmd, fields in (("buckets", {}), ("mb", {"bucket": "intruder"}), ("get", {"bucket": "guarded", "key": "o"}),
                        ("ls", {"bucket": "guarded"}), ("rm", {"bucket": "guarded", "key": "o"}),
                        ("put", {"bucket": "guarded", "key": "o", "size": 100, "seed": 7})):
        answer = p.ask(cmd, **fields)
        assert not answer["ok"], (cmd, answer)
        assert answer["error"] == "PermissionDenied", (cmd, answer)
    assert owner.ok("buckets")["buckets"] == ["guarded"]
    assert owner.ok("get", bucket="guarded", key="o")["sha256"] == sha(6, 4096)


def test_an_unsigned_client_is_permission_denied(signed_store, peers):
    p = peers(signed_store.url, "--http")
    p.fails("buckets", "PermissionDenied")


def test_a_refused_rdma_put_raises_the_stores_error(store, peers):
    p = peers(store.url)
    p.fails("put", "NotFound", bucket="nobucket", key="o", size=10, seed=1)


# ---- the ferry program ----

def ferry_objects(*args, timeout=120):
    return subprocess.run([FERRY, "objects", *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=clean_env())


def test_the_ferry_program_against_the_store(store, tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(payload(31, 5 * MiB + 3))
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello objects\n")
    base = store.url
    r = ferry_objects("mb", base + "/files")
    assert r.returncode == 0, r.stderr
    r = ferry_objects("put", src, base + "/files/dir/model.bin", "--piece", "1M")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("stored ") and "5242883 bytes" in r.stdout and "RDMA" in r.stdout, r.stdout
    r = ferry_objects("put", small, base + "/files/small.txt", "--http")
    assert r.returncode == 0 and "HTTP body" in r.stdout, r.stdout + r.stderr
    r = ferry_objects("ls", base)
    assert (r.returncode, r.stdout) == (0, "files/\n"), r.stderr
    r = ferry_objects("ls", base + "/files")
    assert r.returncode == 0, r.stderr
    assert [line.split() for line in r.stdout.splitlines()] == [["5242883", "dir/model.bin"], ["14", "small.txt"]]
    r = ferry_objects("ls", base + "/files/dir/")
    assert [line.split()[1] for line in r.stdout.splitlines()] == ["dir/model.bin"]
    for how in ((), ("--http",), ("--piece", "64K")):
        out = tmp_path / ("out%d.bin" % len(how))
        r = ferry_objects("get", base + "/files/dir/model.bin", out, *how)
        assert r.returncode == 0 and r.stdout.startswith("fetched "), r.stdout + r.stderr
        assert out.read_bytes() == src.read_bytes()
    r = ferry_objects("get", base + "/files/small.txt", tmp_path / "small.out")
    assert r.returncode == 0 and (tmp_path / "small.out").read_bytes() == small.read_bytes()
    # What the program stored, this process reads back, and the other way round.
    with ObjectClient(base) as c:
        assert c.get("files", "dir/model.bin") == src.read_bytes()
        c.put("files", "from-python", np.frombuffer(payload(32, 70000), dtype=np.uint8))
    r = ferry_objects("get", base + "/files/from-python", tmp_path / "py.bin")
    assert r.returncode == 0 and (tmp_path / "py.bin").read_bytes() == payload(32, 70000)

    r = ferry_objects("rb", base + "/files")
    assert r.returncode == 1 and "Busy" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    for key in ("dir/model.bin", "small.txt", "from-python"):
        assert ferry_objects("rm", base + "/files/" + key).returncode == 0
    r = ferry_objects("get", base + "/files/small.txt", tmp_path / "gone")
    assert r.returncode == 1 and "NotFound" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert ferry_objects("ls", base + "/files").stdout == ""
    assert ferry_objects("rb", base + "/files").returncode == 0
    assert ferry_objects("ls", base).stdout == ""
    assert store.stats()["rdma_puts"] > 0 and store.stats()["rdma_gets"] > 0


@pytest.mark.parametrize("args", [
    ("put", "FILE", "URL/b/k", "--bogus"),
    ("get", "URL/b/k", "FILE", "--piece", "5X"),
    ("ls", "URL", "--unknown", "1"),
    ("put", "FILE", "ftp://nowhere/b/k"),
    ("mb", "URL"),
])
def test_the_ferry_program_refuses_a_bad_option_with_exit_2(store, tmp_path, args):
    src = tmp_path / "f"
    src.write_bytes(b"x")
    argv = [a.replace("FILE", str(src)).replace("URL", store.url) for a in args]
    r = ferry_objects(*argv)
    assert r.returncode == 2, (argv, r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("ferry objects "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


# ---- a client killed in the middle of a transfer ----

def test_a_client_killed_in_the_middle_of_a_1_gib_rdma_get(store, peers):
    writer = peers(store.url)
    writer.ok("mb", bucket="huge")
    wrote = writer.ok("put", timeout=BIG_WAIT, bucket="huge", key="1g", size=GiB, seed=77, kind="numpy")["sha256"]
    writer.close()

    victim = peers(store.url)
    victim.send("get", bucket="huge", key="1g", kind="numpy", capacity=GiB, announce=True)
    started = victim.line(BIG_WAIT)
    assert started["event"] == "started" and 0 < started["done"] < GiB, started
    os.kill(victim.proc.pid, signal.SIGKILL)
    assert victim.proc.wait(timeout=60) == -signal.SIGKILL
    rest = []
    while True:
        msg = victim.lines.get(timeout=60)
        if msg is None:
            break
        rest.append(msg)
    assert rest == [], "the GET finished before the kill: %r" % rest

    # The store goes on: another client gets the whole object, and puts and gets a new one.
    other = peers(store.url)
    got = other.ok("get", timeout=BIG_WAIT, bucket="huge", key="1g", kind="numpy", capacity=GiB)
    assert (got["n"], got["sha256"]) == (GiB, wrote)
    other.ok("put", bucket="huge", key="after", size=MiB + 1, seed=78, kind="bytes")
    assert other.ok("get", bucket="huge", key="after")["sha256"] == sha(78, MiB + 1)
    s = store.stats()
    assert (s["objects"], s["bytes"]) == (2, GiB + MiB + 1)
