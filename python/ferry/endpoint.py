"""The Endpoint API: RDMA endpoints with futures, over RDMA NICs and ferry's software devices.

The names and calling conventions are those of the Endpoint API document, so its examples run
after ``from ferry import ...``::

    from ferry import RDMAEndpoint, available_nic

    devices = available_nic()
    initiator = RDMAEndpoint(device_name=devices[0], ib_port=1, link_type="RoCE")
    target = RDMAEndpoint(device_name=devices[-1], ib_port=1, link_type="RoCE")
    local = initiator.register_memory_region("kv", buf.data_ptr(), 0, nbytes)
    target.register_memory_region("kv", other.data_ptr(), 0, nbytes)
    remote = initiator.register_remote_memory_region("kv", target.endpoint_info()["mr_info"]["kv"])
    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())
    initiator.read([(local, remote, 0, 8, 8)], None).wait()

An assignment tuple is ``(mr_key, remote_mr_key, target_offset, source_offset, length)``:
``target_offset`` is where the bytes land (local for read, remote for write), ``source_offset``
where they come from. :class:`Assignment` names the same fields without the direction
(``local_offset``, ``remote_offset``), and a NumPy array of :data:`assignment_dtype` (or an N x 5
``uint64`` array, in tuple order) passes a large batch without per-tuple Python cost.

The per-operation calls (``read``, ``write``, ``write_with_imm``, ``send``, ``recv``,
``imm_recv``) run in C++ with the GIL released; so does every wait. See docs/endpoint.md.
"""

from __future__ import annotations

import inspect as _inspect
import json as _json
from typing import Any, Dict, Literal, Mapping, Optional, Protocol, Sequence, Tuple, Union, overload

from ._core import endpoint as _ep
from ._core import verbs as _verbs
from ._memory import registrable as _registrable
from .errors import InvalidArgument as _InvalidArgument

__all__ = [
    "RDMAEndpoint", "RDMAContext", "RDMAMemoryPool", "RDMAWorker", "Assignment", "assignment_dtype",
    "available_nic", "socket_id",
    "ReadWriteFuture", "SendFuture", "RecvFuture", "ImmRecvFuture", "EndpointFuture",
    "SlimeReadWriteFuture", "SlimeSendFuture", "SlimeRecvFuture", "SlimeImmRecvFuture",
]

available_nic = _ep.available_nic
socket_id = _ep.socket_id

EndpointFuture = _ep.Future
ReadWriteFuture = _ep.ReadWriteFuture
SendFuture = _ep.SendFuture
RecvFuture = _ep.RecvFuture
ImmRecvFuture = _ep.ImmRecvFuture
# The document's names for the same classes.
SlimeReadWriteFuture = ReadWriteFuture
SlimeSendFuture = SendFuture
SlimeRecvFuture = RecvFuture
SlimeImmRecvFuture = ImmRecvFuture


