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

import collections as _collections
import select as _select
import weakref as _weakref

from . import IBA
from . import errors as _errors
from . import path as _path
from ._core import verbs as _core
from ._memory import registrable as _registrable

SharedMemory = _core.SharedMemory
alloc_shared = _core.alloc_shared

# ---------------------------------------------------------------------------------------------
# Constants (libibverbs' numbers).

IBV_ACCESS_LOCAL_WRITE = 1
IBV_ACCESS_REMOTE_WRITE = 2
IBV_ACCESS_REMOTE_READ = 4
IBV_ACCESS_REMOTE_ATOMIC = 8
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

IBV_EVENT_CQ_ERR = 0
IBV_EVENT_QP_FATAL = 1
IBV_EVENT_QP_REQ_ERR = 2
IBV_EVENT_QP_ACCESS_ERR = 3
IBV_EVENT_COMM_EST = 4
IBV_EVENT_SQ_DRAINED = 5
IBV_EVENT_PATH_MIG = 6
IBV_EVENT_PATH_MIG_ERR = 7
IBV_EVENT_DEVICE_FATAL = 8
IBV_EVENT_PORT_ACTIVE = 9
IBV_EVENT_PORT_ERR = 10
IBV_EVENT_LID_CHANGE = 11
IBV_EVENT_PKEY_CHANGE = 12
IBV_EVENT_SM_CHANGE = 13
IBV_EVENT_SRQ_ERR = 14
IBV_EVENT_SRQ_LIMIT_REACHED = 15
IBV_EVENT_QP_LAST_WQE_REACHED = 16
IBV_EVENT_CLIENT_REREGISTER = 17
IBV_EVENT_GID_CHANGE = 18

IBV_LINK_LAYER_UNSPECIFIED = 0
IBV_LINK_LAYER_INFINIBAND = 1
IBV_LINK_LAYER_ETHERNET = 2

IBV_MIG_MIGRATED = 0
IBV_MIG_REARM = 1
IBV_MIG_ARMED = 2

IBV_MTU_256 = 1
IBV_MTU_512 = 2
IBV_MTU_1024 = 3
IBV_MTU_2048 = 4
IBV_MTU_4096 = 5

IBV_MW_TYPE_1 = 1
IBV_MW_TYPE_2 = 2

IBV_NODE_UNKNOWN = -1
IBV_NODE_CA = 1
IBV_NODE_SWITCH = 2
IBV_NODE_ROUTER = 3
IBV_NODE_RNIC = 4

IBV_PORT_NOP = 0
IBV_PORT_DOWN = 1
IBV_PORT_INIT = 2
IBV_PORT_ARMED = 3
IBV_PORT_ACTIVE = 4
IBV_PORT_ACTIVE_DEFER = 5

IBV_QP_STATE = 1 << 0
IBV_QP_CUR_STATE = 1 << 1
IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2
IBV_QP_ACCESS_FLAGS = 1 << 3
IBV_QP_PKEY_INDEX = 1 << 4
IBV_QP_PORT = 1 << 5
IBV_QP_QKEY = 1 << 6
IBV_QP_AV = 1 << 7
IBV_QP_PATH_MTU = 1 << 8
IBV_QP_TIMEOUT = 1 << 9
IBV_QP_RETRY_CNT = 1 << 10
IBV_QP_RNR_RETRY = 1 << 11
IBV_QP_RQ_PSN = 1 << 12
IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13
IBV_QP_ALT_PATH = 1 << 14
IBV_QP_MIN_RNR_TIMER = 1 << 15
IBV_QP_SQ_PSN = 1 << 16
IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17
IBV_QP_PATH_MIG_STATE = 1 << 18
IBV_QP_CAP = 1 << 19
IBV_QP_DEST_QPN = 1 << 20

IBV_QPS_RESET = 0
IBV_QPS_INIT = 1
IBV_QPS_RTR = 2
IBV_QPS_RTS = 3
IBV_QPS_SQD = 4
IBV_QPS_SQE = 5
IBV_QPS_ERR = 6

IBV_QPT_RC = 2
IBV_QPT_UC = 3
IBV_QPT_UD = 4

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

IBV_REREG_MR_CHANGE_TRANSLATION = 1
IBV_REREG_MR_CHANGE_PD = 2
IBV_REREG_MR_CHANGE_ACCESS = 4
IBV_REREG_MR_KEEP_VALID = 8

