"""`ferry objects serve` as a stock S3 client sees it: boto3 (path-style, plain HTTP) creates a
bucket, puts, gets, heads, lists and deletes objects, uploads in parts, deletes many objects and
copies them, with and without SigV4 credentials, and the aws CLI copies and syncs; ETags are S3's
MD5s; the daemon refuses wrong credentials, a wrong Content-MD5, a PUT past its memory bound, and
survives malformed HTTP (garbage, truncated requests, huge headers, a body shorter than its
Content-Length, bad descriptors) while it goes on serving."""

import base64
import hashlib
import io
import os
import shutil
import sys
import socket
import subprocess
import time

import pytest

from netns_hosts import two_hosts

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
        lambda: c.upload_part_copy(Bucket="keep", Key="k", PartNumber=1, UploadId="x",
                                   CopySource={"Bucket": "keep", "Key": "k"}),
        lambda: c.copy_object(Bucket="keep", Key="k2", CopySource={"Bucket": "keep", "Key": "k", "VersionId": "v1"}),
        lambda: c.get_object_tagging(Bucket="keep", Key="k"),
        lambda: c.get_object_acl(Bucket="keep", Key="k"),
        lambda: c.delete_objects(Bucket="keep", Delete={"Objects": [{"Key": "k", "VersionId": "v1"}]}),
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
    for method, target in ((b"PUT", b"/keep/k?tagging"), (b"PUT", b"/keep/k?acl"), (b"PUT", b"/keep/k?uploads"),
                           (b"PUT", b"/keep?lifecycle"), (b"PUT", b"/keep/k?anything-else=1"),
                           (b"PUT", b"/keep/k?x-id=CopyObject"), (b"POST", b"/keep/k"), (b"POST", b"/keep"),
                           (b"POST", b"/keep?lifecycle"), (b"POST", b"/keep/k?uploads&tagging"),
                           (b"POST", b"/keep/k?select&select-type=2")):
        status, reply = raw(daemon.port, method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                            b"Connection: close\r\n\r\nhello")
        assert status == 501 and b"<Code>NotImplemented</Code>" in reply, (target, reply[:300])
        unchanged()
    # A part for an upload that does not exist: refused before its body is kept.
    status, reply = raw(daemon.port, b"PUT /keep/k?uploadId=1&partNumber=1 HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 5\r\nConnection: close\r\n\r\nhello")
    assert status == 404 and b"<Code>NoSuchUpload</Code>" in reply, reply[:300]
    unchanged()
    assert c.list_buckets()["Buckets"][0]["Name"] == "keep" and len(c.list_buckets()["Buckets"]) == 1


