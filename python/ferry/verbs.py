"""ferry.verbs: an object-oriented verbs interface (the `rdma.ibverbs` module of the verbs
specification, running on every ferry device).

Get a :class:`Context` with :func:`ferry.get_verbs`, then create protection domains, memory
registrations, completion queues and queue pairs from it::

    import ferry
    import ferry.verbs as ibv

    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()

Every object with an underlying device allocation (:class:`Context`, :class:`PD`, :class:`MR`,
:class:`CQ`, :class:`CompChannel`, :class:`QP`, :class:`SRQ`, :class:`AH`) is a context manager
with a :meth:`close` method. Objects keep track of their children: closing a :class:`Context`
closes its PDs, CQs and completion channels; closing a :class:`PD` closes its QPs, AHs, SRQs and
MRs. Closing twice is harmless; using a closed object raises :class:`ferry.Closed`.

Verbs structures (``ibv_qp_attr`` ...) are classes here (:class:`qp_attr` ...) that take keyword
arguments and allow member assignment. Failing verbs calls raise :class:`ferry.SysError` (naming
the libibverbs function and the errno); the constants carry libibverbs' numbers.

Threads: objects may be used from several threads. Waits (:meth:`Context.get_async_event`, the
completion channel tools of :mod:`ferry.vtools`) release the GIL and take a timeout.
"""

from __future__ import annotations

import functools as _functools
import operator as _operator
import select as _select
import sys as _sys
import types as _types
import weakref as _weakref
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterator, NamedTuple, Optional, Tuple, Type,
                    TypeVar, Union, cast)

from . import IBA
from . import errors as _errors
from . import path as _path
from ._core import verbs as _core
from ._core.verbs_constants import *  # noqa: F401,F403  (the IBV_* numbers, see Constants below)
from ._memory import CudaArrayMemory as _CudaArrayMemory
from ._memory import registrable as _registrable
from .path import EndPort, RDMADevice

if TYPE_CHECKING:
    from typing_extensions import Buffer

SharedMemory = _core.SharedMemory
alloc_shared = _core.alloc_shared

# ---------------------------------------------------------------------------------------------
# Constants (libibverbs' numbers).
#
# Those the C++ layer defines (access and send flags, QP states, types and attribute bits, work
# request and completion opcodes and statuses, MTUs, port states, link layers, async events) are
# imported above from ferry._core.verbs_constants, which exports include/ferry/verbs/types.h:
# each number is written once, in C++.
#
# The rest of the verbs ABI: numbers of ibverbs features that ferry's C++ layer has no use for
# (device capability bits, atomic capability levels, path migration, memory windows, node and
# transport types, static rates, SRQ attribute bits, and the odd member of a set whose others it
# does define). Programs written against the verbs specification name them, so they are kept
# here, in this one place, with libibverbs' values.
IBV_ACCESS_MW_BIND = 16

IBV_ATOMIC_NONE = 0
IBV_ATOMIC_HCA = 1
IBV_ATOMIC_GLOB = 2

IBV_DEVICE_RESIZE_MAX_WR = 1
IBV_DEVICE_BAD_PKEY_CNTR = 1 << 1
IBV_DEVICE_BAD_QKEY_CNTR = 1 << 2
IBV_DEVICE_RAW_MULTI = 1 << 3
IBV_DEVICE_AUTO_PATH_MIG = 1 << 4
IBV_DEVICE_CHANGE_PHY_PORT = 1 << 5
IBV_DEVICE_UD_AV_PORT_ENFORCE = 1 << 6
IBV_DEVICE_CURR_QP_STATE_MOD = 1 << 7
IBV_DEVICE_SHUTDOWN_PORT = 1 << 8
IBV_DEVICE_INIT_TYPE = 1 << 9
IBV_DEVICE_PORT_ACTIVE_EVENT = 1 << 10
IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11
IBV_DEVICE_RC_RNR_NAK_GEN = 1 << 12
IBV_DEVICE_SRQ_RESIZE = 1 << 13
IBV_DEVICE_N_NOTIFY_CQ = 1 << 14

IBV_MIG_MIGRATED = 0
IBV_MIG_REARM = 1
IBV_MIG_ARMED = 2

IBV_MW_TYPE_1 = 1
IBV_MW_TYPE_2 = 2

IBV_NODE_UNKNOWN = -1
IBV_NODE_CA = 1
IBV_NODE_SWITCH = 2
IBV_NODE_ROUTER = 3
IBV_NODE_RNIC = 4

IBV_PORT_ACTIVE_DEFER = 5

IBV_RATE_MAX = 0
IBV_RATE_2_5_GBPS = 2
IBV_RATE_5_GBPS = 5
IBV_RATE_10_GBPS = 3
IBV_RATE_20_GBPS = 6
IBV_RATE_30_GBPS = 4
IBV_RATE_40_GBPS = 7
IBV_RATE_60_GBPS = 8
IBV_RATE_80_GBPS = 9
IBV_RATE_120_GBPS = 10

IBV_REREG_MR_KEEP_VALID = 8  # the bit after CHANGE_ACCESS; libibverbs' header has no name for it

IBV_SRQ_MAX_WR = 1
IBV_SRQ_LIMIT = 2

IBV_TRANSPORT_UNKNOWN = -1
IBV_TRANSPORT_IB = 0
IBV_TRANSPORT_IWARP = 1

IBV_WC_BIND_MW = 5

#: Bytes reserved for a GRH at the head of every receive buffer of a UD QP.
GRH_BYTES = 40

