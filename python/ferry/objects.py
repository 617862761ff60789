"""ferry.objects: the object store and its client, in an application.

A store keeps objects in registered memory (optionally also as files under a directory) and serves
them over HTTP in the S3 style; ferry's client moves the payloads by RDMA, the store reading or
writing the client's own memory, or in the HTTP body as any S3 client does (``rdma=False``)::

    from ferry.objects import ObjectClient, ObjectStore

    with ObjectStore.start(port=9000, data_dir="/var/lib/objects") as store:    # `ferry objects serve`
        ...
    # another process:
    with ObjectClient.connect("http://127.0.0.1:9000") as client:
        client.create_bucket("models")
        client.put("models", "w.bin", array)            # any buffer: bytes, NumPy, a CPU tensor
        n = client.get_into("models", "w.bin", out)     # into writable memory, no copy
        data = client.get("models", "w.bin")            # a new bytes object

Payloads are not copied on the client's side: ``put`` hands over the memory of the object given
(``bytes``, ``bytearray``, ``memoryview``, ``mmap``, a NumPy array, a CPU torch tensor, or any CPU
DLPack producer; a CUDA tensor or ``__cuda_array_interface__`` array where CUDA's driver is usable,
copied through the driver a piece at a time over HTTP and registered over RDMA), ``get_into`` writes
into the writable one given, and ``get`` fills the ``bytes`` it returns. That memory must stay unchanged (for ``put``) and unread (for ``get_into``) until the
call returns; every call blocks without holding the GIL, so other threads run meanwhile.

With credentials (``access_key`` and ``secret_key``, or ``FERRY_OBJECTS_ACCESS_KEY`` and
``FERRY_OBJECTS_SECRET_KEY`` in the environment) the store refuses every request that does not
carry a valid AWS Signature Version 4 (``ferry.PermissionDenied``), and the client signs its own.

Errors are ferry's exceptions: ``ferry.NotFound`` for a missing bucket or object,
``ferry.InvalidArgument`` for a malformed URL, a bad name, or a buffer too small for the object,
``ferry.Busy`` for a bucket that exists (create) or still has objects (delete),
``ferry.PermissionDenied`` for a refused signature, ``ferry.Unavailable`` when the store cannot be
reached, ``ferry.IoError`` when a transfer breaks off, and ``ferry.Closed`` after ``close()``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Tuple, TypedDict, Union, cast

from ._core import objects as _co
from ._memory import registrable as _registrable

__all__ = ["ObjectStore", "ObjectClient", "ObjectInfo", "StoreStats", "parse_object_url"]

PathLike = Union[str, "os.PathLike[str]"]
ProgressCallback = Callable[[int, int], Any]


class ObjectInfo(TypedDict):
    """An object as ``ObjectClient.list()`` and ``ObjectClient.head()`` describe it."""

    key: str
    size: int  # bytes
    etag: str  # quoted, as S3 has it


class StoreStats(TypedDict):
    """``ObjectStore.stats()``: what the store holds and what it has served."""

    objects: int
    bytes: int
    buckets: int
    rdma_gets: int  # pieces sent by RDMA
    rdma_puts: int  # pieces received by RDMA
    http_gets: int  # objects sent in HTTP bodies
    http_puts: int  # objects received in HTTP bodies
    rdma_bytes: int
    http_bytes: int
    refused: int  # requests answered with an error
    memory_bytes: int  # bytes of objects, parts and bodies held in memory now (max_memory_bytes)
    cached_objects: int  # with data_dir: objects whose bytes are in memory too


def parse_object_url(url: str) -> Tuple[str, str, str]:
    """``(base, bucket, key)`` of ``"http://HOST:PORT[/BUCKET[/KEY]]"``, ``""`` for a part that is
    absent; ``base`` is what ``ObjectClient.connect()`` takes. Raises ``ferry.InvalidArgument`` for
    anything else."""
    return _co.parse_object_url(url)


def _text(value: Optional[str]) -> str:
    return "" if value is None else value


class ObjectStore:
    """A running object store, in this process.

    ``host`` and ``port`` are the HTTP listener's (port 0: the kernel picks one, see ``port`` and
    ``url``); ``rdma_host`` and ``rdma_port`` the object server's RDMA session (default: ``host``,
    any port). Without ``data_dir`` objects live in memory; with it they live on disk, each a file
    ``data_dir/bucket/key`` (metadata under ``data_dir/.ferry``), memory is their cache, and a store
    restarted on the same directory serves them again with their ETags and metadata.
    ``max_memory_bytes`` bounds the bytes held in memory (objects, or with ``data_dir`` the cache,
    parts and bodies being received; 0: half of the host's memory); past it a PUT is refused with
    507 InsufficientStorage, or with ``data_dir`` the least recently used cached objects are
    dropped from memory first. ``access_key`` and ``secret_key`` (default: ``FERRY_OBJECTS_ACCESS_KEY`` and
    ``FERRY_OBJECTS_SECRET_KEY``; none: no authentication) require every request to be signed
    (AWS SigV4, ``region``). ``threads`` HTTP workers serve requests; an object may have up to
    ``max_object_bytes``.

    Raises ``ferry.InvalidArgument`` for bad options, ``ferry.Unavailable`` when the address cannot
    be bound, ``ferry.IoError`` when ``data_dir`` cannot be read. A context manager: leaving the
    ``with`` block stops the store."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, rdma_host: Optional[str] = None,
                 rdma_port: int = 0, data_dir: Optional[PathLike] = None, access_key: Optional[str] = None,
                 secret_key: Optional[str] = None, region: str = "us-east-1", threads: int = 8,
                 max_object_bytes: int = 64 << 30, max_memory_bytes: int = 0) -> None:
        self._store = _co.ObjectStore.start(
            host=host, port=port, rdma_host=_text(rdma_host), rdma_port=rdma_port,
            data_dir="" if data_dir is None else os.fspath(data_dir), access_key=_text(access_key),
            secret_key=_text(secret_key), region=region, threads=threads, max_object_bytes=max_object_bytes,
            max_memory_bytes=max_memory_bytes)

    @classmethod
    def start(cls, host: str = "127.0.0.1", port: int = 0, **options: Any) -> "ObjectStore":
        """Starts a store: the same as ``ObjectStore(host, port, **options)``."""
        return cls(host, port, **options)

    @property
    def port(self) -> int:
        """The HTTP port."""
        return self._store.port

    @property
    def url(self) -> str:
        """``"http://HOST:PORT"``, for ``ObjectClient.connect()`` and ``ferry objects``."""
        return self._store.url

    def stats(self) -> StoreStats:
        """What the store holds and has served (see :class:`StoreStats`)."""
        return cast(StoreStats, self._store.stats())

    def stop(self) -> None:
        """Stops serving (requests in flight finish first) and drops the objects held in memory
        (those under ``data_dir`` stay). Idempotent."""
        self._store.stop()

    def __enter__(self) -> "ObjectStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return "<ferry ObjectStore %s>" % self.url


