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

Programs written against Dynamo's ``dynamo.nixl_connect`` run unchanged:
``await connector.create_readable(...)`` (the operation is awaitable and gives itself),
``with await connector.create_writable(...) as op``, ``Descriptor((array, "cpu"))`` and the
``(ptr, size[, device[, ref]])`` forms, ``connector.hostname``, ``op.operation_kind``,
``read.results()``, ``metadata.model_dump()`` handed to ``begin_read``.

CUDA memory (a CUDA tensor, an array exporting ``__cuda_array_interface__``, a CUDA address) moves
where CUDA's driver is usable (``is_cuda_available``, ``ferry._core.cuda()``): ferry's engine locates
it through the driver and moves it as it moves host memory. Where the driver is not usable, a CUDA
descriptor can be made and inspected, and an operation given one raises ``ferry.NotSupported``
naming the driver's reason. See docs/connect.md.
"""

from __future__ import annotations

import enum
import mmap
import secrets
import socket
import weakref
from typing import Any, Dict, Generator, List, Literal, NoReturn, Optional, Sequence, Tuple, TypeVar, Union

from pydantic import BaseModel, ConfigDict

from . import aio as _aio  # noqa: F401  (makes ferry's futures awaitable)
from ._core import connect as _cc
from ._core import cuda as _cuda_driver
from ._memory import cuda_array_interface as _cuda_array_interface
from ._memory import cuda_array_layout as _cuda_array_layout
from ._memory import registrable as _registrable
from .errors import Busy, Cancelled, InvalidArgument, NotSupported

__all__ = [
    "Connector", "Descriptor", "Device", "DeviceKind", "OperationKind", "OperationStatus",
    "RdmaMetadata", "SerializedDescriptor", "AbstractOperation", "PassiveOperation", "ActiveOperation",
    "ReadableOperation", "WritableOperation", "ReadOperation", "WriteOperation", "Remote",
]


class DeviceKind(enum.IntEnum):
    """Where a descriptor's memory lives."""

    UNSPECIFIED = 0
    HOST = 1
    CUDA = 2

    def __str__(self) -> str:
        return {DeviceKind.HOST: "cpu", DeviceKind.CUDA: "cuda"}.get(self, "<invalid>")


class OperationKind(enum.IntEnum):
    """What the holder of an operation's metadata may do."""

    UNSPECIFIED = 0
    READ = 1
    WRITE = 2

    def __str__(self) -> str:
        return {OperationKind.READ: "READ", OperationKind.WRITE: "WRITE"}.get(self, "<invalid>")


class OperationStatus(enum.IntEnum):
    """An operation's state; COMPLETE, CANCELLED and ERRORED are final."""

    UNINITIALIZED = 0
    INITIALIZED = 1
    IN_PROGRESS = 2
    COMPLETE = 3
    CANCELLED = 4
    ERRORED = 5

    def __str__(self) -> str:
        # The short forms programs written for the connector document log and compare.
        return _STATUS_TEXT.get(self, "<invalid>")


_STATUS_TEXT = {OperationStatus.INITIALIZED: "INIT", OperationStatus.IN_PROGRESS: "PROC",
                OperationStatus.COMPLETE: "DONE", OperationStatus.ERRORED: "ERR",
                OperationStatus.CANCELLED: "STOP"}


class Device:
    """A memory device: ``Device("cpu")`` (or ``"host"``), ``Device("cuda:0")`` (or ``"gpu:0"``; no
    index is 0), or ``Device((DeviceKind.CUDA, 0))``. ferry.InvalidArgument for anything else."""

    _kind: DeviceKind
    _id: int

    def __init__(self, metadata: Union[str, Tuple[int, int], "Device", None] = "cpu") -> None:
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
        elif name in ("cuda", "gpu"):
            self._kind = DeviceKind.CUDA
        else:
            raise InvalidArgument("Device: unknown device %r (expected 'cpu', 'host', 'cuda:N' or 'gpu:N')"
                                  % (metadata,))
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
        """HOST or CUDA."""
        return self._kind

    @property
    def id(self) -> int:
        """The device's index (0 for host memory)."""
        return self._id

    def __str__(self) -> str:
        return "cpu" if self._kind != DeviceKind.CUDA else "cuda:%d" % self._id

    def __repr__(self) -> str:
        return "Device(%r)" % str(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self._kind, self._id) == (other._kind, other._id)

    def __hash__(self) -> int:
        return hash((self._kind, self._id))