IBV_SEND_FENCE = 1
IBV_SEND_SIGNALED = 2
IBV_SEND_SOLICITED = 4
IBV_SEND_INLINE = 8

IBV_SRQ_MAX_WR = 1
IBV_SRQ_LIMIT = 2

IBV_TRANSPORT_UNKNOWN = -1
IBV_TRANSPORT_IB = 0
IBV_TRANSPORT_IWARP = 1

IBV_WC_GRH = 1
IBV_WC_WITH_IMM = 2

IBV_WC_SEND = 0
IBV_WC_RDMA_WRITE = 1
IBV_WC_RDMA_READ = 2
IBV_WC_COMP_SWAP = 3
IBV_WC_FETCH_ADD = 4
IBV_WC_BIND_MW = 5
IBV_WC_RECV = 128
IBV_WC_RECV_RDMA_WITH_IMM = 129

IBV_WC_SUCCESS = 0
IBV_WC_LOC_LEN_ERR = 1
IBV_WC_LOC_QP_OP_ERR = 2
IBV_WC_LOC_EEC_OP_ERR = 3
IBV_WC_LOC_PROT_ERR = 4
IBV_WC_WR_FLUSH_ERR = 5
IBV_WC_MW_BIND_ERR = 6
IBV_WC_BAD_RESP_ERR = 7
IBV_WC_LOC_ACCESS_ERR = 8
IBV_WC_REM_INV_REQ_ERR = 9
IBV_WC_REM_ACCESS_ERR = 10
IBV_WC_REM_OP_ERR = 11
IBV_WC_RETRY_EXC_ERR = 12
IBV_WC_RNR_RETRY_EXC_ERR = 13
IBV_WC_LOC_RDD_VIOL_ERR = 14
IBV_WC_REM_INV_RD_REQ_ERR = 15
IBV_WC_REM_ABORT_ERR = 16
IBV_WC_INV_EECN_ERR = 17
IBV_WC_INV_EEC_STATE_ERR = 18
IBV_WC_FATAL_ERR = 19
IBV_WC_RESP_TIMEOUT_ERR = 20
IBV_WC_GENERAL_ERR = 21

IBV_WR_RDMA_WRITE = 0
IBV_WR_RDMA_WRITE_WITH_IMM = 1
IBV_WR_SEND = 2
IBV_WR_SEND_WITH_IMM = 3
IBV_WR_RDMA_READ = 4
IBV_WR_ATOMIC_CMP_AND_SWP = 5
IBV_WR_ATOMIC_FETCH_AND_ADD = 6

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


def wc_opcode_str(opcode):
    """The IBV_WC_* name of a :attr:`wc.opcode` value."""
    return _WC_OPCODE_NAMES.get(opcode, "IBV_WC_%d" % opcode)


def wc_status_str(status):
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


class _Struct:
    """Base of the Python verbs structures: fixed fields, keyword (or positional) construction."""

    __slots__ = ()
    _fields = ()   # (name, default or zero-argument factory)
    _names = ()

    def __init__(self, *args, **kwargs):
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

    def _asdict(self):
        return {name: getattr(self, name) for name in self._names}

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._names)

    __hash__ = None

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (n, getattr(self, n)) for n in self._names))

    def __reduce__(self):
        return (type(self), (), None, None, iter(self._asdict().items()))

    def __setitem__(self, name, value):
        # Pickle/copy restore (see __reduce__): state arrives as (name, value) pairs.
        setattr(self, name, value)

    def __copy__(self):
        return type(self)(**self._asdict())


class _MaskedStruct(_Struct):
    """A structure whose assignments also set bits in ``MASK`` (qp_attr: the attribute mask that
    says which members ibv_modify_qp applies)."""

    __slots__ = ()
    _masks = {}

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "MASK", 0)
        super().__init__(*args, **kwargs)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        bit = self._masks.get(name)
        if bit:
            object.__setattr__(self, "MASK", self.MASK | bit)

    def __reduce__(self):
        items = list(self._asdict().items()) + [("MASK", self.MASK)]
        return (type(self), (), None, None, iter(items))

    def __copy__(self):
        other = type(self)(**self._asdict())
        object.__setattr__(other, "MASK", self.MASK)
        return other