_WC_STATUS_TEXT = {
    IBV_WC_SUCCESS: "success",
    IBV_WC_LOC_LEN_ERR: "local length error",
    IBV_WC_LOC_QP_OP_ERR: "local QP operation error",
    IBV_WC_LOC_EEC_OP_ERR: "local EE context operation error",
    IBV_WC_LOC_PROT_ERR: "local protection error",
    IBV_WC_WR_FLUSH_ERR: "Work Request Flushed Error",
    IBV_WC_MW_BIND_ERR: "memory management operation error",
    IBV_WC_BAD_RESP_ERR: "bad response error",
    IBV_WC_LOC_ACCESS_ERR: "local access error",
    IBV_WC_REM_INV_REQ_ERR: "remote invalid request error",
    IBV_WC_REM_ACCESS_ERR: "remote access error",
    IBV_WC_REM_OP_ERR: "remote operation error",
    IBV_WC_RETRY_EXC_ERR: "transport retry counter exceeded",
    IBV_WC_RNR_RETRY_EXC_ERR: "RNR retry counter exceeded",
    IBV_WC_LOC_RDD_VIOL_ERR: "local RDD violation error",
    IBV_WC_REM_INV_RD_REQ_ERR: "remote invalid RD request",
    IBV_WC_REM_ABORT_ERR: "aborted error",
    IBV_WC_INV_EECN_ERR: "invalid EE context number",
    IBV_WC_INV_EEC_STATE_ERR: "invalid EE context state",
    IBV_WC_FATAL_ERR: "fatal error",
    IBV_WC_RESP_TIMEOUT_ERR: "response timeout error",
    IBV_WC_GENERAL_ERR: "general error",
}


_WC_OPCODE_NAMES = {
    IBV_WC_SEND: "IBV_WC_SEND", IBV_WC_RDMA_WRITE: "IBV_WC_RDMA_WRITE", IBV_WC_RDMA_READ: "IBV_WC_RDMA_READ",
    IBV_WC_COMP_SWAP: "IBV_WC_COMP_SWAP", IBV_WC_FETCH_ADD: "IBV_WC_FETCH_ADD", IBV_WC_BIND_MW: "IBV_WC_BIND_MW",
    IBV_WC_RECV: "IBV_WC_RECV", IBV_WC_RECV_RDMA_WITH_IMM: "IBV_WC_RECV_RDMA_WITH_IMM",
}


def wc_opcode_str(opcode: int) -> str:
    """The IBV_WC_* name of a :attr:`wc.opcode` value."""
    return _WC_OPCODE_NAMES.get(opcode, "IBV_WC_%d" % opcode)


def wc_status_str(status: int) -> str:
    """Convert a :attr:`wc.status` value into a string (as libibverbs' ibv_wc_status_str)."""
    return _WC_STATUS_TEXT.get(status, "unknown")


#: A set holding its members weakly (the verbs specification's ``WeakSet`` alias).
WeakSet = _weakref.WeakSet

# ---------------------------------------------------------------------------------------------
# Structures. sge, send_wr, recv_wr and wc are C++ values (fast to post and poll); the others are
# Python classes with the same protocol: keyword construction, member assignment, repr, ==.

sge = _core.sge
send_wr = _core.send_wr
recv_wr = _core.recv_wr
wc = _core.wc

_S = TypeVar("_S", bound="_Struct")
_M = TypeVar("_M", bound="_MaskedStruct")
_T = TypeVar("_T")


class _Struct:
    """Base of the Python verbs structures: fixed fields, keyword (or positional) construction."""

    __slots__ = ()
    _fields: ClassVar[Tuple[Tuple[str, Any], ...]] = ()   # (name, default or zero-argument factory)
    _names: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self._names):
            raise TypeError("%s() takes at most %d positional arguments" % (type(self).__name__, len(self._names)))
        for name, default in self._fields:
            object.__setattr__(self, name, default() if callable(default) else default)
        for name, value in zip(self._names, args):
            setattr(self, name, value)
        for name, value in kwargs.items():
            if name not in self._names:
                raise TypeError("%s has no field %r" % (type(self).__name__, name))
            setattr(self, name, value)

    def _asdict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._names)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (n, getattr(self, n)) for n in self._names))

    def __reduce__(self) -> Tuple[type, Tuple[()], None, None, Iterator[Tuple[str, Any]]]:
        return (type(self), (), None, None, iter(self._asdict().items()))

    def __setitem__(self, name: str, value: Any) -> None:
        # Pickle/copy restore (see __reduce__): state arrives as (name, value) pairs.
        setattr(self, name, value)

    def __copy__(self: _S) -> _S:
        return type(self)(**self._asdict())


class _MaskedStruct(_Struct):
    """A structure whose assignments also set bits in ``MASK`` (qp_attr: the attribute mask that
    says which members ibv_modify_qp applies)."""

    __slots__ = ()
    _masks: ClassVar[Dict[str, int]] = {}
    MASK: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "MASK", 0)
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        bit = self._masks.get(name)
        if bit:
            object.__setattr__(self, "MASK", self.MASK | bit)

    def __reduce__(self) -> Tuple[type, Tuple[()], None, None, Iterator[Tuple[str, Any]]]:
        items = list(self._asdict().items()) + [("MASK", self.MASK)]
        return (type(self), (), None, None, iter(items))

    def __copy__(self: _M) -> _M:
        other = type(self)(**self._asdict())
        object.__setattr__(other, "MASK", self.MASK)
        return other


