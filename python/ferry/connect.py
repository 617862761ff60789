"""ferry.connect: readable and writable operations over serialized metadata, in asyncio.

One worker exposes memory as a readable or writable operation and hands the operation's metadata
to another over any channel (HTTP, a queue, a file); the other begins a read or a write against
it; both await completion::

    from ferry.connect import Connector, Descriptor, RdmaMetadata

    connector = Connector()
    await connector.initialize()
    readable = connector.create_readable(Descriptor(tensor))          # or a list of Descriptors
    text = readable.metadata().model_dump_json()                      # to the peer, any channel
    # the peer:
    op = await connector.begin_read(RdmaMetadata.model_validate_json(text), Descriptor(dst))
    await op.wait_for_completion()
    await readable.wait_for_completion()                              # the passive side learns it too

No runtime or service is needed: each Connector runs its own ferry agent (``ferry.agent``), and the
metadata carries the owner's address. The owner of a readable or writable operation moves the
bytes itself (RDMA WRITE into the reader's buffers, READ from the writer's), after checking the
metadata's tag, expiry and state; so its ``wait_for_completion()`` returns when its own transfer has
landed, awaited through a file descriptor the event loop watches (``ferry.aio``), with no polling.

Metadata grants one operation, in one direction, once, until it expires (``metadata_ttl``); any
change to its text makes the owner refuse it (``ferry.PermissionDenied``). It is JSON, never
pickled. ``cancel()`` (and leaving a ``with`` / ``async with`` block, or dropping an operation that
has not ended) revokes this side's memory before it returns and stops a transfer in flight; the
peer's operation then ends ERRORED with ``ferry.Cancelled``.

Host memory only: ``is_cuda_available`` is False and CUDA descriptors are refused with
``ferry.NotSupported``. See docs/connect.md.
"""

from __future__ import annotations

import enum
import mmap
from typing import List, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict

from . import aio as _aio  # noqa: F401  (makes ferry's futures awaitable)
from ._core import connect as _cc
from ._memory import registrable as _registrable
from .errors import InvalidArgument, NotSupported

__all__ = [
    "Connector", "Descriptor", "Device", "DeviceKind", "OperationKind", "OperationStatus",
    "RdmaMetadata", "SerializedDescriptor", "ReadableOperation", "WritableOperation",
    "ReadOperation", "WriteOperation",
]


class DeviceKind(enum.IntEnum):
    """Where a descriptor's memory lives."""

    UNSPECIFIED = 0
    HOST = 1
    CUDA = 2


class OperationKind(enum.IntEnum):
    """What the holder of an operation's metadata may do."""

    UNSPECIFIED = 0
    READ = 1
    WRITE = 2


class OperationStatus(enum.IntEnum):
    """An operation's state; COMPLETE, CANCELLED and ERRORED are final."""

    UNINITIALIZED = 0
    INITIALIZED = 1
    IN_PROGRESS = 2
    COMPLETE = 3
    CANCELLED = 4
    ERRORED = 5


class Device:
    """A memory device: ``Device("cpu")``, ``Device("cuda:0")``, or ``Device((DeviceKind.CUDA, 0))``."""

    def __init__(self, metadata: Union[str, tuple, "Device", None] = "cpu"):
        if isinstance(metadata, Device):
            self._kind, self._id = metadata.kind, metadata.id
            return
        if metadata is None:
            metadata = "cpu"
        if isinstance(metadata, tuple):
            if len(metadata) != 2:
                raise InvalidArgument("Device: expected (DeviceKind, id), got %r" % (metadata,))
            kind, ident = metadata
            try:
                self._kind = DeviceKind(kind)
            except ValueError:
                raise InvalidArgument("Device: unknown kind %r" % (kind,)) from None
            if not isinstance(ident, int) or isinstance(ident, bool) or ident < 0:
                raise InvalidArgument("Device: the id must be a non-negative int, not %r" % (ident,))
            self._id = ident
            return
        if not isinstance(metadata, str):
            raise InvalidArgument("Device: expected 'cpu', 'cuda:N' or (DeviceKind, id), not %r" % (metadata,))
        text = metadata.strip().lower()
        name, _, index = text.partition(":")
        if name in ("cpu", "host"):
            self._kind = DeviceKind.HOST
        elif name == "cuda":
            self._kind = DeviceKind.CUDA
        else:
            raise InvalidArgument("Device: unknown device %r (expected 'cpu' or 'cuda:N')" % (metadata,))
        if index:
            if not index.isdigit():
                raise InvalidArgument("Device: %r has no valid index" % (metadata,))
            self._id = int(index)
        else:
            self._id = 0
        if self._kind == DeviceKind.HOST and self._id != 0:
            raise InvalidArgument("Device: %r: host memory has no index" % (metadata,))

    @property
    def kind(self) -> DeviceKind:
        return self._kind

    @property
    def id(self) -> int:
        return self._id

    def __str__(self):
        return "cpu" if self._kind != DeviceKind.CUDA else "cuda:%d" % self._id

    def __repr__(self):
        return "Device(%r)" % str(self)

    def __eq__(self, other):
        return isinstance(other, Device) and (self._kind, self._id) == (other._kind, other._id)

    def __hash__(self):
        return hash((self._kind, self._id))


