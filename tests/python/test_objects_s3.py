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


def raw(port, request, timeout=10):
    """Sends one request on a fresh connection; the status line's code and the whole answer."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        reply = recv_all(s, timeout)
    first = reply.split(b"\r\n", 1)[0].split()
    return (int(first[1]) if len(first) > 1 else None), reply


def test_calls_the_store_does_not_implement_are_refused_and_change_nothing(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="keep")
    data = os.urandom(7000)
    c.put_object(Bucket="keep", Key="k", Body=data)

    def unchanged():
        assert c.get_object(Bucket="keep", Key="k")["Body"].read() == data
        assert [o["Key"] for o in c.list_objects_v2(Bucket="keep")["Contents"]] == ["k"]

    tagging = {"TagSet": [{"Key": "a", "Value": "b"}]}
    calls = [
        lambda: c.put_object_tagging(Bucket="keep", Key="k", Tagging=tagging),
        lambda: c.put_object_acl(Bucket="keep", Key="k", ACL="public-read"),
        lambda: c.copy_object(Bucket="keep", Key="k", CopySource={"Bucket": "keep", "Key": "k"},
                              MetadataDirective="REPLACE"),
        lambda: c.copy_object(Bucket="keep", Key="k2", CopySource={"Bucket": "keep", "Key": "k"}),
        lambda: c.create_multipart_upload(Bucket="keep", Key="k"),
        lambda: c.upload_part(Bucket="keep", Key="k", PartNumber=1, UploadId="x", Body=b"part"),
        lambda: c.get_object_tagging(Bucket="keep", Key="k"),
        lambda: c.get_object_acl(Bucket="keep", Key="k"),
        lambda: c.delete_objects(Bucket="keep", Delete={"Objects": [{"Key": "k"}]}),
        lambda: c.put_bucket_versioning(Bucket="keep", VersioningConfiguration={"Status": "Enabled"}),
        lambda: c.put_bucket_policy(Bucket="keep", Policy="{}"),
        lambda: c.put_bucket_tagging(Bucket="keep", Tagging=tagging),
        lambda: c.put_bucket_cors(Bucket="keep", CORSConfiguration={"CORSRules": [
            {"AllowedMethods": ["GET"], "AllowedOrigins": ["*"]}]}),
        lambda: c.delete_bucket_policy(Bucket="keep"),
        lambda: c.get_object(Bucket="keep", Key="k", VersionId="v1"),
        lambda: c.delete_object(Bucket="keep", Key="k", VersionId="v1"),
    ]
    for call in calls:
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "NotImplemented", e.value.response
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
        unchanged()
    # Unknown subresources over plain HTTP, with a body on a kept-alive connection.
    for target in (b"/keep/k?tagging", b"/keep/k?acl", b"/keep/k?uploads", b"/keep/k?uploadId=1&partNumber=1",
                   b"/keep?lifecycle", b"/keep/k?anything-else=1", b"/keep/k?x-id=CopyObject"):
        status, reply = raw(daemon.port, b"PUT " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                            b"Connection: close\r\n\r\nhello")
        assert status == 501 and b"<Code>NotImplemented</Code>" in reply, (target, reply[:300])
        unchanged()
    assert c.list_buckets()["Buckets"][0]["Name"] == "keep" and len(c.list_buckets()["Buckets"]) == 1


def test_conflicting_framing_is_refused(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="keep")
    c.put_object(Bucket="keep", Key="k", Body=b"original")
    for headers in (b"Content-Length: 5\r\nContent-Length: 6\r\n",
                    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                    b"Content-Length: 5, 5\r\n"):
        status, reply = raw(daemon.port, b"PUT /keep/k HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\nhello!")
        assert status == 400, (headers, reply[:300])
        assert c.get_object(Bucket="keep", Key="k")["Body"].read() == b"original"
    status, _ = raw(daemon.port, b"PUT /keep/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n0\r\n\r\n")
    assert status == 501
    # The same Content-Length twice is one length.
    status, _ = raw(daemon.port, b"PUT /keep/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n"
                    b"Connection: close\r\n\r\nhello")
    assert status == 200
    assert c.get_object(Bucket="keep", Key="k")["Body"].read() == b"hello"


def test_unsatisfiable_ranges_are_416(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="ranges")
    data = os.urandom(1000)
    c.put_object(Bucket="ranges", Key="k", Body=data)
    for spec in ("bytes=1000-", "bytes=5000-6000", "bytes=-0"):
        with pytest.raises(ClientError) as e:
            c.get_object(Bucket="ranges", Key="k", Range=spec)
        assert e.value.response["Error"]["Code"] == "InvalidRange", spec
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
        assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["content-range"] == "bytes */1000"
    with pytest.raises(ClientError) as e:  # not even a range (cpp-httplib answers it)
        c.get_object(Bucket="ranges", Key="k", Range="bytes=10-5")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    got = c.get_object(Bucket="ranges", Key="k", Range="bytes=990-5000")
    assert got["Body"].read() == data[990:] and got["ContentRange"] == "bytes 990-999/1000"
    assert c.get_object(Bucket="ranges", Key="k", Range="bytes=-10")["Body"].read() == data[-10:]
    assert c.get_object(Bucket="ranges", Key="k")["Body"].read() == data


def test_signed_requests_are_accepted_within_15_minutes_only():
    from datetime import datetime, timedelta, timezone
    from unittest import mock
    d = Daemon(env={"FERRY_OBJECTS_ACCESS_KEY": "ferrykey", "FERRY_OBJECTS_SECRET_KEY": "s3cr3t-value"})
    try:
        good = s3(d.url, "ferrykey", "s3cr3t-value")
        good.create_bucket(Bucket="timed")
        good.put_object(Bucket="timed", Key="k", Body=b"kept")
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        for skew in (timedelta(minutes=-20), timedelta(minutes=20), timedelta(days=-400)):
            with mock.patch("botocore.auth.get_current_datetime", return_value=now + skew):
                for call in (lambda: good.get_object(Bucket="timed", Key="k"),
                             lambda: good.put_object(Bucket="timed", Key="k", Body=b"replayed")):
                    with pytest.raises(ClientError) as e:
                        call()
                    assert e.value.response["Error"]["Code"] == "RequestTimeTooSkewed", skew
                    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with mock.patch("botocore.auth.get_current_datetime", return_value=now - timedelta(minutes=10)):
            assert good.get_object(Bucket="timed", Key="k")["Body"].read() == b"kept"
        assert good.get_object(Bucket="timed", Key="k")["Body"].read() == b"kept"
    finally:
        d.stop()


def _netns(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_namespaces():
    """Namespaces ferry_s3p_a (10.231.7.1) and ferry_s3p_b (10.231.7.2) joined by a veth pair, as
    tests/netns/netns_lib.sh makes them: the store in a, a client of another host in b."""
    import shutil
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    a, b = "ferry_s3p_a", "ferry_s3p_b"
    for ns in (a, b):
        _netns("netns", "del", ns)
        if _netns("netns", "add", ns).returncode != 0:
            pytest.skip("cannot create network namespaces here")
    try:
        assert _netns("link", "add", "s3pa", "netns", a, "type", "veth", "peer", "name", "s3pb",
                      "netns", b).returncode == 0
        for ns, dev, addr in ((a, "s3pa", "10.231.7.1/30"), (b, "s3pb", "10.231.7.2/30")):
            _netns("-n", ns, "addr", "add", addr, "dev", dev)
            _netns("-n", ns, "link", "set", "lo", "up")
            _netns("-n", ns, "link", "set", dev, "up")
        yield a, b
    finally:
        _netns("netns", "del", a)
        _netns("netns", "del", b)


CLIENT = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(sys.argv[3].encode().decode("unicode_escape").encode("latin-1"))
out = b""
while True:
    c = s.recv(65536)
    if not c:
        break
    out += c
sys.stdout.write(out.decode("latin-1"))
"""