class _Factory:
    """A field default made anew for each structure, by calling ``make``."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _new(make: Callable[[], _T]) -> _T:
    """The default of a field that is a new ``make()`` in each structure (typed as its value)."""
    return cast(_T, _Factory(make))


def _struct(cls: Type[_S]) -> Type[_S]:
    """The structure a class body describes: its annotated fields, in order, with their defaults
    (``_new(factory)`` for a fresh object each time), become the slots and the fields."""
    names = tuple(name for name in cls.__dict__.get("__annotations__", {}) if not name.startswith("_"))
    fields = []
    for name in names:
        default = cls.__dict__.get(name, 0)
        fields.append((name, default.make if isinstance(default, _Factory) else default))
    base = cls.__bases__[0]
    slots = names + (("MASK",) if issubclass(cls, _MaskedStruct) else ())
    namespace: Dict[str, Any] = {"__slots__": slots, "_fields": tuple(fields), "_names": names,
                                 "__doc__": cls.__doc__, "__module__": cls.__module__}
    if "_masks" in cls.__dict__:
        namespace["_masks"] = cls.__dict__["_masks"]
    return cast(Type[_S], type(cls.__name__, (base,), namespace))


@_struct
class global_route(_Struct):
    """The GRH part of an address vector (ibv_global_route)."""

    dgid: IBA.GID = _new(IBA.GID)
    flow_label: int = 0
    sgid_index: int = 0
    hop_limit: int = 0
    traffic_class: int = 0


@_struct
class ah_attr(_Struct):
    """An address vector (ibv_ah_attr)."""

    grh: global_route = _new(global_route)
    dlid: int = 0
    sl: int = 0
    src_path_bits: int = 0
    static_rate: int = 0
    is_global: int = 0
    port_num: int = 1


@_struct
class qp_cap(_Struct):
    """Queue pair capacities (ibv_qp_cap)."""

    max_send_wr: int = 0
    max_recv_wr: int = 0
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@_struct
class qp_init_attr(_Struct):
    """Queue pair creation attributes (ibv_qp_init_attr), for :meth:`PD.qp_raw`."""

    send_cq: Optional[CQ] = None
    recv_cq: Optional[CQ] = None
    srq: Optional[SRQ] = None
    cap: qp_cap = _new(qp_cap)
    qp_type: int = IBV_QPT_RC
    sq_sig_all: int = 1


@_struct
class srq_init_attr(_Struct):
    """Shared receive queue creation attributes (ibv_srq_init_attr)."""

    max_wr: int = 100
    max_sge: int = 1
    srq_limit: int = 0


# The address vector's class, under a name that qp_attr's field of the same name does not hide.
_AhAttr = ah_attr


@_struct
class qp_attr(_MaskedStruct):
    """QP attributes (ibv_qp_attr). Assigning a member (also through the constructor) sets its bit
    in ``MASK``, so ``qp.modify(attr, attr.MASK)`` applies exactly what was set. ``ah_attr`` may be
    an :class:`ah_attr` or a :class:`ferry.path.IBPath`."""

    qp_state: int = 0
    cur_qp_state: int = 0
    path_mtu: int = 0
    path_mig_state: int = 0
    qkey: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    dest_qp_num: int = 0
    qp_access_flags: int = 0
    cap: qp_cap = _new(qp_cap)
    ah_attr: Union[_AhAttr, _path.IBPath] = _new(_AhAttr)
    alt_ah_attr: Union[_AhAttr, _path.IBPath] = _new(_AhAttr)
    pkey_index: int = 0
    alt_pkey_index: int = 0
    en_sqd_async_notify: int = 0
    sq_draining: int = 0
    max_rd_atomic: int = 0
    max_dest_rd_atomic: int = 0
    min_rnr_timer: int = 0
    port_num: int = 0
    timeout: int = 0
    retry_cnt: int = 0
    rnr_retry: int = 0
    alt_port_num: int = 0
    alt_timeout: int = 0

    # The IBV_QP_* bit of each member, from the extension's list of the ibv_qp_attr members (the
    # one that QP.modify and QP.query read too); the fields above are that list's names, in order.
    _masks = dict(_core.qp_attr_fields)


class srq_attr(NamedTuple):
    """What :meth:`SRQ.query` returns (ibv_srq_attr)."""

    max_wr: int
    max_sge: int
    srq_limit: int


class port_attr(NamedTuple):
    """What :meth:`Context.query_port` returns (ibv_port_attr): the IBV_PORT_* ``state``, MTU codes,
    table lengths, LIDs, IBV_LINK_LAYER_* ``link_layer`` ..."""

    state: int
    max_mtu: int
    active_mtu: int
    gid_tbl_len: int
    port_cap_flags: int
    max_msg_sz: int
    bad_pkey_cntr: int
    qkey_viol_cntr: int
    pkey_tbl_len: int
    lid: int
    sm_lid: int
    lmc: int
    max_vl_num: int
    sm_sl: int
    subnet_timeout: int
    init_type_reply: int
    active_width: int
    active_speed: int
    phys_state: int
    link_layer: int


class device_attr(NamedTuple):
    """What :meth:`Context.query_device` returns (ibv_device_attr): firmware version, GUIDs and
    the device's limits (0 for what ferry's devices do not offer)."""

    fw_ver: str
    node_guid: IBA.GUID
    sys_image_guid: IBA.GUID
    max_mr_size: int
    page_size_cap: int
    vendor_id: int
    vendor_part_id: int
    hw_ver: int
    max_qp: int
    max_qp_wr: int
    device_cap_flags: int
    max_sge: int
    max_sge_rd: int
    max_cq: int
    max_cqe: int
    max_mr: int
    max_pd: int
    max_qp_rd_atom: int
    max_ee_rd_atom: int
    max_res_rd_atom: int
    max_qp_init_rd_atom: int
    max_ee_init_rd_atom: int
    atomic_cap: int
    max_ee: int
    max_rdd: int
    max_mw: int
    max_raw_ipv6_qp: int
    max_raw_ethy_qp: int
    max_mcast_grp: int
    max_mcast_qp_attach: int
    max_total_mcast_qp_attach: int
    max_ah: int
    max_fmr: int
    max_map_per_fmr: int
    max_srq: int
    max_srq_wr: int
    max_srq_sge: int
    max_pkeys: int
    local_ca_ack_delay: int
    phys_port_cnt: int
    max_inline_data: int


class async_event(NamedTuple):
    """What :meth:`Context.get_async_event` returns: the IBV_EVENT_* type and the object it
    concerns (a :class:`CQ`, :class:`QP`, :class:`SRQ`, :class:`ferry.EndPort` or
    :class:`ferry.RDMADevice`; the QP number when that QP is not known here; None for a port
    the device does not have)."""

    event_type: int
    obj: Union[CQ, QP, SRQ, EndPort, RDMADevice, int, None]



# ---------------------------------------------------------------------------------------------
# Errors.


class WRError(_errors.SysError):
    """Raised when an error occurs posting work requests. :attr:`bad_index` is the index into
    the work request list of the one that failed to post; the ones before it were posted."""

    def __init__(self, message: str = "", cause: int = 0, func: Optional[str] = None,
                 bad_index: Optional[int] = None) -> None:
        super().__init__(message, cause, func)
        self.bad_index = bad_index

    def __str__(self) -> str:
        return "%s [work request %s]" % (super().__str__(), self.bad_index)


_WR_ERROR_CLASSES: Dict[int, Type[WRError]] = {}


def _make_wr_error(code: int, message: str, cause: int, func: Optional[str], bad_index: Optional[int]) -> WRError:
    """The WRError for a refused post (also an instance of the class of its status code)."""
    cls = _WR_ERROR_CLASSES.get(code)
    if cls is None:
        base = type(_errors.make_error(code, ""))
        cls = type("WRError" + base.__name__, (WRError, base), {"code": base.code, "__module__": __name__})
        _WR_ERROR_CLASSES[code] = cls
    return cls(message, cause, func, bad_index)


class WCError(_errors.RDMAError, _errors.WorkCompletionError):
    """Raised when a WC is completed with error. It formats the completion and says which QP it
    belongs to when that is known.

    *wc* is the error wc, *msg* an additional descriptive message, *cq* the CQ the error WC was
    received on and *obj* a :class:`SRQ` or :class:`QP` if one is known. *is_rq* is True if the WC
    is known to apply to the receive queue of the QP, False if known to apply to its send queue,
    None if unknown. Attributes: :attr:`wc`, :attr:`cq`, :attr:`qp`, :attr:`srq`, :attr:`is_rq`."""

    is_rq: Optional[bool] = None
    cq: Optional[CQ] = None
    qp: Optional[QP] = None
    srq: Optional[SRQ] = None

    def __init__(self, wc: _core.wc, cq: Optional[CQ] = None, msg: str = "Error work completion",
                 obj: Union[QP, SRQ, None] = None, is_rq: Optional[bool] = None) -> None:
        qp: Optional[QP] = None
        if obj is not None:
            if isinstance(obj, QP):
                qp = obj
            elif isinstance(obj, SRQ):
                qp = obj.pd.from_qp_num(wc.qp_num)
        elif cq is not None:
            try:
                qp = cq.ctx.from_qp_num(wc.qp_num)
            except _errors.Error:
                qp = None
        info = ["op=%s" % wc_opcode_str(wc.opcode),
                "vend=0x%x" % wc.vendor_err, "wr_id=%d" % wc.wr_id, "qp_num=%d" % wc.qp_num]
        if cq is not None:
            self.cq = cq
            info.append(str(cq))
        if qp is not None:
            self.qp = qp
            info.append(str(qp))
            self.srq = qp._srq
        if is_rq is not None:
            self.is_rq = is_rq
            info.append("RQ" if is_rq else "SQ")
        if isinstance(obj, SRQ):
            self.srq = obj
        if self.srq is not None:
            info.append(str(self.srq))
        text = "%s - %d %s (%s)" % (msg, wc.status, wc_status_str(wc.status), " ".join(info))
        super().__init__(text, wc.status)
        self.wc = wc


class AsyncError(_errors.RDMAError):
    """Raised when an asynchronous error event is received. :attr:`event` is the
    :data:`async_event`."""

    def __init__(self, event: async_event, msg: str = "Asynchronous error event") -> None:
        text = "%s - %s for %r" % (msg, IBA.const_str("IBV_EVENT_", event[0], True, _module()), event[1])
        super().__init__(text)
        self.event = event


def _module() -> _types.ModuleType:
    return _sys.modules[__name__]


def _not_supported(func: str, what: str) -> _errors.Error:
    return _errors.make_error(_errors.NotSupported.code, what, 95, func)


# ---------------------------------------------------------------------------------------------
# Paths.


def _ah_attr_from_path(path: _path.IBPath) -> ah_attr:
    """The address vector of an :class:`ferry.path.IBPath` (see the table in the module docs)."""
    if path.end_port is None:
        raise ValueError("the path has no end_port: set path.end_port before using it with verbs")
    has_grh = bool(path.has_grh)
    if has_grh and path.DGID is None:
        raise ValueError("the path has a GRH (has_grh) but no DGID")
    grh = global_route(dgid=IBA.GID(path.DGID) if path.DGID is not None else IBA.GID(),
                       flow_label=path.flow_label,
                       sgid_index=path.SGID_index if (has_grh and path.SGID is not None) else 0,
                       hop_limit=path.hop_limit,
                       traffic_class=path.traffic_class)
    return ah_attr(grh=grh, dlid=path.DLID, sl=path.SL, src_path_bits=path.SLID_bits, static_rate=path.rate,
                   is_global=1 if has_grh else 0, port_num=path.end_port.port_id)


def _checked_ah_attr(attr: ah_attr) -> ah_attr:
    """*attr* with its grh.dgid as an IBA.GID (a GID may be given as text)."""
    grh = attr.grh
    if grh is not None and grh.dgid is not None and not isinstance(grh.dgid, IBA.GID):
        grh = grh.__copy__()
        grh.dgid = IBA.GID(grh.dgid)
        attr = attr.__copy__()
        attr.grh = grh
    return attr


def WCPath(end_port: Union[EndPort, str, None], wc: _core.wc, buf: Optional[Buffer] = None, off: int = 0,
           **kwargs: Any) -> _path.IBPath:
    """Create a :class:`ferry.path.IBPath` from a work completion. *buf* should be the receive
    buffer when this is used with a UD QP: the first 40 bytes of it (from *off*) hold the GRH when
    ``wc.wc_flags`` has :data:`IBV_WC_GRH`. *kwargs* are applied to the path.

    The path describes the received packet (SGID and sqpn are the sender); call
    :meth:`~ferry.path.IBPath.reverse` to get the path of a reply.

    Note: wc.pkey_index is not used; pass ``pkey_index=wc.pkey_index`` if it matters."""
    kwargs.setdefault("sqpn", wc.src_qp)
    kwargs.setdefault("dqpn", wc.qp_num)
    kwargs.setdefault("SLID", wc.slid)
    kwargs.setdefault("SL", wc.sl)
    if end_port is not None:
        kwargs.setdefault("DLID_bits", wc.dlid_path_bits)
    path = _path.IBPath(end_port, **kwargs)
    if wc.wc_flags & IBV_WC_GRH and buf is not None:
        view = memoryview(buf)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if off < 0 or len(view) - off < GRH_BYTES:
            raise ValueError("buf must hold at least 40 bytes (the GRH) from offset %d" % off)
        grh = bytes(view[off:off + GRH_BYTES])
        flow = int.from_bytes(grh[0:4], "big")
        path.has_grh = True
        path.traffic_class = (flow >> 20) & 0xFF
        path.flow_label = flow & 0xFFFFF
        path.hop_limit = grh[7]
        path.SGID = IBA.GID(grh[8:24], raw=True)
        path.DGID = IBA.GID(grh[24:40], raw=True)
    return path


# ---------------------------------------------------------------------------------------------
# Objects.


class Context(_core.Context):
    """Verbs context handle, this is a context manager. Call :func:`ferry.get_verbs` to get an
    instance of this. Closing it frees every resource allocated from it.

    :attr:`node` is the :class:`ferry.RDMADevice`, :attr:`end_port` the :class:`ferry.EndPort`
    it was opened for (None when opened for a whole device)."""

    node: RDMADevice
    end_port: Optional[EndPort]

    def __init__(self, parent: Union[EndPort, RDMADevice, str]) -> None:
        if isinstance(parent, str):
            parent = _path.get_end_port(parent)
        if isinstance(parent, EndPort):
            node, end_port = parent.parent, parent
        elif isinstance(parent, RDMADevice):
            node, end_port = parent, None
        else:
            raise TypeError("expected a ferry.EndPort or ferry.RDMADevice, got %r" % (type(parent).__name__,))
        super().__init__(node.name)
        self.node = node
        self.end_port = end_port
        node._context_opened(self)

    def pd(self) -> PD:
        """Create a new :class:`PD` for this context."""
        return PD(self)

    def cq(self, nelems: int = 100, cc: Optional[CompChannel] = None, vec: int = 0) -> CQ:
        """Create a new :class:`CQ` of at least *nelems* entries, reporting to completion channel
        *cc* (a :class:`CompChannel` or None). *vec* (the completion vector) is accepted and
        unused: ferry's devices have one."""
        return CQ(self, nelems, cc)

    def comp_channel(self) -> CompChannel:
        """Create a new :class:`CompChannel` for this context."""
        return CompChannel(self)

    def query_device(self) -> device_attr:
        """Return a :data:`device_attr` for the device.

        :rtype: :data:`device_attr`"""
        d = self._query_device()
        return device_attr(
            fw_ver=d["fw_ver"], node_guid=IBA.GUID(d["node_guid"]), sys_image_guid=IBA.GUID(d["sys_image_guid"]),
            max_mr_size=d["max_mr_size"], page_size_cap=d["page_size_cap"], vendor_id=d["vendor_id"],
            vendor_part_id=d["vendor_part_id"], hw_ver=d["hw_ver"], max_qp=d["max_qp"], max_qp_wr=d["max_qp_wr"],
            device_cap_flags=d["device_cap_flags"], max_sge=d["max_sge"], max_sge_rd=d["max_sge_rd"],
            max_cq=d["max_cq"], max_cqe=d["max_cqe"], max_mr=d["max_mr"], max_pd=d["max_pd"],
            max_qp_rd_atom=d["max_qp_rd_atom"], max_ee_rd_atom=0, max_res_rd_atom=d["max_qp_rd_atom"] * d["max_qp"],
            max_qp_init_rd_atom=d["max_qp_init_rd_atom"], max_ee_init_rd_atom=0, atomic_cap=d["atomic_cap"],
            max_ee=0, max_rdd=0, max_mw=0, max_raw_ipv6_qp=0, max_raw_ethy_qp=0, max_mcast_grp=0,
            max_mcast_qp_attach=0, max_total_mcast_qp_attach=0, max_ah=d["max_qp"], max_fmr=0, max_map_per_fmr=0,
            max_srq=d["max_srq"], max_srq_wr=d["max_srq_wr"], max_srq_sge=d["max_srq_sge"],
            max_pkeys=d["max_pkeys"], local_ca_ack_delay=d["local_ca_ack_delay"],
            phys_port_cnt=d["phys_port_cnt"], max_inline_data=d["max_inline_data"])

    def query_port(self, port_id: Optional[int] = None) -> port_attr:
        """Return a :data:`port_attr` for *port_id*. If *port_id* is None the end port this
        context was created against is queried (port 1 when opened for a whole device).

        :rtype: :data:`port_attr`"""
        if port_id is None:
            port_id = self.end_port.port_id if self.end_port is not None else 1
        p = self._query_port(port_id)
        subnet_timeout = self.node.end_ports[port_id - 1].subnet_timeout \
            if 0 < port_id <= len(self.node.end_ports) else 0
        return port_attr(
            state=p["state"], max_mtu=p["max_mtu"], active_mtu=p["active_mtu"], gid_tbl_len=p["gid_tbl_len"],
            port_cap_flags=p["port_cap_flags"], max_msg_sz=p["max_msg_sz"], bad_pkey_cntr=0, qkey_viol_cntr=0,
            pkey_tbl_len=p["pkey_tbl_len"], lid=p["lid"], sm_lid=p["sm_lid"], lmc=0, max_vl_num=1, sm_sl=0,
            subnet_timeout=subnet_timeout, init_type_reply=0, active_width=p["active_width"],
            active_speed=p["active_speed"], phys_state=5 if p["state"] == IBV_PORT_ACTIVE else 3,
            link_layer=p["link_layer"])

    def from_qp_num(self, num: int) -> Optional[QP]:
        """Return the :class:`QP` with QP number *num*, or None if there is none."""
        for pd in self._pds():
            qp = pd.from_qp_num(num)
            if qp is not None:
                return qp
        return None

    def get_async_event(self, timeout: Optional[float] = 0) -> Optional[async_event]:
        """Get a single async event for this context: an :data:`async_event` ``(event_type,
        obj)`` where *obj* is the :class:`CQ`, :class:`QP`, :class:`SRQ`,
        :class:`ferry.EndPort` or :class:`ferry.RDMADevice` the event concerns. Waits up to
        *timeout* seconds (0: do not wait, None: until one comes, still interruptible) and returns
        None when none came."""
        raw = self._get_async_event(-1.0 if timeout is None else float(timeout))
        if raw is None:
            return None
        etype, qp_num, cq, srq, port_num = raw
        obj: Union[CQ, QP, SRQ, EndPort, RDMADevice, int, None]
        if etype == IBV_EVENT_DEVICE_FATAL:
            obj = self.node
        elif etype in (IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR, IBV_EVENT_LID_CHANGE, IBV_EVENT_PKEY_CHANGE,
                       IBV_EVENT_SM_CHANGE, IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_GID_CHANGE):
            ports = self.node.end_ports
            obj = ports[port_num - 1] if 0 < port_num <= len(ports) else None
        elif etype in (IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED):
            obj = srq
        elif etype == IBV_EVENT_CQ_ERR:
            obj = cq
        else:
            qp = self.from_qp_num(qp_num)
            obj = qp if qp is not None else qp_num
        return async_event(etype, obj)

    def handle_async_event(self, event: async_event) -> None:
        """A generic handler for async events. Depending on the event it will raise an
        :exc:`AsyncError` (fatal device, QP, CQ and SRQ errors) or reload what the end port caches
        (LID, P_Key, SM and GID changes)."""
        etype = event[0]
        if etype in (IBV_EVENT_DEVICE_FATAL, IBV_EVENT_SRQ_ERR, IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL,
                     IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_PATH_MIG_ERR):
            raise AsyncError(event)
        port = event[1]
        if port is None or not hasattr(port, "lid_change"):
            return
        port = cast("EndPort", port)
        if etype == IBV_EVENT_LID_CHANGE:
            port.lid_change()
        elif etype == IBV_EVENT_PKEY_CHANGE:
            port.pkey_change()
        elif etype in (IBV_EVENT_SM_CHANGE, IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_PORT_ACTIVE,
                       IBV_EVENT_PORT_ERR, IBV_EVENT_GID_CHANGE):
            port.sm_change()

    def register_poll(self, poll: _select.poll) -> None:
        """Add the async event FD of this context to :class:`select.poll` object *poll*."""
        poll.register(self.async_fd, _select.POLLIN)

    def check_poll(self, pevent: Tuple[int, int]) -> bool:
        """Return True if *pevent* (an entry of ``poll.poll()``) indicates that
        :meth:`get_async_event` will return data."""
        return pevent[0] == self.async_fd and bool(pevent[1] & _select.POLLIN)

    def __str__(self) -> str:
        return "context:%s" % (self.node,)

    def __repr__(self) -> str:
        return "Context(%r%s)" % (str(self.node), ", closed" if self.closed else "")