class Descriptor:
    """Memory of an operation: a NumPy array, a torch tensor, ``bytes`` / ``bytearray`` /
    ``memoryview`` / ``mmap``, an object exporting CPU memory through DLPack (``__dlpack__``;
    viewed without a copy, and kept alive), or ``(ptr, size, device, ref)`` (``ref`` is kept
    alive while the descriptor is in use). The memory must be contiguous; it is registered when
    an operation uses it, and stays referenced until that operation ends."""

    def __init__(self, data):
        self._data = data
        self._ref = None
        if isinstance(data, tuple):
            if len(data) != 4:
                raise InvalidArgument("Descriptor: a tuple must be (ptr, size, device, ref)")
            ptr, size, device, ref = data
            for what, value in (("ptr", ptr), ("size", size)):
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise InvalidArgument("Descriptor: %s must be a non-negative int, not %r" % (what, value))
            if ptr == 0:
                raise InvalidArgument("Descriptor: ptr is 0")
            self._ptr, self._size, self._device, self._ref = ptr, size, Device(device), ref
            self._read_only = False
        elif _is_tensor(data):
            dev = data.device
            self._device = Device("cpu" if dev.type == "cpu" else "%s:%d" % (dev.type, dev.index or 0)) \
                if dev.type in ("cpu", "cuda") else None
            if self._device is None:
                raise NotSupported("Descriptor: tensors on %s are not supported" % dev)
            if not data.is_contiguous():
                raise InvalidArgument("Descriptor: the tensor is not contiguous")
            self._ptr = data.data_ptr()
            self._size = data.numel() * data.element_size()
            self._read_only = False
        else:
            target = _registrable(data, "Descriptor")
            if isinstance(data, mmap.mmap):
                target = memoryview(data)
            try:
                ptr, size, read_only = _cc.buffer_info(target)
            except TypeError:
                raise InvalidArgument(
                    "Descriptor: expected a NumPy array, a torch tensor, bytes, bytearray, memoryview, mmap, "
                    "a DLPack object or (ptr, size, device, ref), not %s" % type(data).__name__) from None
            self._data = target
            self._ptr, self._size, self._read_only = ptr, size, read_only
            self._device = Device("cpu")
        if self._size == 0:
            raise InvalidArgument("Descriptor: the memory is empty (0 bytes)")

    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def device(self) -> Device:
        return self._device

    @property
    def read_only(self) -> bool:
        return self._read_only

    def __repr__(self):
        return "Descriptor(ptr=0x%x, size=%d, device=%s)" % (self._ptr, self._size, self._device)

    def _core_args(self):
        if self._device.kind == DeviceKind.CUDA:
            raise NotSupported("Descriptor on %s: CUDA memory is not available to ferry here "
                               "(Connector.is_cuda_available is False)" % self._device)
        if self._ref is not None or isinstance(self._data, tuple):
            return (self._ptr, self._size, self)
        if _is_tensor(self._data):
            return (self._data, None, self)
        return (self._data, None, self)


