"""
The connector: readable and writable operations
"""
from __future__ import annotations
import ferry._core.endpoint
import typing
__all__: list[str] = ['Connector', 'Operation', 'buffer_info']
class Operation:
    """
    One readable, writable, read or write operation.
    """
    def cancel(self) -> None:
        """
        Cancels the operation unless it ended (see connector.h).
        """
    def completion(self) -> ferry._core.endpoint.Future:
        """
        A future done when the operation ended (awaitable).
        """
    def metadata(self) -> str:
        ...
    def raise_error(self) -> None:
        """
        Raises the ferry error that ended the operation (nothing when it completed or runs).
        """
    @property
    def bytes(self) -> int:
        ...
    @property
    def id(self) -> int:
        ...
    @property
    def kind(self) -> int:
        ...
    @property
    def passive(self) -> bool:
        ...
    @property
    def status(self) -> int:
        ...
class Connector:
    """
    ferry's connector (on its own agent).
    """
    def __init__(self, worker_id: str = '', store: str = '', scope: str = 'default', secret: str = '', listen_host: str = '', metadata_ttl: typing.SupportsFloat | typing.SupportsIndex = 600.0, connect_timeout: typing.SupportsFloat | typing.SupportsIndex = 30.0, cancel_grace: typing.SupportsFloat | typing.SupportsIndex = 2.0, chunk_bytes: typing.SupportsInt | typing.SupportsIndex = 67108864, window: typing.SupportsInt | typing.SupportsIndex = 4) -> None:
        ...
    def begin_read(self, metadata: str, descriptors: typing.Any) -> Operation:
        ...
    def begin_write(self, descriptors: typing.Any, metadata: str) -> Operation:
        ...
    def create_readable(self, descriptors: typing.Any) -> Operation:
        ...
    def create_writable(self, descriptors: typing.Any) -> Operation:
        ...
    def shutdown(self) -> None:
        ...
    def stats(self) -> dict:
        ...
    @property
    def address(self) -> bytes:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def namespace(self) -> str:
        ...
def buffer_info(obj: typing.Any) -> tuple[int, int, bool]:
    """
    (address, size, read_only) of a contiguous buffer object.
    """
