"""`ferry objects serve` as a stock S3 client sees it: boto3 (path-style, plain HTTP) creates a
bucket, puts, gets, heads, lists and deletes objects, with and without SigV4 credentials; the
daemon refuses wrong credentials, and survives malformed HTTP (garbage, truncated requests, huge
headers, a body shorter than its Content-Length, bad descriptors) while it goes on serving."""

import os
import socket
import subprocess
import time

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests"))
FERRY = os.path.join(BIN_DIR, "..", "ferry")


class Daemon:
    def __init__(self, env=None, args=()):
        self.proc = subprocess.Popen([FERRY, "objects", "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, **(env or {})))
        line = self.proc.stdout.readline()
        assert line.startswith("ferry objects: serving http://"), line + self.proc.stderr.read()
        self.url = line.split()[3]
        self.port = int(self.url.rsplit(":", 1)[1])

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.stop()


def s3(url, key="anonymous", secret="anonymous"):
    # Path-style addressing over plain HTTP; checksums only where S3 requires them (as with MinIO).
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required",
                                      retries={"max_attempts": 1}))


def test_boto3_creates_puts_gets_heads_lists_and_deletes(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="models")
    assert [b["Name"] for b in c.list_buckets()["Buckets"]] == ["models"]
    blobs = {"a.bin": os.urandom(1 << 20), "dir/b.bin": os.urandom(12345), "dir/c d.txt": b"hello", "empty": b""}
    for key, data in blobs.items():
        c.put_object(Bucket="models", Key=key, Body=data)
    for key, data in blobs.items():
        got = c.get_object(Bucket="models", Key=key)
        assert got["Body"].read() == data
        assert got["ContentLength"] == len(data)
        head = c.head_object(Bucket="models", Key=key)
        assert head["ContentLength"] == len(data)
        assert head["ETag"]
    part = c.get_object(Bucket="models", Key="a.bin", Range="bytes=100-199")["Body"].read()
    assert part == blobs["a.bin"][100:200]
    listed = c.list_objects_v2(Bucket="models")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(blobs)
    assert {o["Key"]: o["Size"] for o in listed["Contents"]} == {k: len(v) for k, v in blobs.items()}
    assert [o["Key"] for o in c.list_objects_v2(Bucket="models", Prefix="dir/")["Contents"]] == ["dir/b.bin",
                                                                                                "dir/c d.txt"]
    pages = c.get_paginator("list_objects_v2").paginate(Bucket="models", PaginationConfig={"PageSize": 1})
    assert sorted(o["Key"] for p in pages for o in p.get("Contents", [])) == sorted(blobs)
    delimited = c.list_objects_v2(Bucket="models", Delimiter="/")
    assert [p["Prefix"] for p in delimited["CommonPrefixes"]] == ["dir/"]
    assert sorted(o["Key"] for o in c.list_objects(Bucket="models")["Contents"]) == sorted(blobs)  # v1
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket="models", Key="missing")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket="models", Key="missing")
    assert e.value.response["Error"]["Code"] in ("404", "NoSuchKey")
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket="nobucket", Key="x", Body=b"x")
    assert e.value.response["Error"]["Code"] == "NoSuchBucket"
    with pytest.raises(ClientError) as e:
        c.delete_bucket(Bucket="models")
    assert e.value.response["Error"]["Code"] == "BucketNotEmpty"
    for key in blobs:
        c.delete_object(Bucket="models", Key=key)
    assert c.list_objects_v2(Bucket="models")["KeyCount"] == 0
    c.delete_bucket(Bucket="models")
    assert c.list_buckets()["Buckets"] == []


def test_credentials_are_checked_with_sigv4():
    d = Daemon(env={"FERRY_OBJECTS_ACCESS_KEY": "ferrykey", "FERRY_OBJECTS_SECRET_KEY": "s3cr3t-value"})
    try:
        good = s3(d.url, "ferrykey", "s3cr3t-value")
        good.create_bucket(Bucket="secure")
        good.put_object(Bucket="secure", Key="k", Body=b"payload" * 1000)
        assert good.get_object(Bucket="secure", Key="k")["Body"].read() == b"payload" * 1000
        for key, secret, code in (("ferrykey", "wrong", "SignatureDoesNotMatch"), ("other", "s3cr3t-value",
                                                                                     "AccessDenied")):
            with pytest.raises(ClientError) as e:
                s3(d.url, key, secret).get_object(Bucket="secure", Key="k")
            assert e.value.response["Error"]["Code"] == code
            with pytest.raises(ClientError):
                s3(d.url, key, secret).put_object(Bucket="secure", Key="k", Body=b"overwritten")
        # Unsigned plain HTTP is refused; the object is unchanged.
        with socket.create_connection(("127.0.0.1", d.port)) as s:
            s.sendall(b"GET /secure/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = recv_all(s)
        assert b" 400 " in reply.split(b"\r\n")[0] or b" 403 " in reply.split(b"\r\n")[0]
        assert good.get_object(Bucket="secure", Key="k")["Body"].read() == b"payload" * 1000
        # The secret is never printed.
        info = subprocess.run([FERRY, "info", "--config"], capture_output=True, text=True,
                              env=dict(os.environ, FERRY_OBJECTS_SECRET_KEY="s3cr3t-value"))
        assert "s3cr3t-value" not in info.stdout
    finally:
        d.stop()


def recv_all(sock, timeout=10):
    sock.settimeout(timeout)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    return out


def test_the_daemon_survives_malformed_http(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="keep")
    c.put_object(Bucket="keep", Key="k", Body=b"x" * 5000)
    hostile = [
        b"\x00\xff garbage \r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 200000 + b"\r\n\r\n",
        b"PUT /keep/k HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nshort",
        b"PUT /keep/k2 HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"PUT /keep/k3 HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        b"GET /keep/k HTTP/1.1\r\nHost: x\r\nRange: bytes=9999-1\r\nConnection: close\r\n\r\n",
        b"GET /keep/k HTTP/1.1\r\nHost: x\r\nx-ferry-rdma-descriptor: ferry-obj1:AAAA\r\n"
        b"x-ferry-rdma-addr: 4096\r\nx-ferry-rdma-length: 10\r\nConnection: close\r\n\r\n",
        b"GET /keep/k HTTP/1.1\r\nHost: x\r\nx-ferry-rdma-descriptor: x\r\nx-ferry-rdma-addr: no\r\n"
        b"Connection: close\r\n\r\n",
        b"PUT /keep/../../etc/passwd HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        b"PUT /Bad_Bucket HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        b"GET /keep?max-keys=zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"BREW /keep HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /keep/k HTTP/9.9\r\n\r\n",
        b"GET",
    ]
    for request in hostile:
        with socket.create_connection(("127.0.0.1", daemon.port)) as s:
            try:
                s.sendall(request)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            reply = recv_all(s)
        status = reply.split(b"\r\n")[0]
        assert not status.startswith(b"HTTP/1.1 2"), (request[:60], status)
        assert daemon.alive()
    # Half-open connections that never finish their request do not stop others.
    idle = [socket.create_connection(("127.0.0.1", daemon.port)) for _ in range(4)]
    for s in idle:
        s.sendall(b"GET /keep/k HTTP/1.1\r\nHost: x\r\n")
    try:
        assert c.get_object(Bucket="keep", Key="k")["Body"].read() == b"x" * 5000
        assert [o["Key"] for o in c.list_objects_v2(Bucket="keep")["Contents"]] == ["k"]
    finally:
        for s in idle:
            s.close()
    assert daemon.alive()
