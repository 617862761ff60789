"""
The agent: wireup, lanes, discovery, reconnection
"""
from __future__ import annotations
import collections.abc
import ferry._core.endpoint
import typing
__all__: list[str] = ['Agent', 'PeerConnection', 'Store']
class PeerConnection:
    """
    The connection to one peer: usable at once.
    """
    def __repr__(self) -> str:
        ...
    def endpoint_of(self, op_class: str) -> ferry._core.endpoint.Endpoint:
        ...
    def imm_recv(self) -> ferry._core.endpoint.ImmRecvFuture:
        ...
    def is_connected(self) -> bool:
        """
        Whether the wireup finished and the peer is there.
        """
    def lanes(self) -> dict:
        ...
    def lanes_detail(self) -> dict:
        ...
    def read(self, assignments: typing.Any) -> ferry._core.endpoint.ReadWriteFuture:
        ...
    def ready(self) -> ferry._core.endpoint.Future:
        """
        The wireup as a future (wait() it, or await it): done when connected or failed.
        """
    def recv(self, chunks: typing.Any) -> ferry._core.endpoint.RecvFuture:
        ...
    def send(self, chunks: typing.Any) -> ferry._core.endpoint.SendFuture:
        ...
    def wait(self, timeout: typing.Any | None = None) -> bool:
        """
        Waits for the wireup (seconds; None: until its deadline). Returns True; raises its error (ferry.TimedOut, ferry.PeerGone, ferry.Unavailable, ...).
        """
    def write(self, assignments: typing.Any) -> ferry._core.endpoint.ReadWriteFuture:
        ...
    def write_with_imm(self, assignments: typing.Any, imm_data: typing.Any = 0) -> ferry._core.endpoint.ReadWriteFuture:
        ...
    @property
    def endpoint(self) -> ferry._core.endpoint.Endpoint:
        """
        The Endpoint of the remote-memory-access lane (None before the wireup finished).
        """
    @property
    def peer_alias(self) -> str:
        ...
    @property
    def peer_uuid(self) -> str:
        ...
class Agent:
    """
    An agent (see ferry.PeerAgent).
    """
    def __init__(self, *, alias: str = '', store: str = '', scope: str = 'default', devices: collections.abc.Sequence[str] = [], listen_host: str = '', listen_port: typing.SupportsInt | typing.SupportsIndex = 0, connect_timeout: typing.SupportsFloat | typing.SupportsIndex = 30.0, peer_timeout: typing.SupportsFloat | typing.SupportsIndex = 5.0, heartbeat: typing.SupportsFloat | typing.SupportsIndex = 0.0, lease_ttl: typing.SupportsInt | typing.SupportsIndex = 10, secret: str = '', lanes: str = '', recv_depth: typing.SupportsInt | typing.SupportsIndex | None = None, recv_buffer_size: typing.SupportsInt | typing.SupportsIndex | None = None) -> None:
        ...
    def connect_address(self, address: bytes, qp_num: typing.SupportsInt | typing.SupportsIndex = 1) -> PeerConnection:
        ...
    def connect_to(self, alias: str, qp_num: typing.SupportsInt | typing.SupportsIndex = 1) -> PeerConnection:
        ...
    def describe(self) -> str:
        ...
    def get_mr_info(self, peer: str, name: str) -> str:
        ...
    def lanes(self, peer: str) -> dict:
        ...
    def lanes_detail(self, peer: str) -> dict:
        ...
    def list_agents(self) -> list[str]:
        ...
    def peer(self, alias: str) -> PeerConnection:
        ...
    def peers(self) -> list[str]:
        ...
    def register_memory_region(self, name: str, ptr: typing.Any, offset: typing.SupportsInt | typing.SupportsIndex = 0, length: typing.Any | None = None) -> None:
        ...
    def shutdown(self) -> None:
        ...
    def stats(self) -> dict:
        ...
    def unregister_memory_region(self, name: str) -> None:
        ...
    @property
    def address(self) -> bytes:
        ...
    @property
    def alias(self) -> str:
        ...
    @property
    def uuid(self) -> str:
        ...
class Store:
    """
    A discovery store by URL (memory://name, ferry://host:port, redis://host:port[/db], etcd://host:port): a key-value store of bytes. Every call has a deadline of `timeout` seconds; a store that is down raises ferry.Unavailable (or ferry.TimedOut) naming the URL, and a later call tries again.
    """
    def __init__(self, url: str, *, timeout: typing.SupportsFloat | typing.SupportsIndex = 3.0) -> None:
        ...
    def erase(self, key: str) -> None:
        """
        Deletes key; a key that is not there is not an error.
        """
    def get(self, key: str) -> bytes | None:
        """
        The value of key, or None when there is none.
        """
    def list(self, prefix: str) -> list[tuple[str, bytes]]:
        """
        Every (key, value) whose key starts with prefix.
        """
    def set(self, key: str, value: bytes) -> None:
        """
        Sets key (text, 1 to 1024 bytes) to value (bytes, up to 1 MiB).
        """
    def wait(self, key: str, timeout: typing.SupportsFloat | typing.SupportsIndex) -> bytes | None:
        """
        The value of key: at once when it is there, else the first one set within timeout seconds; None when none came.
        """
    @property
    def url(self) -> str:
        """
        The URL the store was opened with.
        """