def _struct(name, fields, doc, masks=None):
    names = tuple(f[0] for f in fields)
    base = _MaskedStruct if masks is not None else _Struct
    slots = names + (("MASK",) if masks is not None else ())
    namespace = {"__slots__": slots, "_fields": tuple(fields), "_names": names, "__doc__": doc,
                 "__module__": __name__}
    if masks is not None:
        namespace["_masks"] = masks
    return type(name, (base,), namespace)


global_route = _struct("global_route", (
    ("dgid", IBA.GID), ("flow_label", 0), ("sgid_index", 0), ("hop_limit", 0), ("traffic_class", 0)),
    "The GRH part of an address vector (ibv_global_route).")

ah_attr = _struct("ah_attr", (
    ("grh", global_route), ("dlid", 0), ("sl", 0), ("src_path_bits", 0), ("static_rate", 0),
    ("is_global", 0), ("port_num", 1)),
    "An address vector (ibv_ah_attr).")

qp_cap = _struct("qp_cap", (
    ("max_send_wr", 0), ("max_recv_wr", 0), ("max_send_sge", 1), ("max_recv_sge", 1), ("max_inline_data", 0)),
    "Queue pair capacities (ibv_qp_cap).")

qp_init_attr = _struct("qp_init_attr", (
    ("send_cq", None), ("recv_cq", None), ("srq", None), ("cap", qp_cap), ("qp_type", IBV_QPT_RC),
    ("sq_sig_all", 1)),
    "Queue pair creation attributes (ibv_qp_init_attr), for :meth:`PD.qp_raw`.")

srq_init_attr = _struct("srq_init_attr", (("max_wr", 100), ("max_sge", 1), ("srq_limit", 0)),
                        "Shared receive queue creation attributes (ibv_srq_init_attr).")

qp_attr = _struct("qp_attr", (
    ("qp_state", 0), ("cur_qp_state", 0), ("path_mtu", 0), ("path_mig_state", 0), ("qkey", 0),
    ("rq_psn", 0), ("sq_psn", 0), ("dest_qp_num", 0), ("qp_access_flags", 0), ("cap", qp_cap),
    ("ah_attr", ah_attr), ("alt_ah_attr", ah_attr), ("pkey_index", 0), ("alt_pkey_index", 0),
    ("en_sqd_async_notify", 0), ("sq_draining", 0), ("max_rd_atomic", 0), ("max_dest_rd_atomic", 0),
    ("min_rnr_timer", 0), ("port_num", 0), ("timeout", 0), ("retry_cnt", 0), ("rnr_retry", 0),
    ("alt_port_num", 0), ("alt_timeout", 0)),
    """QP attributes (ibv_qp_attr). Assigning a member (also through the constructor) sets its bit
    in ``MASK``, so ``qp.modify(attr, attr.MASK)`` applies exactly what was set. ``ah_attr`` may be
    an :class:`ah_attr` or a :class:`ferry.path.IBPath`.""",
    masks={
        "qp_state": IBV_QP_STATE, "cur_qp_state": IBV_QP_CUR_STATE, "path_mtu": IBV_QP_PATH_MTU,
        "path_mig_state": IBV_QP_PATH_MIG_STATE, "qkey": IBV_QP_QKEY, "rq_psn": IBV_QP_RQ_PSN,
        "sq_psn": IBV_QP_SQ_PSN, "dest_qp_num": IBV_QP_DEST_QPN, "qp_access_flags": IBV_QP_ACCESS_FLAGS,
        "cap": IBV_QP_CAP, "ah_attr": IBV_QP_AV, "alt_ah_attr": IBV_QP_ALT_PATH,
        "pkey_index": IBV_QP_PKEY_INDEX, "alt_pkey_index": IBV_QP_ALT_PATH,
        "en_sqd_async_notify": IBV_QP_EN_SQD_ASYNC_NOTIFY, "max_rd_atomic": IBV_QP_MAX_QP_RD_ATOMIC,
        "max_dest_rd_atomic": IBV_QP_MAX_DEST_RD_ATOMIC, "min_rnr_timer": IBV_QP_MIN_RNR_TIMER,
        "port_num": IBV_QP_PORT, "timeout": IBV_QP_TIMEOUT, "retry_cnt": IBV_QP_RETRY_CNT,
        "rnr_retry": IBV_QP_RNR_RETRY, "alt_port_num": IBV_QP_ALT_PATH, "alt_timeout": IBV_QP_ALT_PATH,
    })