class Descriptor:
    """Memory of an operation, in any of these forms:

    - a NumPy array, a torch tensor, ``bytes`` / ``bytearray`` / ``memoryview`` / ``mmap``, or an
      object exporting CPU memory through DLPack (``__dlpack__``; viewed without a copy, and kept
      alive);
    - ``(array, device)``: any of those, or an array exporting ``__cuda_array_interface__``
      (CuPy, Numba), with the device it lives on (a ``Device``, ``"cpu"``, ``"cuda:N"``); the device
      must be the array's own;
    - ``(ptr, size)``, ``(ptr, size, device)`` or ``(ptr, size, device, ref)``: an address, of host
      memory when no device is given; ``ref`` is kept alive while the descriptor is in use.

    The memory must be contiguous. Each operation that uses it registers it while that operation
    has not ended (``is_registered``), and keeps it referenced until then. CUDA memory (a CUDA
    tensor, a CUDA array, a CUDA address) is registered by its address where CUDA's driver is
    usable (``Connector.is_cuda_available``); elsewhere it makes a descriptor that can be
    inspected, and an operation given one raises ferry.NotSupported naming the driver's reason, as
    ferry never takes a device's address for a host one. Errors: ferry.InvalidArgument for a form,
    size or device that does not fit, ferry.NotSupported for memory on another device and for CUDA
    memory marked read-only (it would be registered writable)."""

    _ptr: int
    _size: int
    _device: Device

    def __init__(self, data: Any) -> None:
        self._data = data
        self._ref: object = None
        self._read_only = False
        self._users: weakref.WeakSet[AbstractOperation] = weakref.WeakSet()   # the operations using the memory
        if isinstance(data, tuple):
            self._from_tuple(data)
        else:
            self._from_object(data, None)
        if self._size == 0:
            raise InvalidArgument("Descriptor: the memory is empty (0 bytes)")

    def _from_tuple(self, data: Tuple[Any, ...]) -> None:
        if len(data) == 2 and not _is_int(data[0]):
            self._from_object(data[0], Device(data[1]))
            return
        if not 2 <= len(data) <= 4:
            raise InvalidArgument("Descriptor: a tuple must be (array, device), (ptr, size), (ptr, size, device) "
                                  "or (ptr, size, device, ref), not %d items" % len(data))
        ptr, size = data[0], data[1]
        for what, value in (("ptr", ptr), ("size", size)):
            if not _is_int(value) or value < 0:
                raise InvalidArgument("Descriptor: %s must be a non-negative int, not %r" % (what, value))
        if ptr == 0:
            raise InvalidArgument("Descriptor: ptr is 0")
        self._ptr, self._size = ptr, size
        self._device = Device(data[2] if len(data) > 2 else "cpu")
        self._ref = data[3] if len(data) > 3 else None

    def _from_object(self, data: Any, declared: Optional[Device]) -> None:
        """Takes an object's memory; ``declared`` is the device a tuple gave with it."""
        if _is_tensor(data):
            dev = data.device
            if dev.type not in ("cpu", "cuda"):
                raise NotSupported("Descriptor: tensors on %s are not supported" % dev)
            device = Device("cpu") if dev.type == "cpu" else Device((DeviceKind.CUDA, dev.index or 0))
            _check_declared(declared, device, type(data).__name__)
            if not data.is_contiguous():
                raise InvalidArgument("Descriptor: the tensor is not contiguous")
            self._data, self._device = data, device
            self._ptr = data.data_ptr()
            self._size = data.numel() * data.element_size()
            return
        cuda = _cuda_array_interface(data)
        if cuda is not None and not _has_buffer(data):
            # Device memory, by address: registered only where the driver is usable (see _core_args).
            if declared is not None and declared.kind != DeviceKind.CUDA:
                raise InvalidArgument("Descriptor: the %s exports __cuda_array_interface__: it is CUDA memory, given "
                                      "with device %s" % (type(data).__name__, declared))
            device = declared if declared is not None else Device((DeviceKind.CUDA, _cuda_device_id(data)))
            self._data, self._device = data, device
            self._ptr, count, itemsize, self._read_only = _cuda_array_layout(data, cuda, "Descriptor")
            self._size = count * itemsize
            return
        target = _registrable(data, "Descriptor")
        if isinstance(data, mmap.mmap):
            target = memoryview(data)
        try:
            ptr, size, read_only = _cc.buffer_info(target)
        except TypeError:
            raise InvalidArgument(
                "Descriptor: expected a NumPy array, a torch tensor, bytes, bytearray, memoryview, mmap, "
                "a DLPack object, (array, device), (ptr, size), (ptr, size, device) or (ptr, size, device, ref), "
                "not %s" % type(data).__name__) from None
        _check_declared(declared, Device("cpu"), type(data).__name__)
        self._data = target
        self._ptr, self._size, self._read_only = ptr, size, read_only
        self._device = Device("cpu")

    @property
    def ptr(self) -> int:
        """The memory's address."""
        return self._ptr

    @property
    def size(self) -> int:
        """The memory's length in bytes."""
        return self._size

    @property
    def device(self) -> Device:
        """Where the memory lives."""
        return self._device

    @property
    def read_only(self) -> bool:
        """Whether the memory may only be read (``bytes``, a read-only buffer): it can be the
        source of a transfer, never its destination."""
        return self._read_only

    @property
    def is_registered(self) -> bool:
        """True while an operation that has not ended holds the memory registered."""
        return any(op._op.status < OperationStatus.COMPLETE for op in list(self._users))

    @property
    def metadata(self) -> "SerializedDescriptor":
        """The descriptor as metadata carries it (size and device; never the address). Calling the
        result, as in ``descriptor.metadata()``, returns it too."""
        return SerializedDescriptor(size=self._size, device=str(self._device))

    def register_memory(self, connector: "Connector") -> None:
        """Checks that ``connector``'s operations can use this memory (ferry.NotSupported for CUDA
        memory where CUDA's driver is not usable). ferry registers memory for each operation that
        uses it, so there is nothing to do ahead of one."""
        if not isinstance(connector, Connector):
            raise InvalidArgument("Descriptor.register_memory: expected a Connector, not %s"
                                  % type(connector).__name__)
        self._core_args()

    register_with_connector = register_memory

    @staticmethod
    def from_serialized(serialized: "SerializedDescriptor") -> "Descriptor":
        """Refused (ferry.NotSupported): metadata carries no address to describe a peer's memory."""
        return serialized.to_descriptor()

    def __str__(self) -> str:
        return "ptr=0x%x, size=%d, device=%s" % (self._ptr, self._size, self._device)

    def __repr__(self) -> str:
        return "Descriptor(%s)" % self

    def _core_args(self) -> Tuple[Any, Optional[int], Descriptor]:
        if self._device.kind == DeviceKind.CUDA:
            driver = _cuda_driver()
            if not driver["usable"]:
                raise NotSupported("Descriptor on %s: CUDA memory cannot be registered here, CUDA's driver is not "
                                   "usable: %s (Connector.is_cuda_available is False)"
                                   % (self._device, driver["reason"]))
            if self._read_only:
                raise NotSupported("Descriptor on %s: the CUDA memory is marked read-only, and ferry registers "
                                   "CUDA memory writable only" % self._device)
            # By address, with the descriptor (holding the tensor or array) kept alive by the core;
            # the registration locates the memory through the driver.
            return (self._ptr, self._size, self)
        if self._ref is not None or isinstance(self._data, tuple):
            return (self._ptr, self._size, self)
        return (self._data, None, self)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_declared(declared: Optional[Device], actual: Device, what: str) -> None:
    if declared is not None and declared != actual:
        raise InvalidArgument("Descriptor: the %s is %s memory, given with device %s" % (what, actual, declared))


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