def _to_json(value: object, what: str) -> str:
    """JSON text of metadata given as a dict (or already as JSON text)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    try:
        return _json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _InvalidArgument("%s is not JSON-serialisable metadata: %s" % (what, exc)) from None


def _register_args(args: Sequence[Any], kwargs: Mapping[str, Any],
                   allow_pool_form: bool) -> Tuple[Union[str, int], object, int, Optional[int]]:
    """(key, target, offset, length) from the register_memory_region() forms:

    - ``(key, ptr_or_buffer, offset, length)``: the document's form (memory at ptr + offset);
    - ``(key, ptr_or_buffer, length)`` and ``(key, buffer)``;
    - on a pool, also ``(data_ptr, length, name=None)``.
    """
    kwargs = dict(kwargs)
    key = kwargs.pop("mr_key", kwargs.pop("name", kwargs.pop("key", None)))
    target = kwargs.pop("data_ptr", kwargs.pop("ptr", kwargs.pop("buffer", None)))
    offset = kwargs.pop("offset", None)
    length = kwargs.pop("length", None)
    if kwargs:
        raise TypeError("register_memory_region: unexpected argument(s) %s" % ", ".join(sorted(kwargs)))
    args = list(args)
    if (allow_pool_form and len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], int)
            and target is None):
        # RDMAMemoryPool.register_memory_region(data_ptr, length, name=None)
        target, length = args
        key = key if key is not None else "0x%x" % target
        return key, target, 0, length
    if key is None and args:
        key = args.pop(0)
    if target is None and args:
        target = args.pop(0)
    if len(args) == 2:
        offset, length = args
    elif len(args) == 1:
        length = args[0]
    elif args:
        raise TypeError("register_memory_region takes (key, ptr_or_buffer[, offset], length)")
    if key is None or target is None:
        raise TypeError("register_memory_region needs a key (name or int) and memory (address or buffer)")
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise _InvalidArgument("register_memory_region: the key must be a str name or an int")
    return key, _registrable(target, "register_memory_region"), 0 if offset is None else offset, length


class RDMAContext(_ep.Context):
    """An opened device port: ``RDMAContext(device_name="", ib_port=1, link_type="RoCE")``.

    Endpoints and pools made from one context share the device. ``device_name=""`` is the first
    device of :func:`available_nic`. Opening is shared per process: two contexts of one device
    and port are the same device context underneath.
    """

    def __init__(self, device_name: str = "", ib_port: int = 1, link_type: str = "RoCE") -> None:
        super().__init__(device_name=device_name, ib_port=ib_port, link_type=link_type)

    def init(self, device_name: str = "", ib_port: int = 1, link_type: str = "RoCE") -> int:
        """The document's two-step form: accepted when it names this context's device (returns 0).
        Raises ferry.InvalidArgument for another device or port, or a link type the device does
        not have."""
        if device_name not in ("", self.device_name) or ib_port != self.ib_port:
            raise _InvalidArgument("RDMAContext.init: this context is %s port %d; make a new RDMAContext(%r) "
                                   "for another device" % (self.device_name, self.ib_port, device_name))
        _ep.Context(device_name=self.device_name, ib_port=ib_port, link_type=link_type)  # checks link_type
        return 0

    def launch_future(self) -> int:
        """Progress always runs (a worker thread per endpoint or RDMAWorker): nothing to launch.
        Returns 0."""
        return 0

    def stop_future(self) -> int:
        """The document's counterpart of :meth:`launch_future`: nothing to stop (endpoints and
        workers stop their own threads). Returns 0."""
        return 0

    def __repr__(self) -> str:
        return "RDMAContext(%r, ib_port=%d, link_type=%r)" % (self.device_name, self.ib_port, self.link_type)


class _Registers(Protocol):
    """What alloc_memory_region is a method of: an endpoint or a pool."""

    def register_memory_region(self, *args: Any, **kwargs: Any) -> int: ...


def _alloc_memory_region(self: _Registers, key: Union[str, int], length: int) -> _verbs.SharedMemory:
    """Allocates *length* zero-filled bytes, registers them under *key* (a str name or an int
    below 2**31, as for ``register_memory_region``) and returns the memory: a
    ``ferry.verbs.SharedMemory``, a writable buffer that ``np.frombuffer(buf, dtype)`` and
    ``torch.frombuffer(buf, dtype=...)`` view without a copy. A same-host peer on the software
    provider maps this memory once, so its READs and WRITEs of it are loads and stores with no
    system call. The region keeps the memory alive until it is unregistered; every view does
    too. Raises ferry.InvalidArgument for a length that is not a positive int or a bad key, and
    ferry.ResourceExhausted when the memory cannot be had."""
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise _InvalidArgument("alloc_memory_region: length must be a positive int, not %r" % (length,))
    memory = _verbs.alloc_shared(length)
    self.register_memory_region(key, memory)
    return memory


class RDMAMemoryPool(_ep.MemoryPool):
    """Local memory regions of one context, shared by every endpoint made with ``RDMAEndpoint(pool)``."""

    def __init__(self, context: Optional[_ep.Context] = None) -> None:
        if context is None:
            context = RDMAContext()
        super().__init__(context)

    def register_memory_region(self, *args: Any, **kwargs: Any) -> int:
        """Registers memory and returns its handle. Forms: ``(key, ptr, offset, length)`` (memory at
        ptr + offset), ``(key, ptr, length)``, ``(key, buffer[, offset, length])`` and
        ``(data_ptr, length, name=None)``. ``key`` is a str name or an int below 2**31 (then the
        handle is the key). Buffers (bytearray, memoryview, mmap, NumPy arrays), CPU and CUDA
        tensors, CPU DLPack objects and CUDA ones exporting ``__cuda_array_interface__`` (CuPy) are
        kept alive, and their exports held, until the region is unregistered; CUDA memory registers
        where CUDA's driver is usable (``ferry._core.cuda()``). TypeError for a form that is none of
        these; ferry.InvalidArgument for a bad key or range; ferry.NotSupported for memory ferry
        cannot reach (another device, CUDA memory without a usable driver)."""
        key, target, offset, length = _register_args(args, kwargs, allow_pool_form=True)
        return self._register(key, target, offset, length)

    alloc_memory_region = _alloc_memory_region

    def mr_info(self) -> Dict[str, Dict[str, Any]]:
        """``{name: {"handle", "addr", "length", "rkey", "writable"}}`` of every region."""
        return _json.loads(self._mr_info_json())


# A pool reached through RDMAEndpoint.get_pool() is the extension's own
# class: give it the same registration forms.
_ep.MemoryPool.register_memory_region = RDMAMemoryPool.register_memory_region  # type: ignore[method-assign, assignment]
_ep.MemoryPool.mr_info = RDMAMemoryPool.mr_info  # type: ignore[method-assign, assignment]

_DEVICE_FORM = _inspect.Signature([
    _inspect.Parameter("device_name", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=""),
    _inspect.Parameter("ib_port", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=1),
    _inspect.Parameter("link_type", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default="RoCE"),
    _inspect.Parameter("num_qp", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=1),
    _inspect.Parameter("worker", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
])
_OPTIONS = ("send_depth", "recv_depth", "recv_buffer_size", "gid_index")


def _form(first_name: str) -> _inspect.Signature:
    return _inspect.Signature([
        _inspect.Parameter(first_name, _inspect.Parameter.POSITIONAL_OR_KEYWORD),
        _inspect.Parameter("num_qp", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=1),
        _inspect.Parameter("worker", _inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    ])


_CONTEXT_FORM = _form("context")
_POOL_FORM = _form("pool")


class RDMAEndpoint(_ep.Endpoint):
    """One connection to one peer over ``num_qp`` queue pairs.

    ``RDMAEndpoint(device_name="", ib_port=1, link_type="RoCE", num_qp=1, worker=None)``,
    ``RDMAEndpoint(context, num_qp=1, worker=None)`` or ``RDMAEndpoint(pool, num_qp=1, worker=None)``;
    keyword-only tuning: ``send_depth`` (work requests in flight per queue pair, default 256),
    ``recv_depth`` (receive buffers kept posted per queue pair, 32) and ``recv_buffer_size``
    (bytes each, 65536; larger messages travel in several fragments) and ``gid_index`` (the GID
    table entry to use, 0).
    """

    @overload
    def __init__(self, device_name: Optional[str] = "", ib_port: int = 1, link_type: str = "RoCE", num_qp: int = 1,
                 worker: Optional[_ep.Worker] = None, *, send_depth: Optional[int] = None,
                 recv_depth: Optional[int] = None, recv_buffer_size: Optional[int] = None,
                 gid_index: int = 0) -> None: ...

    @overload
    def __init__(self, context: _ep.Context, num_qp: int = 1, worker: Optional[_ep.Worker] = None, *,
                 send_depth: Optional[int] = None, recv_depth: Optional[int] = None,
                 recv_buffer_size: Optional[int] = None, gid_index: int = 0) -> None: ...

    @overload
    def __init__(self, pool: _ep.MemoryPool, num_qp: int = 1, worker: Optional[_ep.Worker] = None, *,
                 send_depth: Optional[int] = None, recv_depth: Optional[int] = None,
                 recv_buffer_size: Optional[int] = None, gid_index: int = 0) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
        first = args[0] if args else None
        if isinstance(first, _ep.Context) or "context" in kwargs:
            bound = _CONTEXT_FORM.bind(*args, **kwargs)
        elif isinstance(first, _ep.MemoryPool) or "pool" in kwargs:
            bound = _POOL_FORM.bind(*args, **kwargs)
        else:
            bound = _DEVICE_FORM.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        if a.get("device_name") is None and "device_name" in a:
            a["device_name"] = ""
        super().__init__(**a, **options)

    def register_memory_region(self, *args: Any, **kwargs: Any) -> int:
        """Registers local memory in the endpoint's pool and returns its handle.

        ``(key, ptr, offset, length)`` as in the document (memory at ptr + offset),
        ``(key, ptr, length)``, or ``(key, buffer[, offset, length])`` for anything exporting the
        buffer protocol (bytearray, memoryview, mmap, NumPy), a CPU or CUDA tensor, or any object
        exporting CPU memory through DLPack (``__dlpack__``; viewed without a copy) or CUDA memory
        through DLPack and ``__cuda_array_interface__`` (CuPy). ``key`` is a str name
        or an int below 2**31 (then the handle is that int); mr_info lists the region under the
        name (the int's decimal text). The memory must stay valid until the region is
        unregistered; buffers passed as objects are kept alive by the registration.

        TypeError for a form that is none of these; ferry.InvalidArgument for a bad key, a range
        outside the memory, or write access to read-only memory; ferry.NotSupported for memory on
        another device than the CPU and CUDA, and for CUDA memory where CUDA's driver is not usable.
        """
        key, target, offset, length = _register_args(args, kwargs, allow_pool_form=False)
        return self._register(key, target, offset, length)

    alloc_memory_region = _alloc_memory_region

    def register_remote_memory_region(self, name: Union[str, int],
                                      mr_info: Union[Mapping[str, Any], str, bytes]) -> int:
        """Records a peer's region from its mr_info entry (``endpoint_info()["mr_info"][name]``, a
        dict or its JSON text) and returns its handle (the peer's handle for it where that is free
        here). ferry.InvalidArgument for a malformed entry or a name that is neither str nor int."""
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise _InvalidArgument("register_remote_memory_region: the name must be a str or an int")
        return self._register_remote(str(name), _to_json(mr_info, "mr_info"))

    def endpoint_info(self) -> Dict[str, Any]:
        """This side's metadata, a JSON-serialisable dict: ``ferry_endpoint`` (version), ``device``,
        ``num_qp``, ``qp_paths`` (one per queue pair), ``recv_buffer_size`` and ``mr_info`` (every
        region of the pool, by name). Hand it to the peer's ``connect()``; it grants access to
        those regions, so only to the peer."""
        return _json.loads(self._endpoint_info_json())

    def mr_info(self) -> Dict[str, Dict[str, Any]]:
        """The pool's regions: ``{name: {"handle", "addr", "length", "rkey", "writable"}}``."""
        return _json.loads(self._mr_info_json())

    def connect(self, peer_info: Union[Mapping[str, Any], str, bytes]) -> None:
        """Connects to the peer whose ``endpoint_info()`` this is (a dict, or its JSON text); both
        sides call it. Malformed metadata raises ferry.InvalidArgument and changes nothing."""
        self._connect(_to_json(peer_info, "peer_info"))

    def __enter__(self) -> RDMAEndpoint:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.shutdown()
        return False

    def __repr__(self) -> str:
        state = "shut down" if self.is_shutdown else "connected" if self.connected else "not connected"
        return "<RDMAEndpoint %s num_qp=%d %s>" % (self.context.device_name, self.num_qp, state)