def test_protected_mode_refuses_other_hosts_without_credentials(two_namespaces):
    a, b = two_namespaces

    def serve(*extra, env=None):
        proc = subprocess.Popen(["ip", "netns", "exec", a, FERRY, "objects", "serve", "--host", "0.0.0.0",
                                 "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
        line = proc.stdout.readline()
        assert "serving http://" in line, line + proc.stderr.read()
        return proc, int(line.split()[3].rsplit(":", 1)[1])

    def request(ns, host, port, text):
        out = subprocess.run(["ip", "netns", "exec", ns, sys_python(), "-c", CLIENT, host, str(port), text],
                             capture_output=True, text=True, timeout=30)
        return out.stdout

    proc, port = serve()
    try:
        put = "PUT /pmode HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n"
        assert request(a, "127.0.0.1", port, put).startswith("HTTP/1.1 200")  # this host: served
        refused = request(b, "10.231.7.1", port, put.replace("/pmode", "/other-host"))
        assert refused.startswith("HTTP/1.1 403"), refused
        assert "<Code>AccessDenied</Code>" in refused and "FERRY_OBJECTS_ACCESS_KEY" in refused
        assert "--insecure-allow-remote" in refused
        listing = request(a, "10.231.7.1", port, "GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        assert "<Name>pmode</Name>" in listing and "<Name>other-host</Name>" not in listing  # its own address: served
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "refused PUT /other-host from 10.231.7.2: 403 AccessDenied" in proc.stderr.read()
    proc, port = serve("--insecure-allow-remote")
    try:
        opened = request(b, "10.231.7.1", port, "PUT /other-host HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 0\\r\\n"
                         "Connection: close\\r\\n\\r\\n")
        assert opened.startswith("HTTP/1.1 200"), opened
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc, port = serve(env={"FERRY_OBJECTS_ACCESS_KEY": "k", "FERRY_OBJECTS_SECRET_KEY": "s"})
    try:  # with credentials other hosts are served, and must sign
        unsigned = request(b, "10.231.7.1", port, "GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        assert unsigned.startswith("HTTP/1.1 403") and "not signed" in unsigned, unsigned
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sys_python():
    import sys
    return sys.executable