def _cuda_device_id(obj: object) -> int:
    ident = getattr(getattr(obj, "device", None), "id", 0)
    return ident if _is_int(ident) and ident >= 0 else 0


def _is_tensor(obj: object) -> bool:
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "numel") \
        and hasattr(obj, "device")


def _descriptors(local: object, what: str) -> Tuple[List[Descriptor], List[Tuple[Any, Optional[int], Descriptor]]]:
    """The Descriptors of ``local`` (one or a list), checked, and the core's arguments for them."""
    if isinstance(local, Descriptor):
        items = [local]
    elif isinstance(local, (list, tuple)) and all(isinstance(d, Descriptor) for d in local):
        items = list(local)
    else:
        raise InvalidArgument("%s: expected a Descriptor or a list of Descriptors, not %s"
                              % (what, type(local).__name__))
    if not items:
        raise InvalidArgument("%s: no descriptor" % what)
    return items, [d._core_args() for d in items]


class SerializedDescriptor(BaseModel):
    """One descriptor as metadata carries it: its size and device."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    size: int
    device: str

    def __call__(self) -> "SerializedDescriptor":
        # ``descriptor.metadata()``, the older spelling of the ``descriptor.metadata`` property.
        return self

    def to_descriptor(self) -> "Descriptor":
        """Refused (ferry.NotSupported): metadata carries no address of the peer's memory; a
        transfer names the peer's memory by the operation alone."""
        raise NotSupported("SerializedDescriptor.to_descriptor: ferry's metadata carries no memory address "
                           "(a peer's memory is reached through its operation only)")


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
        """What the metadata grants: READ or WRITE (UNSPECIFIED for another ``kind``)."""
        try:
            return OperationKind(self.kind)
        except ValueError:
            return OperationKind.UNSPECIFIED

    def to_descriptors(self) -> NoReturn:
        """Refused (ferry.NotSupported), as ``SerializedDescriptor.to_descriptor``."""
        raise NotSupported("RdmaMetadata.to_descriptors: ferry's metadata carries no memory address "
                           "(a peer's memory is reached through its operation only)")