srq_attr = _collections.namedtuple("srq_attr", "max_wr max_sge srq_limit")

port_attr = _collections.namedtuple("port_attr", (
    "state max_mtu active_mtu gid_tbl_len port_cap_flags max_msg_sz bad_pkey_cntr qkey_viol_cntr "
    "pkey_tbl_len lid sm_lid lmc max_vl_num sm_sl subnet_timeout init_type_reply active_width "
    "active_speed phys_state link_layer"))

device_attr = _collections.namedtuple("device_attr", (
    "fw_ver node_guid sys_image_guid max_mr_size page_size_cap vendor_id vendor_part_id hw_ver "
    "max_qp max_qp_wr device_cap_flags max_sge max_sge_rd max_cq max_cqe max_mr max_pd "
    "max_qp_rd_atom max_ee_rd_atom max_res_rd_atom max_qp_init_rd_atom max_ee_init_rd_atom "
    "atomic_cap max_ee max_rdd max_mw max_raw_ipv6_qp max_raw_ethy_qp max_mcast_grp "
    "max_mcast_qp_attach max_total_mcast_qp_attach max_ah max_fmr max_map_per_fmr max_srq "
    "max_srq_wr max_srq_sge max_pkeys local_ca_ack_delay phys_port_cnt max_inline_data"))

#: What :meth:`Context.get_async_event` returns: the IBV_EVENT_* type and the object it concerns
#: (a :class:`CQ`, :class:`QP`, :class:`SRQ`, :class:`ferry.EndPort` or :class:`ferry.RDMADevice`).
async_event = _collections.namedtuple("async_event", "event_type obj")

# ACK delay of ferry's software devices, as an IBA timer code (4.096 us * 2**code = 4 ms): the
# progress thread acknowledges well within it. The C++ DeviceAttr has no such field yet.
_SOFT_LOCAL_CA_ACK_DELAY = 10

# ---------------------------------------------------------------------------------------------
# Errors.


class WRError(_errors.SysError):
    """Raised when an error occurs posting work requests. :attr:`bad_index` is the index into
    the work request list of the one that failed to post; the ones before it were posted."""

    def __init__(self, message="", cause=0, func=None, bad_index=None):
        super().__init__(message, cause, func)
        self.bad_index = bad_index

    def __str__(self):
        return "%s [work request %s]" % (super().__str__(), self.bad_index)


_WR_ERROR_CLASSES = {}


def _make_wr_error(code, message, cause, func, bad_index):
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

    is_rq = None
    cq = None
    qp = None
    srq = None

    def __init__(self, wc, cq=None, msg="Error work completion", obj=None, is_rq=None):
        qp = None
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

    def __init__(self, event, msg="Asynchronous error event"):
        text = "%s - %s for %r" % (msg, IBA.const_str("IBV_EVENT_", event[0], True, _module()), event[1])
        super().__init__(text)
        self.event = event


def _module():
    import sys
    return sys.modules[__name__]


def _not_supported(func, what):
    return _errors.make_error(_errors.NotSupported.code, what, 95, func)


# ---------------------------------------------------------------------------------------------
# Paths.


def _ah_attr_from_path(path):
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


def _checked_ah_attr(attr):
    """*attr* with its grh.dgid as an IBA.GID (a GID may be given as text)."""
    grh = attr.grh
    if grh is not None and grh.dgid is not None and not isinstance(grh.dgid, IBA.GID):
        grh = grh.__copy__()
        grh.dgid = IBA.GID(grh.dgid)
        attr = attr.__copy__()
        attr.grh = grh
    return attr


