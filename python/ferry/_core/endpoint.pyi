"""
The Endpoint API
"""
from __future__ import annotations
import typing
__all__: list[str] = ['Context', 'DoneNotifier', 'Endpoint', 'Future', 'ImmRecvFuture', 'MemoryPool', 'ReadWriteFuture', 'RecvFuture', 'SendFuture', 'Worker', 'available_nic', 'process_stats', 'socket_id']
class DoneNotifier:
    """
    Reports completed futures through a file descriptor an event loop watches.
    """
    def __init__(self) -> None:
        ...
    def drain(self) -> list[int]:
        ...
    def fileno(self) -> int:
        ...
    def watch(self, future: Future, token: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Context:
    """
    An opened device port (RdmaContext).
    """
    def __init__(self, device_name: str = '', ib_port: typing.SupportsInt | typing.SupportsIndex = 1, link_type: str = 'RoCE') -> None:
        ...
    def stats(self) -> dict:
        """
        Per kind of operation of every endpoint on this context: completed, bytes, errors by status, latency
        """
    @property
    def device_name(self) -> str:
        ...
    @property
    def ib_port(self) -> int:
        ...
    @property
    def link_type(self) -> str:
        ...
    @property
    def socket_id(self) -> int:
        ...
class MemoryPool:
    """
    Local memory regions shared by endpoints.
    """
    def __init__(self, context: Context) -> None:
        ...
    def __len__(self) -> int:
        ...
    def _mr_info_json(self) -> str:
        ...
    def _register(self, key: typing.Any, target: typing.Any, offset: typing.SupportsInt | typing.SupportsIndex = 0, length: typing.Any | None = None) -> int:
        ...
    def get_handle(self, name: str) -> int:
        ...
    def mr_info(self) -> dict[str, dict[str, typing.Any]]:
        """
        ``{name: {"handle", "addr", "length", "rkey", "writable"}}`` of every region.
        """
    def register_memory_region(self, *args: typing.Any, **kwargs: typing.Any) -> int:
        """
        Registers memory and returns its handle. Forms: ``(key, ptr, offset, length)`` (memory at
                ptr + offset), ``(key, ptr, length)``, ``(key, buffer[, offset, length])`` and
                ``(data_ptr, length, name=None)``. ``key`` is a str name or an int below 2**31 (then the
                handle is the key). Buffers (bytearray, memoryview, mmap, NumPy arrays), CPU tensors and CPU
                DLPack objects are kept alive, and their exports held, until the region is unregistered.
        """
    def unregister_memory_region(self, key: typing.Any) -> None:
        """
        Deregisters a region (by handle or name); its memory may be freed afterwards.
        """
    @property
    def context(self) -> Context:
        ...
class Worker:
    """
    A progress thread for one or more endpoints.
    """
    @typing.overload
    def __init__(self, id: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @typing.overload
    def __init__(self, dev_name: str, id: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @typing.overload
    def __init__(self, socket_id: typing.SupportsInt | typing.SupportsIndex, id: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __len__(self) -> int:
        ...
    def add_endpoint(self, endpoint: Endpoint) -> None:
        ...
    def start(self) -> int:
        ...
    def stop(self) -> None:
        ...
    @property
    def id(self) -> int:
        ...
    @property
    def running(self) -> bool:
        ...
    @property
    def socket_id(self) -> int:
        ...
class Future:
    """
    An asynchronous operation of an endpoint.
    """
    def __await__(self) -> typing.Generator[typing.Any, None, int]:
        ...
    def __repr__(self) -> str:
        ...
    def done(self) -> bool:
        ...
    def wait(self, timeout: typing.Any | None = None) -> int:
        """
        Waits for the operation (timeout in seconds; None: until it completes). Returns 0; raises the operation's error (ferry.WorkCompletionError, ferry.Cancelled, ...) or ferry.TimedOut.
        """
class ReadWriteFuture(Future):
    pass
class SendFuture(Future):
    pass
class RecvFuture(Future):
    def nbytes(self) -> int:
        """
        The received message's length (once done).
        """
class ImmRecvFuture(Future):
    def imm_data(self) -> int:
        """
        The immediate value (once done).
        """
class Endpoint:
    """
    One connection to a peer (see ferry.RDMAEndpoint).
    """
    def __init__(self, *, context: typing.Any | None = None, pool: typing.Any | None = None, device_name: str = '', ib_port: typing.SupportsInt | typing.SupportsIndex = 1, link_type: str = 'RoCE', num_qp: typing.SupportsInt | typing.SupportsIndex = 1, worker: Worker | None = None, send_depth: typing.SupportsInt | typing.SupportsIndex | None = None, recv_depth: typing.SupportsInt | typing.SupportsIndex | None = None, recv_buffer_size: typing.SupportsInt | typing.SupportsIndex | None = None, gid_index: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    def _connect(self, arg0: str) -> None:
        ...
    def _endpoint_info_json(self) -> str:
        ...
    def _mr_info_json(self) -> str:
        ...
    def _register(self, key: typing.Any, target: typing.Any, offset: typing.SupportsInt | typing.SupportsIndex = 0, length: typing.Any | None = None) -> int:
        ...
    def _register_remote(self, name: str, info: str) -> int:
        ...
    def get_pool(self) -> MemoryPool:
        ...
    def imm_recv(self, stream: typing.Any | None = None) -> ImmRecvFuture:
        """
        The peer's next write_with_imm immediate.
        """
    def local_handle(self, name: str) -> int:
        ...
    def read(self, assign: typing.Any, stream: typing.Any | None = None) -> ReadWriteFuture:
        """
        READ a batch: [(mr_key, remote_mr_key, target_offset, source_offset, length), ...] where the target is local. Returns a ReadWriteFuture.
        """
    def recv(self, chunk: typing.Any, stream_handler: typing.Any | None = None) -> RecvFuture:
        """
        Receives the next message into [(mr_key, offset, length), ...].
        """
    def remote_handle(self, name: str) -> int:
        ...
    def send(self, chunk: typing.Any, stream_handler: typing.Any | None = None) -> SendFuture:
        """
        Sends one message gathered from [(mr_key, offset, length), ...].
        """
    def shutdown(self) -> None:
        """
        Fails every pending operation with ferry.Cancelled and releases the queue pairs. Idempotent.
        """
    def stats(self) -> dict:
        ...
    def unregister_memory_region(self, key: typing.Any) -> None:
        ...
    def write(self, assign: typing.Any, stream: typing.Any | None = None) -> ReadWriteFuture:
        """
        WRITE a batch: [(mr_key, remote_mr_key, target_offset, source_offset, length), ...] where the target is remote. Returns a ReadWriteFuture.
        """
    def write_with_imm(self, assign: typing.Any, imm_data: typing.Any = 0, stream: typing.Any | None = None) -> ReadWriteFuture:
        """
        write() whose immediate the peer's imm_recv() gets once all the data is in place.
        """
    @property
    def connected(self) -> bool:
        ...
    @property
    def context(self) -> Context:
        ...
    @property
    def is_shutdown(self) -> bool:
        ...
    @property
    def num_qp(self) -> int:
        ...
    @property
    def worker(self) -> Worker:
        ...
def available_nic() -> list[str]:
    """
    The names of every usable device (software devices included), in ferry's device order.
    """
def process_stats() -> list:
    """
    Every context open in this process: device, port and its operations' metrics
    """
def socket_id(device: str) -> int:
    """
    The NUMA node of a device; 0 where unknown.
    """