def md5_etag(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'


def multipart_etag(data, part_bytes):
    parts = [data[i:i + part_bytes] for i in range(0, len(data), part_bytes)]
    return '"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest(), len(parts))


def error_code(call):
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_boto3_uploads_in_parts_with_and_without_credentials(daemon, tmp_path):
    # upload_file above boto3's 8 MiB threshold: create, three parts in parallel, complete.
    c = s3(daemon.url)
    c.create_bucket(Bucket="parts")
    data = os.urandom(20 << 20)
    (tmp_path / "up.bin").write_bytes(data)
    c.upload_file(str(tmp_path / "up.bin"), "parts", "big.bin")
    head = c.head_object(Bucket="parts", Key="big.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == multipart_etag(data, 8 << 20) and head["ETag"].endswith('-3"')
    c.download_file("parts", "big.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == data
    assert c.list_multipart_uploads(Bucket="parts").get("Uploads", []) == []
    # upload_fileobj, signed: SigV4 over ?uploads, ?partNumber&uploadId and the Complete document.
    d = Daemon(env={"FERRY_OBJECTS_ACCESS_KEY": "ferrykey", "FERRY_OBJECTS_SECRET_KEY": "s3cr3t-value"})
    try:
        signed = s3(d.url, "ferrykey", "s3cr3t-value")
        signed.create_bucket(Bucket="parts")
        blob = os.urandom(9 << 20)
        signed.upload_fileobj(io.BytesIO(blob), "parts", "obj.bin")
        got = signed.get_object(Bucket="parts", Key="obj.bin")
        assert got["Body"].read() == blob and got["ETag"] == multipart_etag(blob, 8 << 20)
        assert error_code(lambda: s3(d.url, "ferrykey", "wrong").create_multipart_upload(
            Bucket="parts", Key="x"))[0] == "SignatureDoesNotMatch"
    finally:
        d.stop()


def test_multipart_uploads_are_listed_validated_and_aborted(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="parts")
    up = c.create_multipart_upload(Bucket="parts", Key="obj")["UploadId"]
    first, second = os.urandom(5 << 20), os.urandom(1000)
    e1 = c.upload_part(Bucket="parts", Key="obj", UploadId=up, PartNumber=1, Body=first)["ETag"]
    e2 = c.upload_part(Bucket="parts", Key="obj", UploadId=up, PartNumber=2, Body=second)["ETag"]
    assert (e1, e2) == (md5_etag(first), md5_etag(second))
    assert [(u["Key"], u["UploadId"]) for u in c.list_multipart_uploads(Bucket="parts")["Uploads"]] == [("obj", up)]
    parts = c.list_parts(Bucket="parts", Key="obj", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [(1, e1, 5 << 20), (2, e2, 1000)]
    # S3's refusals of a completion; the upload stays and nothing is stored.
    wrong = [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": md5_etag(b"other")}]
    reversed_ = [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]
    missing = [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 3, "ETag": e2}]
    for listed, code in ((wrong, "InvalidPart"), (reversed_, "InvalidPartOrder"), (missing, "InvalidPart")):
        assert error_code(lambda: c.complete_multipart_upload(
            Bucket="parts", Key="obj", UploadId=up, MultipartUpload={"Parts": listed})) == (code, 400)
        assert error_code(lambda: c.head_object(Bucket="parts", Key="obj"))[1] == 404
    small = c.create_multipart_upload(Bucket="parts", Key="small")["UploadId"]
    s1 = c.upload_part(Bucket="parts", Key="small", UploadId=small, PartNumber=1, Body=b"a" * 100)["ETag"]
    s2 = c.upload_part(Bucket="parts", Key="small", UploadId=small, PartNumber=2, Body=b"b" * 100)["ETag"]
    assert error_code(lambda: c.complete_multipart_upload(
        Bucket="parts", Key="small", UploadId=small,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": s1}, {"PartNumber": 2, "ETag": s2}]})) == (
        "EntityTooSmall", 400)
    # Abort frees the upload: it is no longer listed and takes no more parts.
    c.abort_multipart_upload(Bucket="parts", Key="obj", UploadId=up)
    assert [u["Key"] for u in c.list_multipart_uploads(Bucket="parts")["Uploads"]] == ["small"]
    assert error_code(lambda: c.list_parts(Bucket="parts", Key="obj", UploadId=up)) == ("NoSuchUpload", 404)
    assert error_code(lambda: c.upload_part(Bucket="parts", Key="obj", UploadId=up, PartNumber=3,
                                            Body=b"x")) == ("NoSuchUpload", 404)
    assert error_code(lambda: c.abort_multipart_upload(Bucket="parts", Key="obj", UploadId=up))[0] == "NoSuchUpload"
    # The last part alone may be small: a one-part upload of 100 bytes completes.
    done = c.complete_multipart_upload(Bucket="parts", Key="small", UploadId=small,
                                       MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": s1}]})
    assert done["ETag"] == '"%s-1"' % hashlib.md5(hashlib.md5(b"a" * 100).digest()).hexdigest()
    assert c.get_object(Bucket="parts", Key="small")["Body"].read() == b"a" * 100
    assert c.list_multipart_uploads(Bucket="parts").get("Uploads", []) == []
    assert [o["Key"] for o in c.list_objects_v2(Bucket="parts")["Contents"]] == ["small"]


def test_delete_objects_quiet_and_verbose(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="many")
    for quiet in (False, True):
        for key in ("a", "b/c"):
            c.put_object(Bucket="many", Key=key, Body=key.encode())
        c.put_object(Bucket="many", Key="kept", Body=b"kept")
        out = c.delete_objects(Bucket="many", Delete={"Objects": [{"Key": "a"}, {"Key": "b/c"}, {"Key": "missing"}],
                                                      "Quiet": quiet})
        assert sorted(d["Key"] for d in out.get("Deleted", [])) == ([] if quiet else ["a", "b/c", "missing"])
        assert out.get("Errors", []) == []
        assert [o["Key"] for o in c.list_objects_v2(Bucket="many")["Contents"]] == ["kept"]
    # A malformed document is refused and deletes nothing.
    body = b"<Delete><Object><Key>kept</Key></Delete>"
    status, reply = raw(daemon.port, b"POST /many?delete HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                        b"Connection: close\r\n\r\n%s" % (len(body), body))
    assert status == 400 and b"<Code>MalformedXML</Code>" in reply, reply[:300]
    assert [o["Key"] for o in c.list_objects_v2(Bucket="many")["Contents"]] == ["kept"]


def test_copy_object_to_a_new_key_and_onto_itself(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="copies")
    data = os.urandom(300000)
    c.put_object(Bucket="copies", Key="dir/src bin", Body=data, ContentType="application/x-one")
    out = c.copy_object(Bucket="copies", Key="dst", CopySource={"Bucket": "copies", "Key": "dir/src bin"})
    assert out["CopyObjectResult"]["ETag"] == md5_etag(data)
    got = c.get_object(Bucket="copies", Key="dst")
    assert got["Body"].read() == data and got["ContentType"] == "application/x-one"
    assert error_code(lambda: c.copy_object(Bucket="copies", Key="dst", CopySource="copies/dst")) == (
        "InvalidRequest", 400)
    c.copy_object(Bucket="copies", Key="dst", CopySource="/copies/dst", MetadataDirective="REPLACE",
                  ContentType="text/plain")
    got = c.get_object(Bucket="copies", Key="dst")
    assert got["Body"].read() == data and got["ContentType"] == "text/plain" and got["ETag"] == md5_etag(data)
    assert error_code(lambda: c.copy_object(Bucket="copies", Key="x", CopySource="copies/none"))[0] == "NoSuchKey"
    assert error_code(lambda: c.head_object(Bucket="copies", Key="x"))[1] == 404


def test_etags_are_md5s_and_content_md5_is_checked(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="sums")
    data = os.urandom(100000)
    assert c.put_object(Bucket="sums", Key="k", Body=data)["ETag"] == md5_etag(data)
    assert c.head_object(Bucket="sums", Key="k")["ETag"] == md5_etag(data)
    assert c.list_objects_v2(Bucket="sums")["Contents"][0]["ETag"] == md5_etag(data)
    good = base64.b64encode(hashlib.md5(b"new").digest()).decode()
    c.put_object(Bucket="sums", Key="k2", Body=b"new", ContentMD5=good)
    assert c.get_object(Bucket="sums", Key="k2")["Body"].read() == b"new"
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    assert error_code(lambda: c.put_object(Bucket="sums", Key="k", Body=b"changed", ContentMD5=bad)) == (
        "BadDigest", 400)
    assert error_code(lambda: c.put_object(Bucket="sums", Key="k", Body=b"changed", ContentMD5="nope")) == (
        "InvalidDigest", 400)
    assert c.get_object(Bucket="sums", Key="k")["Body"].read() == data


def test_a_put_past_max_memory_is_507_and_changes_nothing():
    d = Daemon(args=("--max-memory", "4M", "--upload-expiry", "1"))
    try:
        c = s3(d.url)
        c.create_bucket(Bucket="full")
        c.put_object(Bucket="full", Key="a", Body=b"a" * (3 << 20))
        assert error_code(lambda: c.put_object(Bucket="full", Key="b", Body=b"b" * (2 << 20))) == (
            "InsufficientStorage", 507)
        assert error_code(lambda: c.head_object(Bucket="full", Key="b"))[1] == 404
        up = c.create_multipart_upload(Bucket="full", Key="c")["UploadId"]
        assert error_code(lambda: c.upload_part(Bucket="full", Key="c", UploadId=up, PartNumber=1,
                                                Body=b"c" * (2 << 20))) == ("InsufficientStorage", 507)
        assert error_code(lambda: c.copy_object(Bucket="full", Key="d", CopySource="full/a")) == (
            "InsufficientStorage", 507)
        assert [o["Key"] for o in c.list_objects_v2(Bucket="full")["Contents"]] == ["a"]
        c.delete_object(Bucket="full", Key="a")  # frees its bytes
        c.put_object(Bucket="full", Key="b", Body=b"b" * (2 << 20))
        assert c.get_object(Bucket="full", Key="b")["Body"].read() == b"b" * (2 << 20)
        # Parts of an upload in progress count; an abandoned upload is dropped and frees them.
        up = c.create_multipart_upload(Bucket="full", Key="e")["UploadId"]
        c.upload_part(Bucket="full", Key="e", UploadId=up, PartNumber=1, Body=b"e" * (1 << 20))
        assert error_code(lambda: c.put_object(Bucket="full", Key="f", Body=b"f" * (3 << 19)))[1] == 507
        time.sleep(2.2)  # past --upload-expiry 1
        assert c.list_multipart_uploads(Bucket="full").get("Uploads", []) == []
        c.put_object(Bucket="full", Key="f", Body=b"f" * (3 << 19))
        assert d.alive()
    finally:
        d.stop()


def test_a_store_on_disk_keeps_objects_past_its_memory_and_their_metadata_across_a_restart(tmp_path):
    # --data-dir with 8 MiB of memory: 20 MiB of single PUTs, a 23 MiB upload in parts (each part
    # waits on disk) and copies are stored; a restart serves them with their ETags, times,
    # Content-Types and x-amz-meta-*.
    data = tmp_path / "store"
    args = ("--data-dir", str(data), "--max-memory", "8M")
    blobs = {"k%d" % i: os.urandom((4 << 20) + i) for i in range(5)}
    big = os.urandom((23 << 20) + 5)
    (tmp_path / "big.bin").write_bytes(big)
    d = Daemon(args=args)
    try:
        c = s3(d.url)
        c.create_bucket(Bucket="disk")
        for key, blob in blobs.items():
            c.put_object(Bucket="disk", Key=key, Body=blob, ContentType="text/x-" + key, Metadata={"n": key})
        c.upload_file(str(tmp_path / "big.bin"), "disk", "big", ExtraArgs={"Metadata": {"kind": "parts"}})
        assert not list((data / ".ferry" / "uploads").iterdir())  # the parts were removed
        c.copy_object(Bucket="disk", Key="copy", CopySource="disk/big")
        c.copy_object(Bucket="disk", Key="k0", CopySource="disk/k0", MetadataDirective="REPLACE",
                      ContentType="application/x-replaced", Metadata={"n": "replaced"})
        before = {o["Key"]: (o["Size"], o["ETag"], o["LastModified"])
                  for o in c.list_objects_v2(Bucket="disk")["Contents"]}
        assert before["k1"][1] == '"%s"' % hashlib.md5(blobs["k1"]).hexdigest()
        assert before["big"][1].endswith('-3"') and before["copy"][1] == '"%s"' % hashlib.md5(big).hexdigest()
    finally:
        d.stop()
    assert (data / "disk" / "big").read_bytes() == big
    d = Daemon(args=args)
    try:
        c = s3(d.url)
        after = {o["Key"]: (o["Size"], o["ETag"], o["LastModified"])
                 for o in c.list_objects_v2(Bucket="disk")["Contents"]}
        assert after == before
        for key, blob in blobs.items():
            got = c.get_object(Bucket="disk", Key=key)
            assert got["Body"].read() == blob
            if key == "k0":
                assert (got["ContentType"], got["Metadata"]) == ("application/x-replaced", {"n": "replaced"})
            else:
                assert (got["ContentType"], got["Metadata"]) == ("text/x-" + key, {"n": key})
        head = c.head_object(Bucket="disk", Key="big")
        assert (head["Metadata"], head["ETag"]) == ({"kind": "parts"}, before["big"][1])
        assert c.get_object(Bucket="disk", Key="big", Range="bytes=9000000-9000099")["Body"].read() == \
            big[9000000:9000100]
        assert c.get_object(Bucket="disk", Key="copy")["Body"].read() == big
    finally:
        d.stop()


def test_a_full_disk_is_507_and_changes_nothing(tmp_path):
    data = tmp_path / "small"
    data.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(data)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        d = Daemon(args=("--data-dir", str(data)))
        try:
            c = s3(d.url)
            c.create_bucket(Bucket="full")
            c.put_object(Bucket="full", Key="a", Body=b"a" * (3 << 20))
            c.put_object(Bucket="full", Key="b", Body=b"b" * (3 << 20))
            code = error_code(lambda: c.put_object(Bucket="full", Key="c", Body=b"c" * (3 << 20)))
            assert code == ("InsufficientStorage", 507)
            assert error_code(lambda: c.put_object(Bucket="full", Key="a", Body=b"x" * (3 << 20))) == code
            assert error_code(lambda: c.copy_object(Bucket="full", Key="d", CopySource="full/a")) == code
            assert sorted(o["Key"] for o in c.list_objects_v2(Bucket="full")["Contents"]) == ["a", "b"]
            assert c.get_object(Bucket="full", Key="a")["Body"].read() == b"a" * (3 << 20)
            assert not list((data / ".ferry" / "tmp").iterdir())  # nothing half-written is left
            c.delete_object(Bucket="full", Key="b")
            c.put_object(Bucket="full", Key="c", Body=b"c" * (3 << 20))
            assert c.get_object(Bucket="full", Key="c")["Body"].read() == b"c" * (3 << 20)
        finally:
            d.stop()
    finally:
        subprocess.run(["umount", str(data)], check=True)


def test_the_aws_cli_copies_and_syncs(daemon, tmp_path):
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    if not os.path.exists(aws):
        aws = shutil.which("aws")
    if aws is None:
        pytest.skip("the aws CLI is not installed (pip install awscli)")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="anonymous", AWS_SECRET_ACCESS_KEY="anonymous",
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_REQUEST_CHECKSUM_CALCULATION="when_required", AWS_RESPONSE_CHECKSUM_VALIDATION="when_required")

    def run(*args):
        out = subprocess.run([aws, "--endpoint-url", daemon.url, "s3", *args], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    run("mb", "s3://cli")
    data = os.urandom(20 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    run("cp", str(tmp_path / "big.bin"), "s3://cli/big.bin")
    run("cp", "s3://cli/big.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data
    src = tmp_path / "tree"
    files = {"a.txt": b"alpha", "sub/b.bin": os.urandom(70000), "sub/deeper/c": b""}
    for name, content in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(content)
    run("sync", str(src), "s3://cli/tree")
    assert run("sync", str(src), "s3://cli/tree").strip() == ""  # nothing changed: nothing sent
    run("sync", "s3://cli/tree", str(tmp_path / "copy"))
    for name, content in files.items():
        assert (tmp_path / "copy" / name).read_bytes() == content, name


def test_user_metadata_is_kept_copied_and_bounded(daemon):
    c = s3(daemon.url)
    c.create_bucket(Bucket="meta")
    c.put_object(Bucket="meta", Key="a", Body=b"x", Metadata={"mtime": "1700000000.5", "Owner": "team-a"})
    assert c.head_object(Bucket="meta", Key="a")["Metadata"] == {"mtime": "1700000000.5", "owner": "team-a"}
    assert c.get_object(Bucket="meta", Key="a")["Metadata"] == {"mtime": "1700000000.5", "owner": "team-a"}
    # A copy keeps the source's metadata (COPY) or takes the request's (REPLACE).
    c.copy_object(Bucket="meta", Key="b", CopySource="meta/a")
    assert c.head_object(Bucket="meta", Key="b")["Metadata"] == {"mtime": "1700000000.5", "owner": "team-a"}
    c.copy_object(Bucket="meta", Key="b", CopySource="meta/a", MetadataDirective="REPLACE", Metadata={"k": "v"})
    assert c.head_object(Bucket="meta", Key="b")["Metadata"] == {"k": "v"}
    # A multipart upload's metadata is the object's once completed.
    up = c.create_multipart_upload(Bucket="meta", Key="m", Metadata={"md5chksum": "abc"})
    part = c.upload_part(Bucket="meta", Key="m", UploadId=up["UploadId"], PartNumber=1, Body=b"y" * 100)
    c.complete_multipart_upload(Bucket="meta", Key="m", UploadId=up["UploadId"],
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert c.head_object(Bucket="meta", Key="m")["Metadata"] == {"md5chksum": "abc"}
    # Above 2 KB of names and values: MetadataTooLarge, and nothing stored.
    assert error_code(lambda: c.put_object(Bucket="meta", Key="big", Body=b"z", Metadata={"v": "q" * 2048})) \
        == ("MetadataTooLarge", 400)
    assert error_code(lambda: c.head_object(Bucket="meta", Key="big"))[1] == 404
    assert error_code(lambda: c.create_multipart_upload(Bucket="meta", Key="big2", Metadata={"v": "q" * 2048})) \
        == ("MetadataTooLarge", 400)
    assert c.list_multipart_uploads(Bucket="meta").get("Uploads", []) == []


def test_rclone_copies_checks_and_syncs(daemon, tmp_path):
    """rclone (Debian's) against the store as an S3 remote, configured from its environment: a tree
    with an empty file and one uploaded in parts goes up, `rclone check` compares sizes and MD5s,
    it comes back byte for byte, and a file deleted at the source is deleted by the next sync."""
    rclone = shutil.which("rclone")
    if rclone is None:
        pytest.skip("rclone is not installed (apt-get install rclone)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # AWS_CA_BUNDLE breaks plain HTTP
    (tmp_path / "rclone.conf").write_text("")  # the remote comes from the environment
    env.update(RCLONE_CONFIG=str(tmp_path / "rclone.conf"), RCLONE_CONFIG_F_TYPE="s3", RCLONE_CONFIG_F_PROVIDER="Other",
               RCLONE_CONFIG_F_ENDPOINT=daemon.url, RCLONE_CONFIG_F_ACCESS_KEY_ID="anonymous",
               RCLONE_CONFIG_F_SECRET_ACCESS_KEY="anonymous", RCLONE_CONFIG_F_REGION="us-east-1",
               RCLONE_CONFIG_F_FORCE_PATH_STYLE="true")

    def run(*args):
        out = subprocess.run([rclone, *args, "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", "--retries", "1",
                              "--low-level-retries", "1"], capture_output=True, text=True, env=env, timeout=180)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout + out.stderr

    run("mkdir", "f:rcl")
    src = tmp_path / "tree"
    files = {"a.txt": b"alpha", "sub/b.bin": os.urandom(70000), "sub/deeper/c": b"", "big.bin": os.urandom(12 << 20)}
    for name, content in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(content)
    run("copy", str(src), "f:rcl/tree")
    run("check", str(src), "f:rcl/tree")
    assert sorted(run("lsf", "-R", "--files-only", "f:rcl/tree").split()) == sorted(files)
    back = tmp_path / "back"
    run("sync", "f:rcl/tree", str(back))
    for name, content in files.items():
        assert (back / name).read_bytes() == content, name
    # Its modification times and the part-uploaded file's MD5 are kept as user metadata: a sync of
    # an unchanged tree sends nothing.
    would = run("sync", str(src), "f:rcl/tree", "--dry-run", "-v")
    assert "Skipped" not in would, would
    (src / "a.txt").unlink()
    run("sync", str(src), "f:rcl/tree")
    assert sorted(run("lsf", "-R", "--files-only", "f:rcl/tree").split()) == sorted(set(files) - {"a.txt"})


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


@pytest.fixture
def two_namespaces():
    """The store in ferry_s3p_a (10.231.7.1), a client of another host in ferry_s3p_b."""
    with two_hosts("s3p", "10.231.7") as hosts:
        yield hosts


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