def _metadata_text(remote_metadata: object, what: str) -> str:
    if isinstance(remote_metadata, RdmaMetadata):
        return remote_metadata.model_dump_json()
    if isinstance(remote_metadata, dict):  # model_dump()'s form
        try:
            return RdmaMetadata.model_validate(remote_metadata).model_dump_json()
        except ValueError as e:
            raise InvalidArgument("%s: the metadata is malformed: %s" % (what, e)) from None
    if isinstance(remote_metadata, (str, bytes, bytearray)):
        return remote_metadata.decode() if not isinstance(remote_metadata, str) else remote_metadata
    raise InvalidArgument("%s: remote_metadata must be an RdmaMetadata (or its JSON text or dict), not %s"
                          % (what, type(remote_metadata).__name__))


_Op = TypeVar("_Op", bound="AbstractOperation")


class AbstractOperation:
    """What every operation has: status, wait_for_completion(), cancel(), with / async with."""

    def __init__(self, connector: "Connector", op: _cc.Operation, descriptors: List[Descriptor]) -> None:
        self._connector = connector
        self._op = op
        self._descriptors = descriptors
        for d in descriptors:
            d._users.add(self)

    @property
    def status(self) -> OperationStatus:
        """The operation's state now (COMPLETE, CANCELLED and ERRORED are final)."""
        return OperationStatus(self._op.status)

    @property
    def kind(self) -> OperationKind:
        """READ for readable and read operations, WRITE for writable and write operations."""
        return OperationKind(self._op.kind)

    @property
    def operation_kind(self) -> OperationKind:
        """The same as ``kind``: READ for readable and read operations, WRITE for the others."""
        return self.kind

    @property
    def connector(self) -> "Connector":
        """The Connector that made the operation."""
        return self._connector

    @property
    def nbytes(self) -> int:
        """Bytes moved so far (by this side as owner, or for this side)."""
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

    def _dispose(self) -> None:
        op = getattr(self, "_op", None)
        if op is not None and op.status < OperationStatus.COMPLETE:
            op.cancel()

    def __enter__(self: _Op) -> _Op:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._dispose()
        return False

    async def __aenter__(self: _Op) -> _Op:
        return self

    async def __aexit__(self, *exc: object) -> Literal[False]:
        self._dispose()
        return False

    def __del__(self) -> None:
        try:
            self._dispose()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    def __repr__(self) -> str:
        return "<%s %d %s>" % (type(self).__name__, self._op.id, self.status.name)


