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
        """
        The device's name, as available_nic() reports it.
        """
    @property
    def ib_port(self) -> int:
        """
        The port number on the device (1 .. its port count).
        """
    @property
    def link_type(self) -> str:
        """
        'RoCE' for an Ethernet link layer, 'IB' for InfiniBand, else the device's transport name.
        """
    @property
    def socket_id(self) -> int:
        """
        The NUMA node of the device; 0 where unknown.
        """
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
        """
        The handle (int) of the region registered under name; raises ferry.NotFound when there is none.
        """
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
        """
        The Context (device port) the pool's regions are registered on.
        """
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
        """
        Moves an endpoint to this worker (from its own worker or another). Raises ferry.Closed when this
        worker was stopped or the endpoint was shut down.
        """
    def start(self) -> int:
        """
        Starts the progress thread (idempotent; attaching an endpoint starts it too). Returns 0; raises
        ferry.Closed after stop().
        """
    def stop(self) -> None:
        """
        Shuts down every endpoint this worker progresses (their pending futures raise ferry.Cancelled), then
        ends the thread. Idempotent; returns when the thread has exited (without holding the GIL).
        """
    @property
    def id(self) -> int:
        """
        The number given at creation (for logs and thread names).
        """
    @property
    def running(self) -> bool:
        """
        Whether the progress thread is running (started and not stopped).
        """
    @property
    def socket_id(self) -> int:
        """
        The NUMA node whose CPUs the thread runs on; -1: not pinned.
        """
class Future:
    """
    An asynchronous operation of an endpoint.
    """
    def __await__(self) -> typing.Generator[typing.Any, None, int]:
        ...
    def __repr__(self) -> str:
        ...
    def check(self) -> bool:
        """
        Whether the operation completed; raises its error when it completed with one. Never blocks and takes no completion (poll() does): done() and wait(0) in one call.
        """
    def done(self) -> bool:
        """
        Whether the operation completed (with success or an error); never blocks, and takes no completion itself: another thread must have taken it (poll() takes the completions that are there).
        """
    def poll(self) -> bool:
        """
        Takes the completions that are there once, on this thread, without blocking, and returns whether the operation is done: the step of a poll loop, which completes an operation without waking the endpoint's thread.
        """
    def wait(self, timeout: typing.Any | None = None) -> int:
        """
        Waits for the operation (timeout in seconds; None: until it completes). Returns 0; raises the operation's error (ferry.WorkCompletionError, ferry.Cancelled, ...) or ferry.TimedOut.
        """
class ReadWriteFuture(Future):
    """
    The future of read(), write() and write_with_imm(): done when every byte of the batch is placed (in
    local memory for a READ, at the peer for a WRITE). wait() returns 0, and so does await. It completes
    once, on the endpoint's worker thread or on a thread waiting for it: with success, the operation's
    error, ferry.Cancelled (shutdown) or the endpoint's failure.
    """
class SendFuture(Future):
    """
    The future of send(): done when the whole message is in the peer's receive buffers. wait() returns
    0, and so does await. It completes once, on the endpoint's worker thread or on a thread waiting for
    it: with success, the operation's error, ferry.Cancelled (shutdown) or the endpoint's failure.
    """
class RecvFuture(Future):
    """
    The future of recv(): done when a whole message is in the chunks; nbytes() is its length in bytes,
    which await gives. A message longer than the chunks fails it with ferry.InvalidArgument. It
    completes once, on the endpoint's worker thread or on a thread waiting for it: with success, the
    operation's error, ferry.Cancelled (shutdown) or the endpoint's failure.
    """
    def nbytes(self) -> int:
        """
        The received message's length (once done).
        """
class ImmRecvFuture(Future):
    """
    The future of imm_recv(): done when the peer's next write_with_imm (in the order the peer issued
    them) has placed all its data here; imm_data() is the immediate (unsigned 32-bit), which await
    gives. It completes once, on the endpoint's worker thread or on a thread waiting for it: with
    success, the operation's error, ferry.Cancelled (shutdown) or the endpoint's failure.
    """
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
        """
        The MemoryPool holding this endpoint's local regions (shared with the endpoints given the same
        pool).
        """
    def imm_recv(self, stream: typing.Any | None = None) -> ImmRecvFuture:
        """
        The peer's next write_with_imm immediate.
        """
    def local_handle(self, name: str) -> int:
        """
        The handle (int) of the local region registered under name; raises ferry.NotFound when none.
        """
    def read(self, assign: typing.Any, stream: typing.Any | None = None) -> ReadWriteFuture:
        """
        READ a batch: [(mr_key, remote_mr_key, target_offset, source_offset, length), ...] where the target is local. Returns a ReadWriteFuture.
        """
    def recv(self, chunk: typing.Any, stream_handler: typing.Any | None = None) -> RecvFuture:
        """
        Receives the next message into [(mr_key, offset, length), ...].
        """
    def remote_handle(self, name: str) -> int:
        """
        The handle (int) of the peer's region recorded under name (by connect() from the peer's mr_info, or
        registered as a remote region); raises ferry.NotFound when none.
        """
    def send(self, chunk: typing.Any, stream_handler: typing.Any | None = None) -> SendFuture:
        """
        Sends one message gathered from [(mr_key, offset, length), ...].
        """
    def shutdown(self) -> None:
        """
        Fails every pending operation with ferry.Cancelled and releases the queue pairs. Idempotent.
        """
    def stats(self) -> dict:
        """
        Counters of this endpoint: 'operations' (per kind: operations, bytes, errors, errors_by_status,
        latency_sum_us and latency_buckets as (upper bound in us, count)), 'qps' (per queue pair:
        work_requests, bytes, max_outstanding, receives_posted), 'operations_queued', 'unexpected_bytes'
        (messages held before their recv()), 'immediates_queued' and 'worker_wakeups' (the times the worker
        took the endpoint's completions).
        """
    def unregister_memory_region(self, key: typing.Any) -> None:
        """
        Deregisters a region of the endpoint's pool (by handle or name): once it returns the device no
        longer touches the memory, which may be freed. Raises ferry.NotFound for an unknown one.
        """
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
        """
        Whether connect() succeeded and the endpoint is not shut down.
        """
    @property
    def context(self) -> Context:
        """
        The Context (device port) of the endpoint's queue pairs.
        """
    @property
    def is_shutdown(self) -> bool:
        """
        Whether the endpoint was shut down (shutdown(), its worker's stop()); its operations then fail.
        """
    @property
    def num_qp(self) -> int:
        """
        The number of reliable-connected queue pairs (1 .. 64); both peers use the same.
        """
    @property
    def worker(self) -> Worker:
        """
        The Worker whose thread progresses this endpoint.
        """
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