def WCPath(end_port, wc, buf=None, off=0, **kwargs):
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

    def __init__(self, parent):
        from . import rdma
        if isinstance(parent, str):
            parent = rdma.get_end_port(parent)
        if isinstance(parent, rdma.EndPort):
            node, end_port = parent.parent, parent
        elif isinstance(parent, rdma.RDMADevice):
            node, end_port = parent, None
        else:
            raise TypeError("expected a ferry.EndPort or ferry.RDMADevice, got %r" % (type(parent).__name__,))
        super().__init__(node.name)
        self.node = node
        self.end_port = end_port
        node._context_opened(self)

    def pd(self):
        """Create a new :class:`PD` for this context."""
        return PD(self)

    def cq(self, nelems=100, cc=None, vec=0):
        """Create a new :class:`CQ` of at least *nelems* entries, reporting to completion channel
        *cc* (a :class:`CompChannel` or None). *vec* (the completion vector) is accepted and
        unused: ferry's devices have one."""
        return CQ(self, nelems, cc)

    def comp_channel(self):
        """Create a new :class:`CompChannel` for this context."""
        return CompChannel(self)

    def query_device(self):
        """Return a :data:`device_attr` for the device.

        :rtype: :data:`device_attr`"""
        d = self._query_device()
        soft = self.node.provider == "soft"
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
            max_pkeys=d["max_pkeys"], local_ca_ack_delay=_SOFT_LOCAL_CA_ACK_DELAY if soft else 16,
            phys_port_cnt=d["phys_port_cnt"], max_inline_data=d["max_inline_data"])

    def query_port(self, port_id=None):
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

    def from_qp_num(self, num):
        """Return the :class:`QP` with QP number *num*, or None if there is none."""
        for pd in self._pds():
            qp = pd.from_qp_num(num)
            if qp is not None:
                return qp
        return None

    def get_async_event(self, timeout=0):
        """Get a single async event for this context: an :data:`async_event` ``(event_type,
        obj)`` where *obj* is the :class:`CQ`, :class:`QP`, :class:`SRQ`,
        :class:`ferry.EndPort` or :class:`ferry.RDMADevice` the event concerns. Waits up to
        *timeout* seconds (0: do not wait, None: until one comes, still interruptible) and returns
        None when none came."""
        raw = self._get_async_event(-1.0 if timeout is None else float(timeout))
        if raw is None:
            return None
        etype, qp_num, cq, srq, port_num = raw
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
            obj = self.from_qp_num(qp_num)
            if obj is None:
                obj = qp_num
        return async_event(etype, obj)

    def handle_async_event(self, event):
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
        if etype == IBV_EVENT_LID_CHANGE:
            port.lid_change()
        elif etype == IBV_EVENT_PKEY_CHANGE:
            port.pkey_change()
        elif etype in (IBV_EVENT_SM_CHANGE, IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_PORT_ACTIVE,
                       IBV_EVENT_PORT_ERR, IBV_EVENT_GID_CHANGE):
            port.sm_change()

    def register_poll(self, poll):
        """Add the async event FD of this context to :class:`select.poll` object *poll*."""
        poll.register(self.async_fd, _select.POLLIN)

    def check_poll(self, pevent):
        """Return True if *pevent* (an entry of ``poll.poll()``) indicates that
        :meth:`get_async_event` will return data."""
        return pevent[0] == self.async_fd and bool(pevent[1] & _select.POLLIN)

    def __str__(self):
        return "context:%s" % (self.node,)

    def __repr__(self):
        return "Context(%r%s)" % (str(self.node), ", closed" if self.closed else "")