def _is_tensor(obj) -> bool:
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "numel") \
        and hasattr(obj, "device")


def _descriptors(local, what):
    if isinstance(local, Descriptor):
        items = [local]
    elif isinstance(local, (list, tuple)) and all(isinstance(d, Descriptor) for d in local):
        items = list(local)
    else:
        raise InvalidArgument("%s: expected a Descriptor or a list of Descriptors, not %s"
                              % (what, type(local).__name__))
    if not items:
        raise InvalidArgument("%s: no descriptor" % what)
    return [d._core_args() for d in items]


class SerializedDescriptor(BaseModel):
    """One descriptor as metadata carries it: its size and device."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    size: int
    device: str


class RdmaMetadata(BaseModel):
    """What a peer needs to begin a read or write of one operation: the owner's name and address,
    the operation, what may be done, the descriptors' sizes, an expiry (ms since the epoch) and a
    tag over all of it. Versioned JSON (``model_dump_json()`` / ``model_validate_json()``); a
    changed field makes the owner refuse it. It grants access to memory: handle it as a secret."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: int
    kind: int
    worker: str
    address: str
    operation: int
    nonce: str
    expires: int
    descriptors: List[SerializedDescriptor]
    tag: str

    @property
    def operation_kind(self) -> OperationKind:
        try:
            return OperationKind(self.kind)
        except ValueError:
            return OperationKind.UNSPECIFIED


def _metadata_text(remote_metadata, what) -> str:
    if isinstance(remote_metadata, RdmaMetadata):
        return remote_metadata.model_dump_json()
    if isinstance(remote_metadata, (str, bytes, bytearray)):
        return remote_metadata.decode() if not isinstance(remote_metadata, str) else remote_metadata
    raise InvalidArgument("%s: remote_metadata must be an RdmaMetadata (or its JSON text), not %s"
                          % (what, type(remote_metadata).__name__))


class _Operation:
    """What every operation has: status, wait_for_completion(), cancel(), with / async with."""

    def __init__(self, connector: "Connector", op):
        self._connector = connector
        self._op = op

    @property
    def status(self) -> OperationStatus:
        return OperationStatus(self._op.status)

    @property
    def kind(self) -> OperationKind:
        return OperationKind(self._op.kind)

    @property
    def nbytes(self) -> int:
        return self._op.bytes

    async def wait_for_completion(self) -> None:
        """Returns when the operation completed; raises its ferry error when it was cancelled
        (``ferry.Cancelled``) or failed (``ferry.PeerGone`` naming the peer, ``ferry.PermissionDenied``,
        ...). It always ends: an operation whose peer is gone ends with ``ferry.PeerGone`` once the
        agent knows (at once for a process that died), and one that no peer began by its metadata's
        expiry with ``ferry.TimedOut`` (docs/connect.md, "Every wait ends")."""
        await self._op.completion()

    def cancel(self) -> None:
        """Cancels the operation unless it ended: when this returns, the peer can no longer reach
        this side's memory and no transfer touches it."""
        self._op.cancel()

    def _dispose(self):
        op = getattr(self, "_op", None)
        if op is not None and op.status < OperationStatus.COMPLETE:
            op.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._dispose()
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self._dispose()
        return False

    def __del__(self):
        try:
            self._dispose()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    def __repr__(self):
        return "<%s %d %s>" % (type(self).__name__, self._op.id, self.status.name)


class _PassiveOperation(_Operation):
    def __init__(self, connector, op):
        super().__init__(connector, op)
        self._metadata = None

    def metadata(self) -> RdmaMetadata:
        """The metadata a peer needs to begin its read or write (send ``.model_dump_json()``)."""
        if self._metadata is None:
            self._metadata = RdmaMetadata.model_validate_json(self._op.metadata())
        return self._metadata


class ReadableOperation(_PassiveOperation):
    """Local memory a remote worker may read once, with this operation's metadata."""


class WritableOperation(_PassiveOperation):
    """Local memory a remote worker may write once, with this operation's metadata."""


class ReadOperation(_Operation):
    """A read of a remote ReadableOperation into local memory."""


