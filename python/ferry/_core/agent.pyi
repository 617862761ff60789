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
        """
        The Endpoint of an operation class's lane: op_class is 'messages', 'rma' or 'atomics' (None before
        the wireup finished). Raises ferry.InvalidArgument for another class.
        """
    def imm_recv(self) -> ferry._core.endpoint.ImmRecvFuture:
        """
        The peer's next write_with_imm immediate, in the order the peer issued them: an ImmRecvFuture, done
        when all that write's data is in place here; imm_data() is the value.
        """
    def is_connected(self) -> bool:
        """
        Whether the wireup finished and the peer is there.
        """
    def lanes(self) -> dict:
        """
        The lane of each operation class: {'messages', 'rma', 'atomics'} to 'same_host', 'tcp' or
        'rdma:<local device>'. Raises ferry.Unavailable before the peer's address is known.
        """
    def lanes_detail(self) -> dict:
        """
        The lanes with their devices: per operation class, {'lane', 'local_device', 'remote_device', 'why'}
        (why: the reason it was chosen). Raises ferry.Unavailable before the peer's address is known.
        """
    def read(self, assignments: typing.Any) -> ferry._core.endpoint.ReadWriteFuture:
        """
        READs a batch from the peer; a ReadWriteFuture, done when every byte is in local memory. assignments
        is one assignment or a list of them: (region, local_offset, remote_offset, length), (local_region,
        remote_region, local_offset, remote_offset, length), the Endpoint API's raw tuple or a
        ferry.Assignment; regions by name, offsets and lengths in bytes. Allowed before the wireup finished
        (queued, then posted in order). Bad local input (an unknown local region, a range outside it, an
        empty batch) raises at once; a remote region the peer does not have fails the future with
        ferry.NotFound.
        """
    def ready(self) -> ferry._core.endpoint.Future:
        """
        The wireup as a future (wait() it, or await it): done when connected or failed.
        """
    def recv(self, chunks: typing.Any) -> ferry._core.endpoint.RecvFuture:
        """
        Receives the peer's next message, scattered in order over the chunks; a RecvFuture whose nbytes() is
        the message's length (a longer message fails it with ferry.InvalidArgument). chunks is (region,
        offset, length) or a list of them: regions by name, offsets and lengths in bytes.
        """
    def send(self, chunks: typing.Any) -> ferry._core.endpoint.SendFuture:
        """
        Sends one message gathered in order from the chunks; a SendFuture, done when the message is in the
        peer's receive buffers. Sends and receives match by order. chunks is (region, offset, length) or a
        list of them: regions by name, offsets and lengths in bytes.
        """
    def wait(self, timeout: typing.Any | None = None) -> bool:
        """
        Waits for the wireup (seconds; None: until its deadline). Returns True; raises its error (ferry.TimedOut, ferry.PeerGone, ferry.Unavailable, ...).
        """
    def write(self, assignments: typing.Any) -> ferry._core.endpoint.ReadWriteFuture:
        """
        WRITEs a batch to the peer; a ReadWriteFuture, done when every byte is placed at the peer.
        assignments is one assignment or a list of them: (region, local_offset, remote_offset, length),
        (local_region, remote_region, local_offset, remote_offset, length), the Endpoint API's raw tuple or
        a ferry.Assignment; regions by name, offsets and lengths in bytes. Allowed before the wireup
        finished (queued, then posted in order). Bad local input (an unknown local region, a range outside
        it, an empty batch) raises at once; a remote region the peer does not have fails the future with
        ferry.NotFound.
        """
    def write_with_imm(self, assignments: typing.Any, imm_data: typing.Any = 0) -> ferry._core.endpoint.ReadWriteFuture:
        """
        write() followed by the immediate imm_data (-2^31 .. 2^32-1, delivered as unsigned 32-bit), which
        the peer's imm_recv() gets once every byte of the batch is in place there. Returns a
        ReadWriteFuture.
        """
    @property
    def endpoint(self) -> ferry._core.endpoint.Endpoint:
        """
        The Endpoint of the remote-memory-access lane (None before the wireup finished).
        """
    @property
    def peer_alias(self) -> str:
        """
        The peer's alias (its address's alias when connected by address).
        """
    @property
    def peer_uuid(self) -> str:
        """
        The peer's uuid as hex ('' before its address is known).
        """
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
