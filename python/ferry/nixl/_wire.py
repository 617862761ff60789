"""ferry.nixl's two wire formats: the agent metadata and the side channel's frames.

**Metadata** (``get_agent_metadata`` / ``add_remote_agent``) is one UTF-8 JSON object, decoded
strictly (no pickle, every field typed, unknown fields ignored so that fields can be appended)::

    {"ferry_nixl": 1, "name": "decode-0",
     "conn": {"address": "<hex of the ferry worker address>", "notify": [["127.0.0.1", 40123]]},
     "regions": [["nixl.3", 140245, 4096, 0], ...]}

``ferry_nixl`` is the format's major version (a newer one is refused, naming both). ``conn`` is
absent in partial metadata sent without connection info. Each region is ``[key, addr, len, devId]``:
``key`` is the name the owner's ferry agent registered that range under; the transfer names it and
the owner's agent resolves it (docs/agent.md, ``mr_query``). The metadata grants nothing by itself:
a peer reaches those regions only through a connection the owner's agent accepted (its secret, or
protected mode: docs/security.md).

**Frames** on the side channel (notifications and the metadata listener): a 4-byte big-endian
length, then, when the agents share a secret (``FERRY_AGENT_SECRET``), the 32-byte HMAC-SHA256 of
what follows, then a JSON header line ``{"ferry_nixl": 1, "type": ..., "from": ..., "time": ...}\\n``,
then the raw body (a notification's bytes or a metadata blob). With a secret a frame without the
right MAC, or stamped more than 120 s away from this host's clock, is refused. Types: ``notif`` (body: the message), ``md`` (body:
metadata to load), ``fetch`` (header ``name``: answered with an ``md`` frame of our metadata, or an
empty one), ``invalidate`` (forget the sender). A malformed frame closes that connection only.
"""

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import struct
import threading
import time

from ._errors import nixlInvalidParamError, nixlMismatchError

VERSION = 1
MAX_FRAME = 64 << 20
MAC_BYTES = 32
MAX_SKEW_SECONDS = 120
# The side channel's bounds (docs/security.md): connections held at once, and how long a new one
# may take to send its first whole frame.
MAX_CONNECTIONS = 256
FIRST_FRAME_SECONDS = 10.0


def _secret():
    """The agents' shared secret (FERRY_AGENT_SECRET, read by ferry's config), as bytes; b"" for none."""
    from .. import _core
    return _core.agent_secret()
_log = logging.getLogger("ferry.nixl")


# ---- metadata ----

def encode_metadata(name, address, notify, regions, partial=False):
    """``regions``: iterable of (key, addr, len, devId); ``address`` None leaves out the connection."""
    md = {"ferry_nixl": VERSION, "name": name, "regions": [list(r) for r in regions]}
    if partial:
        md["partial"] = True
    if address is not None:
        md["conn"] = {"address": address.hex(), "notify": [list(n) for n in notify]}
    return json.dumps(md, separators=(",", ":")).encode()


def _field(obj, key, types, what):
    if key not in obj:
        raise nixlInvalidParamError("malformed metadata: %s has no %r" % (what, key))
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise nixlInvalidParamError("malformed metadata: %s field %r has the wrong type" % (what, key))
    return v


def decode_metadata(blob):
    """{"name", "address" (bytes or None), "notify" [(host, port)], "regions" [(key, addr, len, devId)],
    "partial"}; raises nixlInvalidParamError (malformed) or nixlMismatchError (newer version)."""
    if isinstance(blob, str):
        blob = blob.encode()
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise nixlInvalidParamError("metadata must be bytes, not %s" % type(blob).__name__)
    try:
        md = json.loads(bytes(blob).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise nixlInvalidParamError("malformed metadata: not ferry.nixl metadata (%d bytes)" % len(blob)) from None
    if not isinstance(md, dict) or "ferry_nixl" not in md:
        raise nixlInvalidParamError("malformed metadata: not ferry.nixl metadata")
    version = _field(md, "ferry_nixl", int, "metadata")
    if version > VERSION:
        raise nixlMismatchError("metadata of format version %d; this ferry.nixl reads version %d" % (version, VERSION))
    if version < 1:
        raise nixlInvalidParamError("malformed metadata: version %d" % version)
    name = _field(md, "name", str, "metadata")
    if not name:
        raise nixlInvalidParamError("malformed metadata: empty agent name")
    out = {"name": name, "address": None, "notify": [], "regions": [], "partial": md.get("partial") is True}
    if "conn" in md:
        conn = md["conn"]
        if not isinstance(conn, dict):
            raise nixlInvalidParamError("malformed metadata: conn is not an object")
        try:
            out["address"] = bytes.fromhex(_field(conn, "address", str, "conn"))
        except ValueError:
            raise nixlInvalidParamError("malformed metadata: conn.address is not hex") from None
        for n in _field(conn, "notify", list, "conn"):
            if (not isinstance(n, list) or len(n) != 2 or not isinstance(n[0], str) or not isinstance(n[1], int)
                    or not 0 < n[1] < 65536):
                raise nixlInvalidParamError("malformed metadata: conn.notify entry %r" % (n,))
            out["notify"].append((n[0], n[1]))
    for r in _field(md, "regions", list, "metadata"):
        if (not isinstance(r, list) or len(r) != 4 or not isinstance(r[0], str)
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64 for x in r[1:])):
            raise nixlInvalidParamError("malformed metadata: region entry %r" % (r,))
        out["regions"].append(tuple(r))
    return out


