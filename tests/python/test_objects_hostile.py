"""`ferry objects serve` against hostile clients: each attack runs while an innocent client beside it
keeps doing byte-checked PUT/GET round trips, each of which must finish within a few seconds, and
the daemon's memory (VmRSS) and open descriptors (/proc/PID/fd) are checked to stay within bounds.
The daemon runs with short deadlines (--header-timeout, --idle-timeout) so each test takes seconds."""

import os
import socket
import threading
import time

import pytest

from test_objects_s3 import Daemon, raw, recv_all, s3

pytest.importorskip("boto3")

MiB = 1 << 20


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Innocent:
    """A client doing PUT/GET round trips of fresh bytes in a thread; records each trip's time and
    any failure."""

    def __init__(self, url):
        self.client = s3(url)
        self.client.create_bucket(Bucket="innocent")
        self.trips = []
        self.failures = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        n = 0
        while not self.stop.is_set():
            data = os.urandom(64 * 1024 + n)
            start = time.monotonic()
            try:
                self.client.put_object(Bucket="innocent", Key=f"k{n % 4}", Body=data)
                got = self.client.get_object(Bucket="innocent", Key=f"k{n % 4}")["Body"].read()
                if got != data:
                    self.failures.append(f"trip {n}: the bytes differ")
            except Exception as e:  # noqa: BLE001 - any failure of the innocent client is the finding
                self.failures.append(f"trip {n}: {e!r}")
            self.trips.append(time.monotonic() - start)
            n += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)

    def check(self, at_least=3, slowest=3.0):
        assert not self.failures, self.failures[:3]
        assert len(self.trips) >= at_least, self.trips
        assert max(self.trips) < slowest, sorted(self.trips)[-3:]


@pytest.fixture
def daemon():
    d = Daemon(args=("--header-timeout", "1500", "--idle-timeout", "1500", "--max-body", "2G",
                     "--max-receiving", "3G", "--max-connections", "64"))
    yield d
    d.stop()


def open_connection(port, first_bytes):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(first_bytes)
    return s


def test_huge_declared_bodies_commit_no_memory(daemon):
    pid = daemon.proc.pid
    with Innocent(daemon.url) as innocent:
        time.sleep(0.5)
        base = rss_bytes(pid)
        # Each declares 1 GiB and sends 3 bytes: within the bounds, so each is held until its idle
        # limit, yet only what arrived may be committed.
        held = [open_connection(daemon.port, b"PUT /innocent/huge%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                b"\r\nabc" % (i, 1 << 30)) for i in range(2)]
        # Past --max-body: refused before anything is allocated.
        status, reply = raw(daemon.port, b"PUT /innocent/huger HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                            b"\r\nabc" % (10 << 30))
        assert status == 400 and b"EntityTooLarge" in reply, reply[:300]
        # Past --max-receiving (2 GiB held of 3 GiB): 503 SlowDown.
        status, reply = raw(daemon.port, b"PUT /innocent/third HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                            b"\r\nabc" % (int(1.5 * (1 << 30))))
        assert status == 503 and b"SlowDown" in reply, reply[:300]
        time.sleep(1.0)
        assert rss_bytes(pid) - base < 64 * MiB, (base, rss_bytes(pid))
        # The held ones are closed at their idle limit (the client sees the connection end).
        for s in held:
            reply = recv_all(s, timeout=5)
            assert b" 201 " not in reply and b" 200 " not in reply, reply[:200]
            s.close()
        innocent.check()
    names = [o["Key"] for o in innocent.client.list_objects_v2(Bucket="innocent").get("Contents", [])]
    assert not [n for n in names if n.startswith("huge") or n in ("huger", "third")], names
    assert rss_bytes(pid) - base < 64 * MiB


def test_idle_half_sent_requests_do_not_silence_others(daemon):
    pid = daemon.proc.pid
    fd_base = fds(pid)
    with Innocent(daemon.url) as innocent:
        idle = [open_connection(daemon.port, b"GET /innocent/k0 HTTP/1.1\r\nHost: x\r\n") for _ in range(40)]
        time.sleep(1.0)
        assert fds(pid) <= fd_base + 40 + 8
        # Their header deadline closes them all.
        for s in idle:
            recv_all(s, timeout=5)
            s.close()
        time.sleep(0.5)
        innocent.check()
    time.sleep(0.5)
    assert fds(pid) <= fd_base + 4, (fd_base, fds(pid))


def test_connections_past_the_cap_are_answered_503(daemon):
    with Innocent(daemon.url) as innocent:
        idle = [open_connection(daemon.port, b"GET / HTTP/1.1\r\n") for _ in range(80)]
        time.sleep(0.3)
        busy = [s for s in idle if b" 503 " in recv_all(s, timeout=0.2)]
        assert len(busy) >= 80 - 64, len(busy)
        for s in idle:
            s.close()
        time.sleep(1.7)  # the cap's slots come back when the header deadline closes the rest
        innocent.check()


def test_slowloris_headers_are_cut_at_the_deadline(daemon):
    pid = daemon.proc.pid
    with Innocent(daemon.url) as innocent:
        conns = [open_connection(daemon.port, b"GET /innocent/k0 HTTP/1.1\r\n") for _ in range(10)]
        start = time.monotonic()
        closed_at = [None] * len(conns)
        while time.monotonic() - start < 5 and None in closed_at:
            for i, s in enumerate(conns):
                if closed_at[i] is not None:
                    continue
                try:
                    s.sendall(b"X-Slow: a\r\n")  # one header line every 0.2 s: never idle, never done
                except OSError:
                    closed_at[i] = time.monotonic() - start
            time.sleep(0.2)
        for s in conns:
            s.close()
        assert None not in closed_at, closed_at
        assert max(closed_at) < 3.5, closed_at  # the 1.5 s header deadline, and the reset's round trip
        innocent.check()
    assert daemon.alive() and fds(pid) < 64


def test_conflicting_content_length_beside_an_innocent_client(daemon):
    c = s3(daemon.url)
    with Innocent(daemon.url) as innocent:
        c.put_object(Bucket="innocent", Key="victim", Body=b"v" * 100)
        for _ in range(20):
            status, _ = raw(daemon.port, b"PUT /innocent/victim HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                            b"Content-Length: 40\r\n\r\nabcGET /innocent/victim HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 400
        assert c.get_object(Bucket="innocent", Key="victim")["Body"].read() == b"v" * 100
        time.sleep(1.0)
        innocent.check()
