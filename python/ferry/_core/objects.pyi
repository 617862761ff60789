"""
The object store and its client
"""
from __future__ import annotations
import typing
__all__: list[str] = ['ObjectClient', 'ObjectStore', 'parse_object_url']
class ObjectStore:
    """
    The object store: S3-style HTTP, payloads by RDMA (store.h).
    """
    @staticmethod
    def start(*, host: str = '127.0.0.1', port: typing.SupportsInt | typing.SupportsIndex = 0, rdma_host: str = '', rdma_port: typing.SupportsInt | typing.SupportsIndex = 0, data_dir: str = '', access_key: str = '', secret_key: str = '', region: str = 'us-east-1', threads: typing.SupportsInt | typing.SupportsIndex = 8, max_object_bytes: typing.SupportsInt | typing.SupportsIndex = 68719476736, max_memory_bytes: typing.SupportsInt | typing.SupportsIndex = 0) -> ObjectStore:
        """
        Starts the HTTP listener and the object server (port 0: the kernel picks one). ferry.InvalidArgument for bad options, ferry.Unavailable when the address cannot be bound, ferry.IoError when the data directory cannot be read.
        """
    def stats(self) -> dict:
        """
        objects, bytes, buckets, rdma_gets, rdma_puts, http_gets, http_puts, rdma_bytes, http_bytes, refused (requests answered with an error), memory_bytes (held in memory now), cached_objects (with a data directory: objects whose bytes are in memory too)
        """
    def stop(self) -> None:
        """
        Stops serving (requests in flight finish first) and drops the objects held in memory. Idempotent.
        """
    @property
    def port(self) -> int:
        """
        The HTTP port
        """
    @property
    def url(self) -> str:
        """
        "http://HOST:PORT", for ObjectClient.connect()
        """
class ObjectClient:
    """
    A client of the object store (store.h).
    """
    @staticmethod
    def connect(url: str, *, access_key: str = '', secret_key: str = '', region: str = 'us-east-1', rdma: bool = True, piece_bytes: typing.SupportsInt | typing.SupportsIndex = 67108864, progress: typing.Any | None = None, timeout: typing.SupportsInt | typing.SupportsIndex = 120) -> ObjectClient:
        """
        A client of the store at url ("http://HOST:PORT"; a path after it is ignored). ferry.InvalidArgument for a malformed URL or options, ferry.Unavailable when the RDMA session does not start (rdma=True).
        """
    def buckets(self) -> list[str]:
        """
        The names of the buckets
        """
    def close(self) -> None:
        """
        Releases the client (its RDMA session). Idempotent.
        """
    def create_bucket(self, bucket: str) -> None:
        """
        Creates a bucket (ferry.Busy when it exists).
        """
    def delete_bucket(self, bucket: str) -> None:
        """
        Removes an empty bucket (ferry.Busy when it has objects).
        """
    def get(self, bucket: str, key: str) -> bytes:
        """
        The object's bytes.
        """
    def get_file(self, bucket: str, key: str, path: str) -> None:
        """
        Writes the object to the file at path.
        """
    def get_into(self, bucket: str, key: str, buffer: typing.Any) -> int:
        """
        Reads the object into the writable buffer; its size (ferry.InvalidArgument when it does not fit).
        """
    def head(self, bucket: str, key: str) -> dict:
        """
        The object's key, size and etag.
        """
    def list(self, bucket: str, prefix: str = '') -> list:
        """
        The bucket's objects whose key starts with prefix: dicts key, size, etag.
        """
    def put(self, bucket: str, key: str, data: typing.Any) -> None:
        """
        Stores the buffer's bytes as the object (without copying them).
        """
    def put_file(self, bucket: str, key: str, path: str) -> None:
        """
        Stores the file at path as the object.
        """
    def remove(self, bucket: str, key: str) -> None:
        """
        Removes the object (no error when there is none).
        """
    @property
    def closed(self) -> bool:
        """
        Whether close() was called
        """
def parse_object_url(url: str) -> tuple[str, str, str]:
    """
    (base, bucket, key) of "http://HOST:PORT[/BUCKET[/KEY]]" ("" for a part that is absent); ferry.InvalidArgument for anything else.
    """