# ---- frames ----

def pack_frame(kind, sender, body=b"", **fields):
    header = dict(fields, ferry_nixl=VERSION, type=kind)
    header["from"] = sender
    header["time"] = int(time.time())
    head = json.dumps(header, separators=(",", ":")).encode() + b"\n"
    payload = head + bytes(body)
    if len(payload) > MAX_FRAME:
        raise nixlInvalidParamError("message of %d bytes: at most %d" % (len(body), MAX_FRAME - len(head)))
    secret = _secret()
    if secret:
        payload = hmac.new(secret, payload, hashlib.sha256).digest() + payload
    return struct.pack(">I", len(payload)) + payload


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock):
    """(header dict, body bytes), or None at the end of the stream; ValueError on a malformed frame."""
    raw = _recv_exact(sock, 4)
    if raw is None:
        return None
    (size,) = struct.unpack(">I", raw)
    secret = _secret()
    if size > MAX_FRAME + (MAC_BYTES if secret else 0):
        raise ValueError("frame of %d bytes" % size)
    payload = _recv_exact(sock, size)
    if payload is None:
        return None
    if secret:
        mac, payload = payload[:MAC_BYTES], payload[MAC_BYTES:]
        if not hmac.compare_digest(mac, hmac.new(secret, payload, hashlib.sha256).digest()):
            raise ValueError("a frame without the shared secret's MAC")
    head, sep, body = payload.partition(b"\n")
    if not sep:
        raise ValueError("frame without a header line")
    header = json.loads(head.decode("utf-8"))
    if (not isinstance(header, dict) or header.get("ferry_nixl") != VERSION or not isinstance(header.get("type"), str)
            or not isinstance(header.get("from"), str)):
        raise ValueError("malformed frame header")
    if secret and (not isinstance(header.get("time"), int) or abs(header["time"] - time.time()) > MAX_SKEW_SECONDS):
        raise ValueError("a frame stamped more than %d s away from this host's clock" % MAX_SKEW_SECONDS)
    return header, body


def _from_this_host(conn):
    """Whether the peer of an accepted connection is this host: loopback, or the address it dialed
    (a process of this host that dials one of its addresses comes from that address)."""
    try:
        peer = ipaddress.ip_address(conn.getpeername()[0])
        mine = ipaddress.ip_address(conn.getsockname()[0])
    except (OSError, ValueError):
        return False
    mapped = getattr(peer, "ipv4_mapped", None)
    return peer.is_loopback or (mapped is not None and mapped.is_loopback) or peer == mine


class FrameServer:
    """A TCP listener whose connections each get a thread reading frames into ``handler(header, body,
    sock)``. Threads are daemons: a process exits with the server open."""

    def __init__(self, host, port, handler, this_host_only=True):
        self._handler = handler
        self._this_host_only = this_host_only
        self.refused = 0
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=64)
        self.port = self._sock.getsockname()[1]
        self.host = host
        self._closed = False
        self._conns = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="ferry.nixl listener %d" % self.port, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            # Protected mode (no secret and no FERRY_AGENT_ALLOW_REMOTE): peers of this host only;
            # and at most MAX_CONNECTIONS at once.
            refuse = None
            if self._this_host_only and not _from_this_host(conn):
                refuse = "it serves peers of this host only (no FERRY_AGENT_SECRET; docs/security.md)"
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                if refuse is None and len(self._conns) >= MAX_CONNECTIONS:
                    refuse = "it holds %d connections, its cap" % MAX_CONNECTIONS
                if refuse is None:
                    self._conns.add(conn)
            if refuse is not None:
                self.refused += 1
                _log.warning("ferry.nixl: the side channel refused a connection: %s", refuse)
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(FIRST_FRAME_SECONDS)  # until its first whole frame
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                frame = read_frame(conn)
                if frame is None:
                    return
                conn.settimeout(None)  # a peer's ordered connection stays open while idle
                self._handler(frame[0], frame[1], conn)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            if not self._closed:
                _log.warning("ferry.nixl: dropped a side-channel connection: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FrameSender:
    """One ordered connection to a peer's side channel: frames sent through it arrive in order.
    Reconnects once when the connection was lost; raises OSError when the peer cannot be reached."""

    def __init__(self, addresses, timeout=5.0):
        self._addresses = list(addresses)
        self._timeout = timeout
        self._sock = None
        self._lock = threading.Lock()

    def _connect(self):
        last = None
        for host, port in self._addresses:
            try:
                s = socket.create_connection((host, port), timeout=self._timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError as e:
                last = e
        raise last or OSError("no address to reach")

    def send(self, frame):
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._sock = self._connect()
                try:
                    self._sock.sendall(frame)
                    return
                except OSError:
                    self._sock.close()
                    self._sock = None
                    if attempt:
                        raise

    def close(self):
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def request(host, port, frame, want_reply, timeout=5.0):
    """Sends one frame on a new connection; returns the reply frame when ``want_reply``."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(frame)
        if want_reply:
            return read_frame(s)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the peer closes after reading: the frame was taken
    return None