class PD(_core.PD):
    """Protection domain handle, this is a context manager."""

    ctx: Context

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._path_ah = "_cached_pd%x_ah" % id(self)

    def mr(self, buf: object, access: int = 0) -> MR:
        """Create a new :class:`MR` over *buf*, anything supporting the buffer protocol (bytes,
        bytearray, mmap, memoryview, NumPy arrays) or exporting CPU memory through DLPack
        (``__dlpack__``; registered through a zero-copy view that keeps *buf* alive). Write access
        (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC) needs a writable buffer. The MR keeps *buf*
        alive (and, for bytearray, mmap and NumPy, unresizable) until it is closed. A str is
        registered as its UTF-8 bytes, read-only. CUDA memory (a DLPack producer on a CUDA device)
        raises ferry.NotSupported: an MR here is over a host buffer."""
        if isinstance(buf, str):
            if access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC):
                raise TypeError("a str is immutable: register a bytearray for write access")
            buf = buf.encode("utf-8")
        target = _registrable(buf, "PD.mr")
        if isinstance(target, _CudaArrayMemory):
            raise _errors.NotSupported("PD.mr: the %s is memory of CUDA device %d; ferry.verbs registers host "
                                       "buffers only (register CUDA memory through the Endpoint API, the agent "
                                       "or ferry.connect)" % (type(buf).__name__, target.device.index))
        return MR(self, target, access)

    def alloc_mr(self, length: int, access: int = 0) -> MR:
        """Allocate *length* bytes of zero-filled memory and register them: a new :class:`MR`
        whose :attr:`MR.buf` is a :class:`SharedMemory` (a writable buffer; ``np.frombuffer(mr.buf,
        np.uint8)`` and ``torch.frombuffer(mr.buf, dtype=torch.uint8)`` view it without a copy).
        A same-host peer of the software provider maps this memory once and carries out WRITE
        and READ on it as loads and stores, with no system call. The memory lives while the MR or
        any view of it does."""
        return MR(self, alloc_shared(length), access)

    def qp(self, qp_type: int, max_send_wr: int, send_cq: CQ, max_recv_wr: int, recv_cq: CQ,
           srq: Optional[SRQ] = None, sq_sig_all: int = 1, max_send_sge: int = 1, max_recv_sge: int = 1,
           max_inline_data: int = 0) -> QP:
        """Create a new :class:`QP` for this protection domain, with the creation attributes as
        arguments."""
        cap = qp_cap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=max_send_sge,
                     max_recv_sge=max_recv_sge, max_inline_data=max_inline_data)
        return QP(self, qp_init_attr(send_cq=send_cq, recv_cq=recv_cq, srq=srq, cap=cap, qp_type=qp_type,
                                     sq_sig_all=sq_sig_all))

    def qp_raw(self, init: qp_init_attr) -> QP:
        """Create a new :class:`QP` for this protection domain. *init* is a
        :class:`qp_init_attr`."""
        return QP(self, init)

    def srq(self, max_wr: Union[int, srq_init_attr] = 100, max_sge: int = 1) -> SRQ:
        """Create a new :class:`SRQ` for this protection domain (an :class:`srq_init_attr` is
        accepted as *max_wr* too)."""
        if isinstance(max_wr, srq_init_attr):
            return SRQ(self, max_wr.max_wr, max_wr.max_sge, max_wr.srq_limit)
        return SRQ(self, max_wr, max_sge)

    def cq(self, nelems: int = 100, cc: Optional[CompChannel] = None, vec: int = 0) -> CQ:
        """Create a new :class:`CQ` in this PD's context (same as ``pd.ctx.cq``)."""
        return self.ctx.cq(nelems, cc, vec)

    def ah(self, attr: Union[ah_attr, _path.IBPath]) -> AH:
        """Create a new :class:`AH` for this protection domain. *attr* may be an :class:`ah_attr`
        or a :class:`ferry.path.IBPath`. With an IBPath the AH is cached in the path, so asking
        again for the same path returns the same AH;
        :meth:`ferry.path.Path.drop_cache` releases it."""
        if isinstance(attr, _path.IBPath):
            cached: Optional[AH] = attr.__dict__.get(self._path_ah)
            if cached is not None and not cached.closed:
                return cached
            ah = AH(self, _ah_attr_from_path(attr))
            attr.__dict__[self._path_ah] = ah
            return ah
        if not isinstance(attr, ah_attr):
            raise TypeError("attr must be a ferry.verbs.ah_attr or ferry.path.IBPath")
        return AH(self, _checked_ah_attr(attr))

    def from_qp_num(self, num: int) -> Optional[QP]:
        """Return the :class:`QP` of this PD with QP number *num*, or None."""
        for qp in self._qps():
            if qp.qp_num == num:
                return qp
        return None

    def __str__(self) -> str:
        return "pd:%x:%s" % (id(self) & 0xFFFFFFFF, self.ctx.node)

    def __repr__(self) -> str:
        return "PD(%r%s)" % (self.ctx, ", closed" if self.closed else "")