class PassiveOperation(AbstractOperation):
    """An owner's operation: local memory a peer reads or writes once, by its metadata.

    ``create_readable`` / ``create_writable`` return it ready: awaiting it (``await
    connector.create_readable(...)``, ``with await ...``) gives the operation itself."""

    def __init__(self, connector: Connector, op: _cc.Operation, descriptors: List[Descriptor]) -> None:
        super().__init__(connector, op, descriptors)
        self._metadata: Optional[RdmaMetadata] = None

    def __await__(self: _Op) -> Generator[Any, None, _Op]:
        return self
        yield  # noqa  (makes this a generator: awaiting the operation gives it back at once)

    def metadata(self, hex_encode: bool = False) -> RdmaMetadata:
        """The metadata a peer needs to begin its read or write (send ``.model_dump_json()``).
        ``hex_encode`` is accepted and changes nothing: the metadata has one encoding, JSON."""
        if self._metadata is None:
            self._metadata = RdmaMetadata.model_validate_json(self._op.metadata())
        return self._metadata


class ReadableOperation(PassiveOperation):
    """Local memory a remote worker may read once, with this operation's metadata."""


class WritableOperation(PassiveOperation):
    """Local memory a remote worker may write once, with this operation's metadata."""


class Remote:
    """The peer of a read or write: ``name`` is its worker id (its metadata's ``worker``)."""

    def __init__(self, connector: "Connector", name: str) -> None:
        self._connector = connector
        self._name = name

    @property
    def connector(self) -> "Connector":
        """The local Connector whose operation reads or writes the peer's."""
        return self._connector

    @property
    def name(self) -> str:
        """The peer's worker id."""
        return self._name

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return "Remote(name=%r, connector=%r)" % (self._name, self._connector.name)


class ActiveOperation(AbstractOperation):
    """A read or write of a peer's operation, begun by its metadata."""

    def __init__(self, connector: Connector, op: _cc.Operation, descriptors: List[Descriptor],
                 metadata_text: str) -> None:
        super().__init__(connector, op, descriptors)
        self._metadata_text = metadata_text
        self._remote: Optional[Remote] = None

    @property
    def remote(self) -> Remote:
        """The owner of the operation read or written."""
        if self._remote is None:
            worker = RdmaMetadata.model_validate_json(self._metadata_text).worker  # the owner accepted it
            self._remote = Remote(self._connector, worker)
        return self._remote


class ReadOperation(ActiveOperation):
    """A read of a remote ReadableOperation into local memory."""

    def results(self) -> List[Descriptor]:
        """The local Descriptors read into, once the read is COMPLETE. Raises the ferry error that
        ended the read when it did not complete, and ferry.Busy while it runs."""
        status = self.status
        if status == OperationStatus.COMPLETE:
            return list(self._descriptors)
        if status < OperationStatus.COMPLETE:
            raise Busy("ReadOperation.results: the read is %s, not COMPLETE" % status.name)
        self._op.raise_error()
        raise Cancelled("ReadOperation.results: the read ended %s" % status.name)


class WriteOperation(ActiveOperation):
    """A write of local memory into a remote WritableOperation."""