class PD(_core.PD):
    """Protection domain handle, this is a context manager."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self._path_ah = "_cached_pd%x_ah" % id(self)

    def mr(self, buf, access=0):
        """Create a new :class:`MR` over *buf*, anything supporting the buffer protocol (bytes,
        bytearray, mmap, memoryview, NumPy arrays) or exporting CPU memory through DLPack
        (``__dlpack__``; registered through a zero-copy view that keeps *buf* alive). Write access
        (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC) needs a writable buffer. The MR keeps *buf*
        alive (and, for bytearray, mmap and NumPy, unresizable) until it is closed. A str is
        registered as its UTF-8 bytes, read-only."""
        if isinstance(buf, str):
            if access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC):
                raise TypeError("a str is immutable: register a bytearray for write access")
            buf = buf.encode("utf-8")
        buf = _registrable(buf, "PD.mr")
        return MR(self, buf, access)

    def alloc_mr(self, length, access=0):
        """Allocate *length* bytes of zero-filled memory and register them: a new :class:`MR`
        whose :attr:`MR.buf` is a :class:`SharedMemory` (a writable buffer; ``np.frombuffer(mr.buf,
        np.uint8)`` and ``torch.frombuffer(mr.buf, dtype=torch.uint8)`` view it without a copy).
        A same-host peer of the software provider maps this memory once and carries out WRITE
        and READ on it as loads and stores, with no system call. The memory lives while the MR or
        any view of it does."""
        return MR(self, alloc_shared(length), access)

    def qp(self, qp_type, max_send_wr, send_cq, max_recv_wr, recv_cq, srq=None, sq_sig_all=1, max_send_sge=1,
           max_recv_sge=1, max_inline_data=0):
        """Create a new :class:`QP` for this protection domain, with the creation attributes as
        arguments."""
        cap = qp_cap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=max_send_sge,
                     max_recv_sge=max_recv_sge, max_inline_data=max_inline_data)
        return QP(self, qp_init_attr(send_cq=send_cq, recv_cq=recv_cq, srq=srq, cap=cap, qp_type=qp_type,
                                     sq_sig_all=sq_sig_all))

    def qp_raw(self, init):
        """Create a new :class:`QP` for this protection domain. *init* is a
        :class:`qp_init_attr`."""
        return QP(self, init)

    def srq(self, max_wr=100, max_sge=1):
        """Create a new :class:`SRQ` for this protection domain (an :class:`srq_init_attr` is
        accepted as *max_wr* too)."""
        if isinstance(max_wr, srq_init_attr):
            return SRQ(self, max_wr.max_wr, max_wr.max_sge, max_wr.srq_limit)
        return SRQ(self, max_wr, max_sge)

    def cq(self, nelems=100, cc=None, vec=0):
        """Create a new :class:`CQ` in this PD's context (same as ``pd.ctx.cq``)."""
        return self.ctx.cq(nelems, cc, vec)

    def ah(self, attr):
        """Create a new :class:`AH` for this protection domain. *attr* may be an :class:`ah_attr`
        or a :class:`ferry.path.IBPath`. With an IBPath the AH is cached in the path, so asking
        again for the same path returns the same AH;
        :meth:`ferry.path.Path.drop_cache` releases it."""
        if isinstance(attr, _path.IBPath):
            cached = attr.__dict__.get(self._path_ah)
            if cached is not None and not cached.closed:
                return cached
            ah = AH(self, _ah_attr_from_path(attr))
            attr.__dict__[self._path_ah] = ah
            return ah
        if not isinstance(attr, ah_attr):
            raise TypeError("attr must be a ferry.verbs.ah_attr or ferry.path.IBPath")
        return AH(self, _checked_ah_attr(attr))

    def from_qp_num(self, num):
        """Return the :class:`QP` of this PD with QP number *num*, or None."""
        for qp in self._qps():
            if qp.qp_num == num:
                return qp
        return None

    def __str__(self):
        return "pd:%x:%s" % (id(self) & 0xFFFFFFFF, self.ctx.node)

    def __repr__(self):
        return "PD(%r%s)" % (self.ctx, ", closed" if self.closed else "")


class MR(_core.MR):
    """Memory registration, this is a context manager. :attr:`addr`, :attr:`length`,
    :attr:`lkey`, :attr:`rkey` describe it; :meth:`sge` makes scatter/gather entries over it."""

    def __str__(self):
        if self.closed:
            return "mr:closed"
        return "mr:0x%x+%u:%s" % (self.addr, self.length, self.pd)

    def __repr__(self):
        if self.closed:
            return "MR(closed)"
        return "MR(%r,0x%x,%u,lkey=0x%x,rkey=0x%x)" % (self.pd, self.addr, self.length, self.lkey, self.rkey)


class CompChannel(_core.CompChannel):
    """Completion channel, this is a context manager."""

    def register_poll(self, poll):
        """Add the FD of this channel to :class:`select.poll` object *poll*."""
        poll.register(self.fileno(), _select.POLLIN)

    def check_poll(self, pevent):
        """Returns the :class:`CQ` that got at least one completion event, or None. *pevent* is an
        entry of ``poll.poll()``. This takes the event from the channel and counts it in
        ``cq.comp_events``. After this call the CQ must be re-armed with :meth:`CQ.req_notify`."""
        if pevent[0] != self.fileno() or not pevent[1] & _select.POLLIN:
            return None
        cq = self._get_event(0)
        if cq is not None:
            cq.comp_events += 1
        return cq

    def __str__(self):
        return "comp_channel:%s:%s" % ("closed" if self.closed else self.fileno(), self.ctx.node)

    def __repr__(self):
        return "CompChannel(%r)" % (self.ctx,)