class MR(_core.MR):
    """Memory registration, this is a context manager. :attr:`addr`, :attr:`length`,
    :attr:`lkey`, :attr:`rkey` describe it; :meth:`sge` makes scatter/gather entries over it."""

    pd: PD
    ctx: Context

    def __str__(self) -> str:
        if self.closed:
            return "mr:closed"
        return "mr:0x%x+%u:%s" % (self.addr, self.length, self.pd)

    def __repr__(self) -> str:
        if self.closed:
            return "MR(closed)"
        return "MR(%r,0x%x,%u,lkey=0x%x,rkey=0x%x)" % (self.pd, self.addr, self.length, self.lkey, self.rkey)


class CompChannel(_core.CompChannel):
    """Completion channel, this is a context manager."""

    ctx: Context

    def register_poll(self, poll: _select.poll) -> None:
        """Add the FD of this channel to :class:`select.poll` object *poll*."""
        poll.register(self.fileno(), _select.POLLIN)

    def check_poll(self, pevent: Tuple[int, int]) -> Optional[CQ]:
        """Returns the :class:`CQ` that got at least one completion event, or None. *pevent* is an
        entry of ``poll.poll()``. This takes the event from the channel and counts it in
        ``cq.comp_events``. After this call the CQ must be re-armed with :meth:`CQ.req_notify`."""
        if pevent[0] != self.fileno() or not pevent[1] & _select.POLLIN:
            return None
        cq: Optional[CQ] = self._get_event(0)
        if cq is not None:
            cq.comp_events += 1
        return cq

    def __str__(self) -> str:
        return "comp_channel:%s:%s" % ("closed" if self.closed else self.fileno(), self.ctx.node)

    def __repr__(self) -> str:
        return "CompChannel(%r)" % (self.ctx,)