class RDMAWorker(_ep.Worker):
    """A progress thread shared by endpoints: ``RDMAWorker(dev_name, id)``, ``RDMAWorker(socket_id, id)``
    or ``RDMAWorker()``. Pass it as ``worker=`` when making endpoints (or ``add_endpoint()``).
    ``stop()`` shuts down the endpoints it progresses (their pending futures raise ferry.Cancelled)."""


#: A region of an assignment: its handle (int) or its name (str).
RegionKey = Union[int, str]


class Assignment:
    """One range of a read/write batch with named fields::

        Assignment(local=kv, remote=remote_kv, local_offset=0, remote_offset=8, length=8)

    ``local`` and ``remote`` are handles or names. The fields do not depend on the direction:
    read moves remote -> local, write local -> remote. Keyword-only, so that they are never
    confused with the document's tuple order (see :meth:`from_tuple`)."""

    __slots__ = ("local", "remote", "local_offset", "remote_offset", "length")

    def __init__(self, *, local: RegionKey, remote: RegionKey, local_offset: int = 0, remote_offset: int = 0,
                 length: int) -> None:
        self.local = local
        self.remote = remote
        self.local_offset = local_offset
        self.remote_offset = remote_offset
        self.length = length

    @classmethod
    def from_tuple(cls, op: str, assignment: Tuple[RegionKey, RegionKey, int, int, int]) -> Assignment:
        """The Assignment of a document tuple ``(mr_key, remote_mr_key, target_offset,
        source_offset, length)`` for ``op`` "read" or "write" ("write_with_imm" too); ValueError
        for another op."""
        mr_key, remote_mr_key, target, source, length = assignment
        if op == "read":
            return cls(local=mr_key, remote=remote_mr_key, local_offset=target, remote_offset=source, length=length)
        if op in ("write", "write_with_imm"):
            return cls(local=mr_key, remote=remote_mr_key, local_offset=source, remote_offset=target, length=length)
        raise ValueError("op must be 'read' or 'write', not %r" % (op,))

    def as_tuple(self, op: str) -> Tuple[RegionKey, RegionKey, int, int, int]:
        """The document tuple of this range for ``op`` "read" or "write" ("write_with_imm" too);
        ValueError for another op."""
        if op == "read":
            return (self.local, self.remote, self.local_offset, self.remote_offset, self.length)
        if op in ("write", "write_with_imm"):
            return (self.local, self.remote, self.remote_offset, self.local_offset, self.length)
        raise ValueError("op must be 'read' or 'write', not %r" % (op,))

    @property
    def mr_key(self) -> RegionKey:
        """The document's name for :attr:`local`."""
        return self.local

    @property
    def remote_mr_key(self) -> RegionKey:
        """The document's name for :attr:`remote`."""
        return self.remote

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Assignment):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self) -> str:
        return "Assignment(local=%r, remote=%r, local_offset=%d, remote_offset=%d, length=%d)" % (
            self.local, self.remote, self.local_offset, self.remote_offset, self.length)


try:  # NumPy is optional; without it array batches are not offered.
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]

#: The dtype of a NumPy batch: one row per assignment, the document's tuple order.
assignment_dtype = None if _np is None else _np.dtype([
    ("mr_key", "<u8"), ("remote_mr_key", "<u8"), ("target_offset", "<u8"), ("source_offset", "<u8"),
    ("length", "<u8")])