class CQ(_core.CQ):
    """Completion queue, this is a context manager. :meth:`poll` returns a list of :class:`wc`."""

    def __str__(self):
        return "cq:%x:%s" % (id(self) & 0xFFFFFFFF, self.ctx.node)

    def __repr__(self):
        return "CQ(%r%s)" % (self.ctx, ", closed" if self.closed else "")


class SRQ(_core.SRQ):
    """Shared receive queue, this is a context manager."""

    def modify(self, srq_limit=None, max_wr=None):
        """Modify the *srq_limit* and *max_wr* values of the SRQ. An argument that is None is not
        changed. Arming *srq_limit* makes an IBV_EVENT_SRQ_LIMIT_REACHED async event fire once
        fewer receives than that remain. ferry's devices cannot resize an SRQ: a *max_wr* other
        than the current one raises :class:`ferry.NotSupported`."""
        if max_wr is not None and max_wr != self.query().max_wr:
            raise _not_supported("ibv_modify_srq", "resizing an SRQ (IBV_SRQ_MAX_WR) is not offered")
        if srq_limit is not None:
            self._arm_limit(srq_limit)

    def query(self):
        """Return a :data:`srq_attr`."""
        q = self._query()
        return srq_attr(max_wr=q["max_wr"], max_sge=q["max_sge"], srq_limit=q["srq_limit"])

    def __str__(self):
        return "srq:%x:%s" % (id(self) & 0xFFFFFFFF, self.pd)

    def __repr__(self):
        return "SRQ(%r)" % (self.pd,)


class AH(_core.AH):
    """Address handle, this is a context manager."""

    def __str__(self):
        return "ah:%x" % (id(self) & 0xFFFFFFFF)

    def __repr__(self):
        return "AH(%r%s)" % (self.pd, ", closed" if self.closed else "")


_QP_QUERY_ALL = (1 << 21) - 1