class CQ(_core.CQ):
    """Completion queue, this is a context manager. :meth:`poll` returns a list of :class:`wc`."""

    ctx: Context
    comp_chan: Optional[CompChannel]

    def __str__(self) -> str:
        return "cq:%x:%s" % (id(self) & 0xFFFFFFFF, self.ctx.node)

    def __repr__(self) -> str:
        return "CQ(%r%s)" % (self.ctx, ", closed" if self.closed else "")


class SRQ(_core.SRQ):
    """Shared receive queue, this is a context manager."""

    pd: PD
    ctx: Context

    def modify(self, srq_limit: Optional[int] = None, max_wr: Optional[int] = None) -> None:
        """Modify the *srq_limit* and *max_wr* values of the SRQ. An argument that is None is not
        changed. Arming *srq_limit* makes an IBV_EVENT_SRQ_LIMIT_REACHED async event fire once
        fewer receives than that remain. ferry's devices cannot resize an SRQ: a *max_wr* other
        than the current one raises :class:`ferry.NotSupported`."""
        if max_wr is not None and max_wr != self.query().max_wr:
            raise _not_supported("ibv_modify_srq", "resizing an SRQ (IBV_SRQ_MAX_WR) is not offered")
        if srq_limit is not None:
            self._arm_limit(srq_limit)

    def query(self) -> srq_attr:
        """Return a :class:`srq_attr`."""
        q = self._query()
        return srq_attr(max_wr=q["max_wr"], max_sge=q["max_sge"], srq_limit=q["srq_limit"])

    def __str__(self) -> str:
        return "srq:%x:%s" % (id(self) & 0xFFFFFFFF, self.pd)

    def __repr__(self) -> str:
        return "SRQ(%r)" % (self.pd,)