class ObjectClient:
    """A client of an object store at ``url`` (``"http://HOST:PORT"``; a path after it is ignored).

    ``rdma=True`` moves payloads by RDMA in pieces of ``piece_bytes`` (at most 1 GiB), one request
    each; ``rdma=False`` in the HTTP body. ``access_key`` and ``secret_key`` (default:
    ``FERRY_OBJECTS_ACCESS_KEY`` and ``FERRY_OBJECTS_SECRET_KEY``) sign every request for
    ``region``. ``progress(done, total)`` is called, with the GIL, on the calling thread, as an
    object's bytes move (after each piece by RDMA); an exception it raises is raised when the call
    returns (the transfer is not interrupted). ``timeout`` is in seconds, per HTTP request.

    Raises ``ferry.InvalidArgument`` for a malformed URL or bad options, ``ferry.Unavailable`` when
    the RDMA session does not start. A context manager: leaving the ``with`` block closes it."""

    def __init__(self, url: str, *, access_key: Optional[str] = None, secret_key: Optional[str] = None,
                 region: str = "us-east-1", rdma: bool = True, piece_bytes: int = 64 << 20,
                 progress: Optional[ProgressCallback] = None, timeout: int = 120) -> None:
        self._url = url
        self._rdma = bool(rdma)
        self._client = _co.ObjectClient.connect(
            url, access_key=_text(access_key), secret_key=_text(secret_key), region=region, rdma=self._rdma,
            piece_bytes=piece_bytes, progress=progress, timeout=timeout)

    @classmethod
    def connect(cls, url: str, access_key: Optional[str] = None, secret_key: Optional[str] = None,
                region: str = "us-east-1", rdma: bool = True, piece_bytes: int = 64 << 20,
                progress: Optional[ProgressCallback] = None, timeout: int = 120) -> "ObjectClient":
        """A client of the store at ``url``: the same as ``ObjectClient(url, ...)``."""
        return cls(url, access_key=access_key, secret_key=secret_key, region=region, rdma=rdma,
                   piece_bytes=piece_bytes, progress=progress, timeout=timeout)

    @property
    def url(self) -> str:
        """The store's URL as given to the constructor."""
        return self._url

    @property
    def rdma(self) -> bool:
        """Whether payloads move by RDMA (else in the HTTP body)."""
        return self._rdma

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._client.closed

    def close(self) -> None:
        """Releases the client and its RDMA session; later calls raise ``ferry.Closed``. Idempotent."""
        self._client.close()

    # ---- buckets ----
    def create_bucket(self, bucket: str) -> None:
        """Creates ``bucket`` (S3's names: 3 to 63 of a-z, 0-9, '-' and '.'). ``ferry.Busy`` when it
        exists, ``ferry.InvalidArgument`` for a bad name."""
        self._client.create_bucket(bucket)

    def delete_bucket(self, bucket: str) -> None:
        """Removes an empty bucket: ``ferry.Busy`` when it has objects, ``ferry.NotFound`` when there
        is none."""
        self._client.delete_bucket(bucket)

    def buckets(self) -> List[str]:
        """The names of the store's buckets."""
        return self._client.buckets()

    def list(self, bucket: str, prefix: str = "") -> List[ObjectInfo]:
        """The objects of ``bucket`` whose key starts with ``prefix``, in key order."""
        return cast(List[ObjectInfo], self._client.list(bucket, prefix))

    # ---- objects ----
    def put(self, bucket: str, key: str, data: Any) -> None:
        """Stores ``data`` as the object ``bucket/key``, replacing it; the object appears whole when
        its last byte arrived. ``data`` is any contiguous buffer (``bytes``, ``bytearray``,
        ``memoryview``, ``mmap``, a NumPy array), a CPU or CUDA torch tensor or a DLPack producer; its
        memory is read in place (CUDA memory through the driver; ``ferry.NotSupported`` naming why
        where the driver is not usable). ``ferry.NotFound`` when there is no such bucket."""
        self._client.put(bucket, key, _registrable(data, "put"))

    def put_file(self, bucket: str, key: str, path: PathLike) -> None:
        """Stores the file at ``path`` as the object (read piece by piece; ``ferry.NotFound`` when
        it cannot be opened)."""
        self._client.put_file(bucket, key, os.fspath(path))

    def get(self, bucket: str, key: str) -> bytes:
        """The object's bytes. ``ferry.NotFound`` when there is no such bucket or object."""
        return self._client.get(bucket, key)

    def get_into(self, bucket: str, key: str, buffer: Any) -> int:
        """Reads the object into the writable ``buffer`` (a ``bytearray``, writable ``memoryview`` or
        ``mmap``, a NumPy array, a CPU or CUDA tensor) from its start, in place; returns the object's size.
        ``ferry.InvalidArgument`` when the buffer is smaller than the object or read-only."""
        return self._client.get_into(bucket, key, _registrable(buffer, "get_into"))

    def get_file(self, bucket: str, key: str, path: PathLike) -> None:
        """Writes the object to the file at ``path`` (created or truncated)."""
        self._client.get_file(bucket, key, os.fspath(path))

    def head(self, bucket: str, key: str) -> ObjectInfo:
        """The object's key, size and etag, without its payload."""
        return cast(ObjectInfo, self._client.head(bucket, key))

    def remove(self, bucket: str, key: str) -> None:
        """Removes the object (as in S3, no error when there is none; ``ferry.NotFound`` for a
        missing bucket)."""
        self._client.remove(bucket, key)

    def __enter__(self) -> "ObjectClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<ferry ObjectClient %s%s%s>" % (self._url, "" if self._rdma else " (HTTP body)",
                                                 " closed" if self.closed else "")