class WriteOperation(_Operation):
    """A write of local memory into a remote WritableOperation."""


class Connector:
    """Creates readable and writable operations, and reads from or writes to remote ones.

    ``worker_id`` names this worker (its agent's alias; random when None). ``runtime`` is kept and
    returned by ``runtime()`` (none is needed). ``store`` is an optional discovery store URL of
    the agent (``ferry://``, ``redis://``, ``etcd://``); ``namespace`` its scope. ``metadata_ttl``
    (seconds) bounds how long metadata may be used; ``cancel_grace`` how long ``cancel()`` waits
    for a transfer in flight to stop; ``secret`` is the agent's shared secret
    (``FERRY_AGENT_SECRET`` when None)."""

    def __init__(self, worker_id: Optional[str] = None, *, runtime=None, store: Optional[str] = None,
                 namespace: str = "default", secret: Optional[str] = None, listen_host: str = "",
                 metadata_ttl: float = 600.0, connect_timeout: float = 30.0, cancel_grace: float = 2.0,
                 chunk_bytes: int = 64 << 20, window: int = 4):
        if worker_id is not None and not isinstance(worker_id, str):
            raise InvalidArgument("Connector: worker_id must be a str or None")
        self._runtime = runtime
        self._options = dict(worker_id=worker_id or "", store=store or "", scope=namespace,
                             secret=secret or "", listen_host=listen_host, metadata_ttl=float(metadata_ttl),
                             connect_timeout=float(connect_timeout), cancel_grace=float(cancel_grace),
                             chunk_bytes=int(chunk_bytes), window=int(window))
        self._namespace = namespace
        self._core = None

    async def initialize(self) -> None:
        """Starts the connector's agent (idempotent)."""
        self._start()

    def _start(self):
        if self._core is None:
            self._core = _cc.Connector(**self._options)
        return self._core

    @property
    def name(self) -> Optional[str]:
        """The worker id (the agent's alias)."""
        return self._core.name if self._core is not None else (self._options["worker_id"] or None)

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def is_cuda_available(self) -> bool:
        """False: ferry moves host memory (no GPU path)."""
        return False

    def runtime(self):
        """The runtime given to the constructor (None without one)."""
        return self._runtime

    @property
    def address(self) -> bytes:
        """The agent's worker address."""
        return self._start().address

    def stats(self) -> dict:
        return self._start().stats()

    def create_readable(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> ReadableOperation:
        """Exposes local memory to be read once by the holder of the operation's metadata."""
        args = _descriptors(local_descriptors, "create_readable")
        return ReadableOperation(self, self._start().create_readable(args))

    def create_writable(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> WritableOperation:
        """Exposes local memory to be written once by the holder of the operation's metadata."""
        args = _descriptors(local_descriptors, "create_writable")
        return WritableOperation(self, self._start().create_writable(args))

    async def begin_read(self, remote_metadata: RdmaMetadata,
                         local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> ReadOperation:
        """Begins reading a remote ReadableOperation into local memory (sizes matched pairwise)."""
        text = _metadata_text(remote_metadata, "begin_read")
        args = _descriptors(local_descriptors, "begin_read")
        return ReadOperation(self, self._start().begin_read(text, args))

    async def begin_write(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]],
                          remote_metadata: RdmaMetadata) -> WriteOperation:
        """Begins writing local memory into a remote WritableOperation (sizes matched pairwise)."""
        text = _metadata_text(remote_metadata, "begin_write")
        args = _descriptors(local_descriptors, "begin_write")
        return WriteOperation(self, self._start().begin_write(args, text))

    def shutdown(self) -> None:
        """Ends every operation not ended and stops the agent (idempotent)."""
        if self._core is not None:
            self._core.shutdown()

    async def close(self) -> None:
        self.shutdown()

    def __del__(self):
        # Shut down here, with the GIL released by the call, rather than in the core object's
        # destructor (which runs holding the GIL while the agent's thread may need it).
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    async def __aenter__(self):
        await self.initialize()
        return self

    async def __aexit__(self, *exc):
        self.shutdown()
        return False

    def __repr__(self):
        return "<Connector %r namespace=%r>" % (self.name, self._namespace)