class AH(_core.AH):
    """Address handle, this is a context manager."""

    pd: PD
    ctx: Context

    def __str__(self) -> str:
        return "ah:%x" % (id(self) & 0xFFFFFFFF)

    def __repr__(self) -> str:
        return "AH(%r%s)" % (self.pd, ", closed" if self.closed else "")


# Every IBV_QP_* bit: query all attributes.
_QP_QUERY_ALL = _functools.reduce(_operator.or_, qp_attr._masks.values())


class QP(_core.QP):
    """Queue pair, this is a context manager."""

    pd: PD
    ctx: Context
    _send_cq: Optional[CQ]
    _recv_cq: Optional[CQ]
    _srq: Optional[SRQ]

    def __init__(self, pd: PD, init: qp_init_attr) -> None:
        if not isinstance(init, qp_init_attr):
            raise TypeError("init must be a ferry.verbs.qp_init_attr")
        cap = init.cap if init.cap is not None else qp_cap()
        super().__init__(pd, init.qp_type, init.send_cq, init.recv_cq, init.srq, cap.max_send_wr, cap.max_recv_wr,
                         cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data, bool(init.sq_sig_all))

    @property
    def state(self) -> int:
        """The current IBV_QPS_* state."""
        return self._query()["qp_state"]

    def modify(self, attr: qp_attr, mask: int) -> None:
        """ibv_modify_qp: apply the members of *attr* (a :class:`qp_attr`) named by *mask*
        (IBV_QP_* bits; ``attr.MASK`` holds the ones assigned). ``attr.ah_attr`` may be an
        :class:`ah_attr` or a :class:`ferry.path.IBPath`."""
        if not isinstance(attr, qp_attr):
            raise TypeError("attr must be a ferry.verbs.qp_attr")
        if not isinstance(mask, int):
            raise TypeError("mask must be an int")
        if mask & IBV_QP_AV:
            if isinstance(attr.ah_attr, _path.IBPath):
                converted = _ah_attr_from_path(attr.ah_attr)
            elif isinstance(attr.ah_attr, ah_attr):
                converted = _checked_ah_attr(attr.ah_attr)
            else:
                raise TypeError("attr.ah_attr must be a ferry.verbs.ah_attr or ferry.path.IBPath")
            if converted is not attr.ah_attr:
                attr = attr.__copy__()
                object.__setattr__(attr, "ah_attr", converted)
        self._modify(attr, mask)

    def query(self, mask: int = _QP_QUERY_ALL) -> Tuple[qp_attr, qp_init_attr]:
        """Return information about the QP: ``(qp_attr, qp_init_attr)``. *mask* selects which
        fields are wanted (ferry's devices return them all).

        :rtype: tuple(:class:`qp_attr`, :class:`qp_init_attr`)"""
        # The extension reports the members of ibv_qp_attr it holds, under their names.
        q = self._query()
        ah = q["ah_attr"]
        grh = dict(ah["grh"], dgid=IBA.GID(ah["grh"]["dgid"], raw=True))
        ah_value = ah_attr(**dict(ah, grh=global_route(**grh), is_global=int(ah["is_global"])))
        attr = qp_attr(**dict(q, cap=qp_cap(**q["cap"]), ah_attr=ah_value))
        init = qp_init_attr(send_cq=self._send_cq, recv_cq=self._recv_cq, srq=self._srq,
                            cap=qp_cap(**{name: getattr(self, name) for name in qp_cap._names}),
                            qp_type=self.qp_type, sq_sig_all=int(self.sq_sig_all))
        return (attr, init)

    def modify_to_init(self, path: _path.IBPath, qp_access_flags: int = 0) -> None:
        """Modify the QP to the INIT state (P_Key index, port, and the Q_Key for UD or the access
        flags otherwise, from *path*)."""
        if self.qp_type == IBV_QPT_UD:
            if path.qkey is None:
                raise ValueError("path.qkey must be set for a UD QP")
            attr = qp_attr(qp_state=IBV_QPS_INIT, pkey_index=path.pkey_index,
                           port_num=cast("EndPort", path.end_port).port_id, qkey=path.qkey)
        else:
            attr = qp_attr(qp_state=IBV_QPS_INIT, pkey_index=path.pkey_index,
                           port_num=cast("EndPort", path.end_port).port_id, qp_access_flags=qp_access_flags)
        self.modify(attr, attr.MASK)

    def modify_to_rtr(self, path: _path.IBPath) -> None:
        """Modify the QP to the RTR state (for RC: MTU, destination QP number and PSN, responder
        resources, RNR timer and the address vector, from *path*)."""
        if self.qp_type == IBV_QPT_UD:
            attr = qp_attr(qp_state=IBV_QPS_RTR)
        elif self.qp_type == IBV_QPT_UC:
            attr = qp_attr(qp_state=IBV_QPS_RTR, path_mtu=path.MTU, dest_qp_num=path.dqpn, rq_psn=path.dqpsn,
                           ah_attr=path)
        else:
            if path.dqpn is None:
                raise ValueError("path.dqpn (the peer's QP number) must be set for a connected QP")
            attr = qp_attr(qp_state=IBV_QPS_RTR, path_mtu=path.MTU, dest_qp_num=path.dqpn, rq_psn=path.dqpsn,
                           max_dest_rd_atomic=path.drdatomic, min_rnr_timer=path.min_rnr_timer, ah_attr=path)
        self.modify(attr, attr.MASK)

    def modify_to_rts(self, path: _path.IBPath) -> None:
        """Modify the QP to the RTS state (for RC: send PSN, ack timeout, retry counts and
        outstanding READ/atomic depth, from *path*)."""
        if self.qp_type in (IBV_QPT_UD, IBV_QPT_UC):
            attr = qp_attr(qp_state=IBV_QPS_RTS, sq_psn=path.sqpsn)
        else:
            attr = qp_attr(qp_state=IBV_QPS_RTS, timeout=IBA.to_timer(path.qp_timeout), retry_cnt=path.retries,
                           rnr_retry=path.rnr_retries, sq_psn=path.sqpsn, max_rd_atomic=path.srdatomic)
        self.modify(attr, attr.MASK)

    def establish(self, path: _path.IBPath, qp_access_flags: int = 0) -> None:
        """Perform :meth:`modify_to_init`, :meth:`modify_to_rtr` and :meth:`modify_to_rts`. This
        is most useful for UD QPs, which need no external sequencing; for RC the peer must have
        the path too (see :func:`ferry.path.fill_path`)."""
        self.modify_to_init(path, qp_access_flags)
        self.modify_to_rtr(path)
        self.modify_to_rts(path)

    def attach_mcast(self, path: _path.IBPath) -> None:
        """Attach this QP to receive the multicast group described by ``path.DGID`` and
        ``path.DLID`` (a UD QP; the GID is in ff00::/8). On ferry's software devices every QP of
        the host attached to the group, in any process of the same user, receives a send to it
        (an AH for the group's GID, ``remote_qpn`` 0xFFFFFF); the sending QP does not receive its
        own. :class:`ferry.InvalidArgument` for another QP type or a GID that is not multicast."""
        if path.DGID is None:
            raise ValueError("attach_mcast: the path has no DGID (the multicast group)")
        self._attach_mcast(bytes(IBA.GID(path.DGID)), int(path.DLID or 0))

    def detach_mcast(self, path: _path.IBPath) -> None:
        """Detach this QP from the multicast group described by ``path.DGID`` and ``path.DLID``
        (:class:`ferry.InvalidArgument` when it is not attached)."""
        if path.DGID is None:
            raise ValueError("detach_mcast: the path has no DGID (the multicast group)")
        self._detach_mcast(bytes(IBA.GID(path.DGID)), int(path.DLID or 0))

    def __str__(self) -> str:
        return "qp:%u:%s" % (self.qp_num, self.pd)

    def __repr__(self) -> str:
        qp_type = IBA.const_str("IBV_QPT_", self.qp_type, True, _module())
        return "QP(%r,%u,qp_type=%s%s)" % (self.pd, self.qp_num, qp_type, ", closed" if self.closed else "")


__all__ = sorted(name for name in globals() if name.startswith("IBV_")) + [
    "GRH_BYTES", "wc_status_str", "wc_opcode_str", "WeakSet", "sge", "send_wr", "recv_wr", "wc", "global_route",
    "ah_attr", "qp_cap", "qp_init_attr", "srq_init_attr", "qp_attr", "srq_attr", "port_attr", "device_attr",
    "async_event", "WRError", "WCError", "AsyncError", "WCPath", "Context", "PD", "MR", "CompChannel", "CQ",
    "SRQ", "AH", "QP", "SharedMemory", "alloc_shared",
]