class Connector:
    """Creates readable and writable operations, and reads from or writes to remote ones.

    ``worker_id`` names this worker (its agent's alias; ``connector-`` and random hex when None).
    ``hostname`` is this host's name. ``runtime`` is kept and
    returned by ``runtime()`` (none is needed). ``store`` is an optional discovery store URL of
    the agent (``ferry://``, ``redis://``, ``etcd://``); ``namespace`` its scope. ``metadata_ttl``
    (seconds) bounds how long metadata may be used; ``cancel_grace`` how long ``cancel()`` waits
    for a transfer in flight to stop; ``secret`` is the agent's shared secret
    (``FERRY_AGENT_SECRET`` when None)."""

    def __init__(self, worker_id: Optional[str] = None, *, runtime: object = None, store: Optional[str] = None,
                 namespace: str = "default", secret: Optional[str] = None, listen_host: str = "",
                 metadata_ttl: float = 600.0, connect_timeout: float = 30.0, cancel_grace: float = 2.0,
                 chunk_bytes: int = 64 << 20, window: int = 4) -> None:
        if worker_id is not None and not isinstance(worker_id, str):
            raise InvalidArgument("Connector: worker_id must be a str or None")
        if not worker_id:
            worker_id = "connector-" + secrets.token_hex(4)
        self._runtime = runtime
        self._hostname = socket.gethostname()
        self._options: Dict[str, Any] = dict(worker_id=worker_id, store=store or "", scope=namespace,
                             secret=secret or "", listen_host=listen_host, metadata_ttl=float(metadata_ttl),
                             connect_timeout=float(connect_timeout), cancel_grace=float(cancel_grace),
                             chunk_bytes=int(chunk_bytes), window=int(window))
        self._namespace = namespace
        self._core: Optional[_cc.Connector] = None

    async def initialize(self) -> None:
        """Starts the connector's agent (idempotent)."""
        self._start()

    def _start(self) -> _cc.Connector:
        if self._core is None:
            self._core = _cc.Connector(**self._options)
        return self._core

    @property
    def name(self) -> str:
        """The worker id (the agent's alias)."""
        return self._core.name if self._core is not None else self._options["worker_id"]

    @property
    def hostname(self) -> str:
        """The name of this worker's host (``socket.gethostname()``)."""
        return self._hostname

    @property
    def namespace(self) -> str:
        """The agent's scope in its store (``namespace`` of the constructor)."""
        return self._namespace

    @property
    def is_cuda_available(self) -> bool:
        """Whether CUDA memory can be registered and moved here: CUDA's driver loaded, initialised
        and found a device (``ferry._core.cuda()["usable"]``; its ``reason`` says why not)."""
        return bool(_cuda_driver()["usable"])

    def runtime(self) -> object:
        """The runtime given to the constructor (None without one)."""
        return self._runtime

    @property
    def address(self) -> bytes:
        """The agent's worker address."""
        return self._start().address

    def stats(self) -> Dict[str, int]:
        """The connector's counters: ``created`` (readable and writable operations), ``begun``
        (reads and writes begun here), ``served`` (transfers moved as owner), ``refused`` (begins
        refused: tag, expiry, state, sizes), ``completed``, ``cancelled``, ``errored``,
        ``bytes_moved`` (as owner) and ``live`` (operations not ended). Starts the agent when it
        is not running."""
        return self._start().stats()

    def create_readable(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> ReadableOperation:
        """Exposes local memory to be read once by the holder of the operation's metadata. Returns
        the operation, which may also be awaited (``await connector.create_readable(...)`` gives
        it too)."""
        items, args = _descriptors(local_descriptors, "create_readable")
        return ReadableOperation(self, self._start().create_readable(args), items)

    def create_writable(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> WritableOperation:
        """Exposes local memory to be written once by the holder of the operation's metadata.
        Returns the operation, which may also be awaited, as ``create_readable``'s."""
        items, args = _descriptors(local_descriptors, "create_writable")
        return WritableOperation(self, self._start().create_writable(args), items)

    async def begin_read(self, remote_metadata: Union[RdmaMetadata, Dict[str, Any], str, bytes],
                         local_descriptors: Union[Descriptor, Sequence[Descriptor]]) -> ReadOperation:
        """Begins reading a remote ReadableOperation into local memory (sizes matched pairwise)."""
        text = _metadata_text(remote_metadata, "begin_read")
        items, args = _descriptors(local_descriptors, "begin_read")
        return ReadOperation(self, self._start().begin_read(text, args), items, text)

    async def begin_write(self, local_descriptors: Union[Descriptor, Sequence[Descriptor]],
                          remote_metadata: Union[RdmaMetadata, Dict[str, Any], str, bytes]) -> WriteOperation:
        """Begins writing local memory into a remote WritableOperation (sizes matched pairwise)."""
        text = _metadata_text(remote_metadata, "begin_write")
        items, args = _descriptors(local_descriptors, "begin_write")
        return WriteOperation(self, self._start().begin_write(args, text), items, text)

    def shutdown(self) -> None:
        """Ends every operation not ended and stops the agent (idempotent)."""
        if self._core is not None:
            self._core.shutdown()

    async def close(self) -> None:
        """:meth:`shutdown`, awaitable (Dynamo's spelling)."""
        self.shutdown()

    def __del__(self) -> None:
        # Shut down here, with the GIL released by the call, rather than in the core object's
        # destructor (which runs holding the GIL while the agent's thread may need it).
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    async def __aenter__(self) -> Connector:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> Literal[False]:
        self.shutdown()
        return False

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return "<Connector %r hostname=%r namespace=%r>" % (self.name, self._hostname, self._namespace)