class QP(_core.QP):
    """Queue pair, this is a context manager."""

    def __init__(self, pd, init):
        if not isinstance(init, qp_init_attr):
            raise TypeError("init must be a ferry.verbs.qp_init_attr")
        cap = init.cap if init.cap is not None else qp_cap()
        super().__init__(pd, init.qp_type, init.send_cq, init.recv_cq, init.srq, cap.max_send_wr, cap.max_recv_wr,
                         cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data, bool(init.sq_sig_all))

    @property
    def state(self):
        """The current IBV_QPS_* state."""
        return self._query()["qp_state"]

    def modify(self, attr, mask):
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

    def query(self, mask=_QP_QUERY_ALL):
        """Return information about the QP: ``(qp_attr, qp_init_attr)``. *mask* selects which
        fields are wanted (ferry's devices return them all).

        :rtype: tuple(:class:`qp_attr`, :class:`qp_init_attr`)"""
        q = self._query()
        ah = q["ah_attr"]
        grh = ah["grh"]

        def make_ah(d, g):
            return ah_attr(grh=global_route(dgid=IBA.GID(g["dgid"], raw=True), flow_label=g["flow_label"],
                                            sgid_index=g["sgid_index"], hop_limit=g["hop_limit"],
                                            traffic_class=g["traffic_class"]),
                           dlid=d["dlid"], sl=d["sl"], src_path_bits=d["src_path_bits"],
                           static_rate=d["static_rate"], is_global=int(d["is_global"]), port_num=d["port_num"])

        attr = qp_attr(qp_state=q["qp_state"], cur_qp_state=q["cur_qp_state"], path_mtu=q["path_mtu"],
                       qkey=q["qkey"], rq_psn=q["rq_psn"], sq_psn=q["sq_psn"], dest_qp_num=q["dest_qp_num"],
                       qp_access_flags=q["qp_access_flags"], cap=qp_cap(**q["cap"]), ah_attr=make_ah(ah, grh),
                       pkey_index=q["pkey_index"], sq_draining=int(q["sq_draining"]),
                       max_rd_atomic=q["max_rd_atomic"], max_dest_rd_atomic=q["max_dest_rd_atomic"],
                       min_rnr_timer=q["min_rnr_timer"], port_num=q["port_num"], timeout=q["timeout"],
                       retry_cnt=q["retry_cnt"], rnr_retry=q["rnr_retry"])
        init = qp_init_attr(send_cq=self._send_cq, recv_cq=self._recv_cq, srq=self._srq,
                            cap=qp_cap(max_send_wr=self.max_send_wr, max_recv_wr=self.max_recv_wr,
                                       max_send_sge=self.max_send_sge, max_recv_sge=self.max_recv_sge,
                                       max_inline_data=self.max_inline_data),
                            qp_type=self.qp_type, sq_sig_all=int(self.sq_sig_all))
        return (attr, init)

    def modify_to_init(self, path, qp_access_flags=0):
        """Modify the QP to the INIT state (P_Key index, port, and the Q_Key for UD or the access
        flags otherwise, from *path*)."""
        if self.qp_type == IBV_QPT_UD:
            if path.qkey is None:
                raise ValueError("path.qkey must be set for a UD QP")
            attr = qp_attr(qp_state=IBV_QPS_INIT, pkey_index=path.pkey_index, port_num=path.end_port.port_id,
                           qkey=path.qkey)
        else:
            attr = qp_attr(qp_state=IBV_QPS_INIT, pkey_index=path.pkey_index, port_num=path.end_port.port_id,
                           qp_access_flags=qp_access_flags)
        self.modify(attr, attr.MASK)

    def modify_to_rtr(self, path):
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

    def modify_to_rts(self, path):
        """Modify the QP to the RTS state (for RC: send PSN, ack timeout, retry counts and
        outstanding READ/atomic depth, from *path*)."""
        if self.qp_type in (IBV_QPT_UD, IBV_QPT_UC):
            attr = qp_attr(qp_state=IBV_QPS_RTS, sq_psn=path.sqpsn)
        else:
            attr = qp_attr(qp_state=IBV_QPS_RTS, timeout=IBA.to_timer(path.qp_timeout), retry_cnt=path.retries,
                           rnr_retry=path.rnr_retries, sq_psn=path.sqpsn, max_rd_atomic=path.srdatomic)
        self.modify(attr, attr.MASK)

    def establish(self, path, qp_access_flags=0):
        """Perform :meth:`modify_to_init`, :meth:`modify_to_rtr` and :meth:`modify_to_rts`. This
        is most useful for UD QPs, which need no external sequencing; for RC the peer must have
        the path too (see :func:`ferry.path.fill_path`)."""
        self.modify_to_init(path, qp_access_flags)
        self.modify_to_rtr(path)
        self.modify_to_rts(path)

    def attach_mcast(self, path):
        """Attach this QP to receive the multicast group described by ``path.DGID`` and
        ``path.DLID`` (a UD QP; the GID is in ff00::/8). On ferry's software devices every QP of
        the host attached to the group, in any process of the same user, receives a send to it
        (an AH for the group's GID, ``remote_qpn`` 0xFFFFFF); the sending QP does not receive its
        own. :class:`ferry.InvalidArgument` for another QP type or a GID that is not multicast."""
        if path.DGID is None:
            raise ValueError("attach_mcast: the path has no DGID (the multicast group)")
        self._attach_mcast(bytes(IBA.GID(path.DGID)), int(path.DLID or 0))

    def detach_mcast(self, path):
        """Detach this QP from the multicast group described by ``path.DGID`` and ``path.DLID``
        (:class:`ferry.InvalidArgument` when it is not attached)."""
        if path.DGID is None:
            raise ValueError("detach_mcast: the path has no DGID (the multicast group)")
        self._detach_mcast(bytes(IBA.GID(path.DGID)), int(path.DLID or 0))

    def __str__(self):
        return "qp:%u:%s" % (self.qp_num, self.pd)

    def __repr__(self):
        qp_type = IBA.const_str("IBV_QPT_", self.qp_type, True, _module())
        return "QP(%r,%u,qp_type=%s%s)" % (self.pd, self.qp_num, qp_type, ", closed" if self.closed else "")


__all__ = sorted(name for name in globals() if name.startswith("IBV_")) + [
    "GRH_BYTES", "wc_status_str", "wc_opcode_str", "WeakSet", "sge", "send_wr", "recv_wr", "wc", "global_route",
    "ah_attr", "qp_cap", "qp_init_attr", "srq_init_attr", "qp_attr", "srq_attr", "port_attr", "device_attr",
    "async_event", "WRError", "WCError", "AsyncError", "WCPath", "Context", "PD", "MR", "CompChannel", "CQ",
    "SRQ", "AH", "QP", "SharedMemory", "alloc_shared",
]
