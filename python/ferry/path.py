"""ferry.path: paths between end ports (the `rdma.path` module of the verbs specification).

An :class:`IBPath` holds everything a queue pair needs to reach its peer: addresses (GIDs, LIDs),
QP numbers and PSNs of both sides, Q_Key and P_Key, MTU, timers and retry counts. The convention
is that of the wire: a path for sending from here has :attr:`~IBPath.SGID` = this end and
:attr:`~IBPath.DGID` = the peer; :meth:`~IBPath.reverse` turns one into the other.

ferry has no subnet administrator: :func:`resolve_path` completes a path locally from what the end
port knows (its MTU, rate, P_Keys, GIDs, the GRH for RoCE-style GIDs) and checks it.

The devices and their end ports (:class:`ferry.RDMADevice`, :class:`ferry.EndPort`, the lookups
:func:`ferry.get_end_port` ...) are defined here too, because a path and its end port name each
other; use them from :mod:`ferry` or :mod:`ferry.rdma`.

A path travels between processes with :meth:`IBPath.to_json` / :meth:`IBPath.from_json`, a
strict, versioned text encoding that is safe to read from an untrusted peer. :meth:`IBPath.__reduce__`
exists (the specification's examples pickle paths), but never unpickle data you did not produce.
"""

from __future__ import annotations

import json as _json
import secrets as _secrets
import threading as _threading
import weakref as _weakref
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Mapping, Optional, Tuple, TypeVar, Union, cast

from . import IBA
from . import errors as _errors
from ._core import verbs as _core

if TYPE_CHECKING:
    # For annotations only: fill_path() and LocalPathResolver call the QP and the context they are
    # given. ferry.verbs is built on this module, not the other way round.
    from .verbs import QP, Context

_PathT = TypeVar("_PathT", bound="Path")

__all__ = [
    "Path", "IBPath", "SAPathNotFoundError", "LocalPathResolver", "fill_path", "resolve_path", "get_mad_path",
]

# Default packet lifetime (IBA timer code, 4.096 us * 2**14 = 67 ms) of ferry's end ports, which
# have no subnet manager to report a subnet timeout.
DEFAULT_SUBNET_TIMEOUT = 14

# Longest path text from_json() reads; a path is a few hundred bytes.
_MAX_JSON_CHARS = 64 * 1024


# ---------------------------------------------------------------------------------------------
# Devices and end ports. They live in this module, next to the paths, because each names the
# other: an end port's sa_path is an IBPath, and a path given an end port's name looks it up.
# ferry.rdma (and so ferry) exports them.

class DeviceNotFoundError(_errors.RDMAError, _errors.NotFound):
    """No device or end port of that name."""


class RDMADevice:
    """One verbs device (for ferry's software devices: one per IP interface, ``soft_lo`` ...).

    :attr:`name`, :attr:`provider` ("soft", "ibverbs"), :attr:`transport`, :attr:`netdev`,
    :attr:`address` (its IP address), :attr:`node_guid`, :attr:`numa_node`, and
    :attr:`end_ports`, a list of :class:`EndPort` (index 0 is port 1).

    :attr:`addressed_by_context` says how peers reach it: True for ferry's software devices, where
    each verbs context is reached at :attr:`address` and a port of its own and has one GID (index
    0, that address IPv4-mapped), so LIDs and the GID table mean nothing; False for a NIC, whose
    ports are addressed by their GID tables and LIDs."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self.name: str = info["name"]
        self.provider: str = info["provider"]
        self.transport: str = info["transport"]
        self.netdev: str = info["netdev"]
        self.address: str = info["address"]
        self.node_guid = IBA.GUID(info["guid"])
        self.numa_node: int = info["numa_node"]
        self.addressed_by_context: bool = info["addressed_by_context"]
        self._ports: int = info["ports"]  # 0: ask a context
        self._contexts: List[_weakref.ref[_core.Context]] = []
        self._lock = _threading.Lock()
        self._end_ports: Optional[List[EndPort]] = None

    @property
    def end_ports(self) -> List[EndPort]:
        """The device's ports, as :class:`EndPort` objects (index 0 is port 1). A software device
        has one; another device is asked once, through a verbs context opened for the query."""
        if self._end_ports is None:
            count = self._ports
            if count == 0:
                with _TemporaryContext(self.name) as ctx:
                    count = ctx._query_device()["phys_port_cnt"]
            self._end_ports = [EndPort(self, i + 1) for i in range(count)]
        return self._end_ports

    def _context_opened(self, ctx: _core.Context) -> None:
        with self._lock:
            self._contexts = [w for w in self._contexts if _live(w) is not None]
            self._contexts.append(_weakref.ref(ctx))

    def _live_context(self) -> Optional[_core.Context]:
        """The most recently opened verbs context of this device that is still open, or None."""
        with self._lock:
            for ref in reversed(self._contexts):
                ctx = ref()
                if ctx is not None and not ctx.closed:
                    return ctx
        return None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return "RDMADevice(%r, provider=%r, address=%r)" % (self.name, self.provider, self.address)


def _live(ref: _weakref.ref[_core.Context]) -> Optional[_core.Context]:
    """The context ``ref`` holds while it is open, else None."""
    ctx = ref()
    return ctx if ctx is not None and not ctx.closed else None


class _TemporaryContext:
    """A verbs context opened only to query the device, closed on exit."""

    def __init__(self, name: str) -> None:
        self._ctx = _core.Context(name)

    def __enter__(self) -> _core.Context:
        return self._ctx

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self._ctx.close()
        return False


class EndPort:
    """One port of an :class:`RDMADevice`: :attr:`parent` is the device, :attr:`port_id` the
    port number (from 1). Port attributes are read from a verbs context of the device (an open one,
    else one opened for the query) and cached until an async event says they changed.

    On ferry's software devices a GID names one verbs context (the device's IPv4 address and that
    context's port): :attr:`default_gid` is the GID of the most recently opened context of the
    device that is still open."""

    #: Packet lifetime (IBA timer code) used for paths that do not set one. ferry's devices have no
    #: subnet manager, so this is ferry's default rather than a value read from the port.
    subnet_timeout: int = DEFAULT_SUBNET_TIMEOUT

    def __init__(self, parent: RDMADevice, port_id: int) -> None:
        self.parent = parent
        self.port_id = port_id
        self._cached_attr: Optional[dict] = None

    def _port_attr(self) -> dict:
        if self._cached_attr is None:
            ctx = self.parent._live_context()
            if ctx is not None:
                self._cached_attr = ctx._query_port(self.port_id)
            else:
                with _TemporaryContext(self.parent.name) as tmp:
                    self._cached_attr = tmp._query_port(self.port_id)
        return self._cached_attr

    @property
    def default_gid(self) -> IBA.GID:
        """The GID paths from this port use by default: index 0, or the one the device prefers
        (a RoCE v2 GID on RoCE ports). See the class note for software devices. Raises
        :class:`ferry.RDMAError` when no verbs context of the device is open (open one with
        :func:`ferry.get_verbs`)."""
        ctx = self.parent._live_context()
        if ctx is None:
            raise _errors.RDMAError(
                "no verbs context is open on %s: on this device a GID names a context, open one with "
                "ferry.get_verbs() first" % self)
        return IBA.GID(ctx.query_gid(self.port_id, ctx._default_gid_index(self.port_id)), raw=True)

    @property
    def gids(self) -> List[IBA.GID]:
        """The GID table of this port (of the most recent open context, for software devices)."""
        ctx = self.parent._live_context()
        if ctx is None:
            return []
        count = max(1, min(self._port_attr()["gid_tbl_len"], 256))
        return [IBA.GID(ctx.query_gid(self.port_id, i), raw=True) for i in range(count)]

    def _gid_index(self, gid: IBA.GIDLike) -> Optional[int]:
        """The GID table index of *gid* at this port, or None if it is not one of the port's."""
        gid = IBA.GID(gid)
        if self.parent.addressed_by_context:
            # Every context of such a device has one GID (index 0), holding the device's IPv4
            # address; any context of this device may be the source.
            raw = bytes(gid)
            if _is_soft_gid(gid) and ".".join(str(b) for b in raw[12:16]) == self.parent.address:
                return 0
            return None
        gids = self.gids
        return gids.index(gid) if gid in gids else None

    @property
    def pkeys(self) -> List[int]:
        """The P_Key table (ferry's devices have the default P_Key only)."""
        return [IBA.PKEY_DEFAULT] * max(1, self._port_attr()["pkey_tbl_len"])

    @property
    def lid(self) -> int:
        """The port's LID (0 on RoCE-style and software devices, which route by GID)."""
        return self._port_attr()["lid"]

    @property
    def lmc(self) -> int:
        """The LID mask control: 0 (one LID per port)."""
        return 0

    @property
    def sm_lid(self) -> int:
        """The subnet manager's LID (the port's own on ferry's devices, which have none)."""
        return self._port_attr()["sm_lid"]

    @property
    def sm_sl(self) -> int:
        """The service level to reach the subnet manager: 0."""
        return 0

    @property
    def sa_path(self) -> IBPath:
        """The path to this port's subnet administrator: QP1 at the subnet manager's LID
        (:attr:`sm_lid`, :attr:`sm_sl`) with the GSI Q_Key and the default P_Key, a new
        :class:`ferry.path.IBPath` on each access (change it freely). ferry's devices have no
        subnet manager: :func:`ferry.path.resolve_path` answers path queries locally, and the SA
        path names this port itself (its SM LID is the port's own LID, 0 on RoCE-style and software
        devices)."""
        return IBPath(self, SLID=self.lid, DLID=self.sm_lid, SL=self.sm_sl, sqpn=1, dqpn=1,
                           qkey=IBA.IB_DEFAULT_QP1_QKEY, pkey=IBA.PKEY_DEFAULT)

    @property
    def state(self) -> int:
        """The IBV_PORT_* state."""
        return self._port_attr()["state"]

    @property
    def mtu(self) -> int:
        """The active MTU code (IBA.MTU_*)."""
        return self._port_attr()["active_mtu"]

    @property
    def link_layer(self) -> int:
        """IBV_LINK_LAYER_*: 2 (Ethernet) for RoCE-style ports and ferry's software devices."""
        return self._port_attr()["link_layer"]

    @property
    def rate(self) -> int:
        """The static rate to use on paths from this port (0: the port's full rate)."""
        return 0

    def lid_change(self) -> None:
        """Forget cached port attributes (called on IBV_EVENT_LID_CHANGE)."""
        self._cached_attr = None

    def pkey_change(self) -> None:
        """Forget cached port attributes (called on IBV_EVENT_PKEY_CHANGE)."""
        self._cached_attr = None

    def sm_change(self) -> None:
        """Forget cached port attributes (called on IBV_EVENT_SM_CHANGE and port events)."""
        self._cached_attr = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EndPort):
            return NotImplemented
        return self.parent.name == other.parent.name and self.port_id == other.port_id

    def __hash__(self) -> int:
        return hash((self.parent.name, self.port_id))

    def __str__(self) -> str:
        return "%s/%d" % (self.parent.name, self.port_id)

    def __repr__(self) -> str:
        return "EndPort(%r)" % str(self)


_devices: Optional[List[RDMADevice]] = None
_devices_lock = _threading.Lock()


def get_devices(refresh: bool = False) -> List[RDMADevice]:
    """Every visible device (``FERRY_DEVICES=name,...`` restricts them), highest-priority
    provider first, as :class:`RDMADevice` objects (an empty list when there is none). The list
    is cached; *refresh* reads it again."""
    global _devices
    with _devices_lock:
        if _devices is None or refresh:
            _devices = [RDMADevice(info) for info in _core.list_devices()]
        return list(_devices)


def get_device(name: Optional[str] = None) -> RDMADevice:
    """The device called *name*, or the first device when None. Raises
    :class:`ferry.NotFound` (a ``DeviceNotFoundError``) when there is no such device."""
    devices = get_devices()
    if name is None:
        if not devices:
            raise DeviceNotFoundError("no RDMA device is visible (see ferry.verbs list_providers and FERRY_DEVICES)")
        return devices[0]
    for dev in devices:
        if dev.name == name:
            return dev
    for dev in get_devices(refresh=True):
        if dev.name == name:
            return dev
    raise DeviceNotFoundError("RDMA device %r not found" % (name,))


def get_end_port(name: Union[str, EndPort, None] = None) -> EndPort:
    """The :class:`EndPort` called *name*: ``"soft_lo"`` (port 1), ``"soft_lo/1"`` or
    ``"soft_lo:1"``; with None, port 1 of the first device; an EndPort is returned as it is.
    Raises :class:`ferry.NotFound` (a ``DeviceNotFoundError``) for an unknown device or port."""
    if isinstance(name, EndPort):
        return name
    if name is None:
        return get_device().end_ports[0]
    device_name, port = name, 1
    for sep in ("/", ":"):
        if sep in name:
            device_name, _, port_text = name.rpartition(sep)
            try:
                port = int(port_text)
            except ValueError:
                raise DeviceNotFoundError("RDMA end port %r not found (bad port number)" % (name,)) from None
            break
    dev = get_device(device_name)
    if not 1 <= port <= len(dev.end_ports):
        raise DeviceNotFoundError("RDMA end port %r not found: %s has %d port(s)" % (name, dev, len(dev.end_ports)))
    return dev.end_ports[port - 1]


# ---------------------------------------------------------------------------------------------
# Paths.


class SAPathNotFoundError(_errors.RDMAError, LookupError):
    """No path to the destination: :func:`resolve_path` found it unreachable from the end port
    (the `rdma.path.SAPathNotFoundError` of the specification)."""

    code = _errors.NotFound.code


class Path:
    """Describe an RDMA path. This also caches what is derived from it (the AH of a PD, see
    :meth:`ferry.verbs.PD.ah`). Once a path is in use its content should not change; call
    :meth:`drop_cache` after changing it.

    *end_port* is the :class:`ferry.EndPort` the path starts at (a name such as ``"soft_lo"`` is
    looked up); *kwargs* set attributes."""

    #: Number of times a request is retried: the retry_cnt of an RC QP (0..7).
    retries: int = 7
    #: The end port this path is associated with.
    end_port: Optional[EndPort] = None

    def __init__(self, end_port: Union[EndPort, str, None], **kwargs: Any) -> None:
        if isinstance(end_port, str):
            end_port = get_end_port(end_port)
        self.end_port = end_port
        cls = type(self)
        for k, v in kwargs.items():
            if not hasattr(cls, k):
                raise TypeError("%s has no attribute %r" % (cls.__name__, k))
            setattr(self, k, v)

    def copy(self: _PathT, **kwargs: Any) -> _PathT:
        """A new path with the same content (without cached objects); *kwargs* then set
        attributes (TypeError for a name the path does not have)."""
        cls, args, state = self.__reduce__()
        state.update(kwargs)
        return cls(self.end_port, **state)

    def drop_cache(self) -> None:
        """Release any cached information (address handles, derived indexes)."""
        for name in [k for k in self.__dict__ if k.startswith("_cached")]:
            del self.__dict__[name]

    def _public_items(self) -> Dict[str, Any]:
        cls = type(self)
        return {k: v for k, v in self.__dict__.items()
                if k[0] != "_" and k != "end_port" and getattr(cls, k, None) != v}

    def __repr__(self) -> str:
        ep = None if self.end_port is None else str(self.end_port)
        keys = ", ".join("%s=%r" % (k, v) for k, v in sorted(self._public_items().items()))
        return "%s(end_port=%r, %s)" % (type(self).__name__, ep, keys)

    def __reduce__(self) -> Tuple[type, Tuple[None], Dict[str, Any]]:
        """For pickling: the attributes that differ from the defaults; *end_port* is not kept
        (set it again after unpickling). Pickle is not a safe exchange format: use
        :meth:`IBPath.to_json` with peers you do not control."""
        return (type(self), (None,), self._public_items())


class IBPath(Path):
    """Describe a path with LRH, GRH and BTH fields. A path for packets sent from here has
    :attr:`SGID` = this end, :attr:`sqpn` = the local QP; a path for a received packet is the
    other way round (:meth:`reverse`).

    How the attributes set up a QP (:meth:`ferry.verbs.QP.modify_to_init` ...) and an AH
    (:meth:`ferry.verbs.PD.ah`):

    ================== ==========================================
    end_port.port_id   qp_attr.port_num, ah_attr.port_num
    pkey               qp_attr.pkey_index (through end_port.pkeys)
    qkey               qp_attr.qkey
    MTU                qp_attr.path_mtu
    retries            qp_attr.retry_cnt
    rnr_retries        qp_attr.rnr_retry
    min_rnr_timer      qp_attr.min_rnr_timer
    packet_life_time   qp_attr.timeout (with dack_resp_time)
    dack_resp_time     qp_attr.timeout
    dqpn               qp_attr.dest_qp_num
    dqpsn              qp_attr.rq_psn
    sqpsn              qp_attr.sq_psn
    drdatomic          qp_attr.max_dest_rd_atomic
    srdatomic          qp_attr.max_rd_atomic
    has_grh            ah_attr.is_global
    DGID               ah_attr.grh.dgid
    SGID               ah_attr.grh.sgid_index
    flow_label         ah_attr.grh.flow_label
    hop_limit          ah_attr.grh.hop_limit
    traffic_class      ah_attr.grh.traffic_class
    DLID               ah_attr.dlid
    SLID               ah_attr.src_path_bits
    SL                 ah_attr.sl
    rate               ah_attr.static_rate
    ================== ==========================================
    """

    #: Destination LID (0 on RoCE-style and ferry software devices).
    DLID: int = 0
    #: Source LID.
    SLID: int = 0
    #: Service level.
    SL: int = 0
    #: Partition key (the value; :attr:`pkey_index` is its index at the end port).
    pkey: int = IBA.PKEY_DEFAULT
    #: True if a GRH is present (always for RoCE-style GIDs).
    has_grh: bool = False
    #: Destination QP number.
    dqpn: Optional[int] = None
    #: Source QP number.
    sqpn: Optional[int] = None
    #: Q_Key (UD).
    qkey: Optional[int] = None
    #: Path MTU code (IBA.MTU_*).
    MTU: int = IBA.MTU_256
    #: Static rate (ibv_rate; 0 is the port's full rate).
    rate: int = 0
    #: Source GID.
    SGID: Optional[IBA.GID] = None
    #: Destination GID.
    DGID: Optional[IBA.GID] = None
    #: GRH hop limit.
    hop_limit: int = 0
    #: GRH traffic class.
    traffic_class: int = 0
    #: GRH flow label.
    flow_label: int = 0
    #: Response time of MADs (timer code); used by :attr:`mad_timeout`.
    resp_time: int = 20
    #: Minimum RNR NAK timer code (12: 0.64 ms).
    min_rnr_timer: int = 12
    #: Receiver-not-ready retries of an RC QP (7: retry forever).
    rnr_retries: int = 7
    #: Destination's ACK delay (timer code); used by :attr:`qp_timeout`.
    dack_resp_time: int = 20
    #: Source's ACK delay (timer code), from the device (see :func:`fill_path`).
    sack_resp_time: int = 20
    #: Destination's first PSN (the peer's :attr:`sqpsn`).
    dqpsn: int = 0
    #: First PSN sent from here.
    sqpsn: int = 0
    #: READ/atomic requests the destination may have outstanding here (responder resources).
    drdatomic: int = 255
    #: READ/atomic requests this side may have outstanding.
    srdatomic: int = 255

    @property
    def dpqn(self) -> Optional[int]:
        """Same as :attr:`dqpn` (a spelling the specification's examples use)."""
        return self.dqpn

    @dpqn.setter
    def dpqn(self, value: Optional[int]) -> None:
        self.dqpn = value

    def reverse(self, for_reply: bool = True) -> IBPath:
        """Reverse this path in place (IBA 13.5.4): source and destination LIDs, GIDs, QP
        numbers, PSNs, ACK delays and READ/atomic depths swap. With *for_reply* the hop limit of a
        GRH becomes 255, as for a reply. Returns self."""
        self.DLID, self.SLID = self.SLID, self.DLID
        self.dqpn, self.sqpn = self.sqpn, self.dqpn
        self.DGID, self.SGID = self.SGID, self.DGID
        if self.has_grh and for_reply:
            self.hop_limit = 0xFF
        self.dack_resp_time, self.sack_resp_time = self.sack_resp_time, self.dack_resp_time
        self.dqpsn, self.sqpsn = self.sqpsn, self.dqpsn
        self.drdatomic, self.srdatomic = self.srdatomic, self.drdatomic
        self.drop_cache()
        return self

    @property
    def SGID_index(self) -> int:
        """The index of :attr:`SGID` in the end port's GID table (cached). Assignment sets the
        SGID from the table. On ferry's software devices each verbs context has one GID, at
        index 0. Reading raises :class:`ferry.RDMAError` when the SGID is not one of the end
        port's."""
        cached = self.__dict__.get("_cached_SGID_index")
        if cached is not None:
            return cached
        if self.SGID is None:
            index = 0
        else:
            found = _end_port(self)._gid_index(IBA.GID(self.SGID))
            if found is None:
                raise _errors.RDMAError("GID %s is not available on %s" % (str(self.SGID), self.end_port))
            index = found
        self.__dict__["_cached_SGID_index"] = index
        return index

    @SGID_index.setter
    def SGID_index(self, value: int) -> None:
        self.SGID = _end_port(self).gids[value]
        self.__dict__["_cached_SGID_index"] = value

    @property
    def pkey_index(self) -> int:
        """The index of :attr:`pkey` in the end port's P_Key table (cached). Assignment sets the
        pkey from the table. Reading raises :class:`ferry.RDMAError` when the end port does not
        have the P_Key."""
        cached = self.__dict__.get("_cached_pkey_index")
        if cached is not None:
            return cached
        try:
            index = _end_port(self).pkeys.index(self.pkey)
        except ValueError:
            raise _errors.RDMAError("PKey 0x%x is not available on %s" % (self.pkey, self.end_port)) from None
        self.__dict__["_cached_pkey_index"] = index
        return index

    @pkey_index.setter
    def pkey_index(self, value: int) -> None:
        self.pkey = _end_port(self).pkeys[value]
        self.__dict__["_cached_pkey_index"] = value

    @property
    def SLID_bits(self) -> int:
        """The path bits (LMC part) of :attr:`SLID`. Assignment sets SLID from the end port's
        LID."""
        return self.SLID & 0xFF

    @SLID_bits.setter
    def SLID_bits(self, value: int) -> None:
        self.SLID = value | _end_port(self).lid

    @property
    def DLID_bits(self) -> int:
        """The path bits (LMC part) of :attr:`DLID`. Assignment sets DLID from the end port's
        LID."""
        return self.DLID & 0xFF

    @DLID_bits.setter
    def DLID_bits(self, value: int) -> None:
        self.DLID = value | _end_port(self).lid

    @property
    def packet_life_time(self) -> int:
        """The expected one-way transit time (timer code: 4.096 us * 2**value). When not set, the
        end port's :attr:`~ferry.EndPort.subnet_timeout`."""
        value: Optional[int] = self.__dict__.get("packet_life_time")
        if value is not None:
            return value
        if self.end_port is not None:
            return self.end_port.subnet_timeout
        return DEFAULT_SUBNET_TIMEOUT

    @packet_life_time.setter
    def packet_life_time(self, value: int) -> None:
        self.__dict__["packet_life_time"] = value

    @property
    def mad_timeout(self) -> float:
        """Timeout for a request/response on this path, in seconds."""
        return 4.096e-6 * (2 ** (self.packet_life_time + 1) + 2 ** self.resp_time)

    @property
    def qp_timeout(self) -> float:
        """The ACK timeout of an RC QP on this path, in seconds: 2 * packet_life_time + the
        destination's ACK delay."""
        return 4.096e-6 * (2 ** (self.packet_life_time + 1) + 2 ** self.dack_resp_time)

    def __str__(self) -> str:
        if self.has_grh:
            res = "%s %r -> %s %r TC=%r FL=%r HL=%r" % (str(self.SGID), self.SLID, str(self.DGID), self.DLID,
                                                        self.traffic_class, self.flow_label, self.hop_limit)
        else:
            res = "%r -> %r" % (self.SLID, self.DLID)
        return "Path %s SL=%r PKey=0x%x DQPN=%r" % (res, self.SL, self.pkey, self.dqpn)

    # ---- the safe text encoding ----

    def to_json(self) -> str:
        """This path as a JSON object (``{"ferry_path": 1, ...}``, the encoding of
        ``ferry::verbs::Path::toJson`` plus ``pkey``, ``dack_resp_time`` and ``sack_resp_time``).
        The end port is not encoded. Raises :class:`ferry.InvalidArgument` for a field out of
        range."""
        def gid_text(gid: Optional[IBA.GIDLike]) -> str:
            return "::" if gid is None else str(IBA.GID(gid))

        sgid_index = self.__dict__.get("_cached_SGID_index", 0)
        pkey_index = self.__dict__.get("_cached_pkey_index", 0)
        fields: Dict[str, Any] = {
            "ferry_path": 1,
            "sgid": gid_text(self.SGID), "dgid": gid_text(self.DGID), "sgid_index": sgid_index,
            "slid": self.SLID, "dlid": self.DLID,
            "sqpn": self.sqpn or 0, "dqpn": self.dqpn or 0, "sqpsn": self.sqpsn, "dqpsn": self.dqpsn,
            "qkey": self.qkey or 0, "pkey_index": pkey_index, "mtu": self.MTU, "retries": self.retries,
            "rnr_retries": self.rnr_retries, "min_rnr_timer": self.min_rnr_timer,
            "packet_life_time": self.packet_life_time, "srdatomic": self.srdatomic, "drdatomic": self.drdatomic,
            "port_num": self.end_port.port_id if self.end_port is not None else 1, "sl": self.SL,
            "has_grh": bool(self.has_grh), "hop_limit": self.hop_limit, "traffic_class": self.traffic_class,
            "flow_label": self.flow_label, "rate": self.rate,
        }
        for name, value in fields.items():
            if name in ("sgid", "dgid", "has_grh"):
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise _errors.InvalidArgument("path field %r must be an int, not %r" % (name, type(value).__name__))
        canonical = _core.path_normalize_json(_json.dumps(fields))
        doc = _json.loads(canonical)
        for name, value, limit in (("pkey", self.pkey, 0xFFFF), ("dack_resp_time", self.dack_resp_time, 31),
                                   ("sack_resp_time", self.sack_resp_time, 31)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
                raise _errors.InvalidArgument("path field %r must be an int in [0, %d]" % (name, limit))
            doc[name] = value
        return _json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: Union[str, bytes, bytearray, memoryview], end_port: Optional[EndPort] = None) -> IBPath:
        """Decode a path made by :meth:`to_json` (text or UTF-8 bytes) and attach it to
        *end_port*. The decoder is strict (``ferry::verbs::Path::fromJson``: types, ranges, the
        version) and runs no code, so the text may come from an untrusted peer. Raises
        :class:`ferry.InvalidArgument` for anything malformed."""
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError:
                raise _errors.InvalidArgument("path: not UTF-8 text") from None
        if not isinstance(text, str):
            raise TypeError("from_json expects str or bytes")
        if len(text) > _MAX_JSON_CHARS:
            raise _errors.InvalidArgument("path: text longer than %d characters" % _MAX_JSON_CHARS)
        fields = _core.path_from_json(text)
        try:
            doc = _json.loads(text)
        except (ValueError, RecursionError):
            raise _errors.InvalidArgument("path: malformed JSON") from None
        extras: Dict[str, int] = {}
        for name, limit in (("pkey", 0xFFFF), ("dack_resp_time", 31), ("sack_resp_time", 31)):
            if name not in doc:
                continue
            value = doc[name]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
                raise _errors.InvalidArgument("path field %r must be an integer in [0, %d]" % (name, limit))
            extras[name] = value

        def gid(raw: bytes) -> Optional[IBA.GID]:
            g = IBA.GID(raw, raw=True)
            return None if g.is_zero() else g

        values = {
            "SGID": gid(fields["sgid"]), "DGID": gid(fields["dgid"]), "SLID": fields["slid"],
            "DLID": fields["dlid"], "sqpn": fields["sqpn"], "dqpn": fields["dqpn"], "sqpsn": fields["sqpsn"],
            "dqpsn": fields["dqpsn"], "qkey": fields["qkey"], "MTU": fields["mtu"], "retries": fields["retries"],
            "rnr_retries": fields["rnr_retries"], "min_rnr_timer": fields["min_rnr_timer"],
            "srdatomic": fields["srdatomic"], "drdatomic": fields["drdatomic"], "SL": fields["sl"],
            "has_grh": fields["has_grh"], "hop_limit": fields["hop_limit"],
            "traffic_class": fields["traffic_class"], "flow_label": fields["flow_label"], "rate": fields["rate"],
        }
        path = cls(end_port)
        # Only what differs from the defaults is set, as unpickling a path does (so that, e.g.,
        # resolve_path still fills in what the sender left open).
        for name, value in values.items():
            default = getattr(cls, name)
            if name in ("sqpn", "dqpn", "qkey") and value == 0 and default is None:
                continue
            if value != default:
                setattr(path, name, value)
        if fields["packet_life_time"] != path.packet_life_time:
            path.packet_life_time = fields["packet_life_time"]
        if "pkey" in extras:
            path.pkey = extras["pkey"]
        elif end_port is not None:
            pkeys = end_port.pkeys
            if fields["pkey_index"] < len(pkeys):
                path.pkey = pkeys[fields["pkey_index"]]
        if "dack_resp_time" in extras:
            path.dack_resp_time = extras["dack_resp_time"]
        if "sack_resp_time" in extras:
            path.sack_resp_time = extras["sack_resp_time"]
        return path


class LocalPathResolver:
    """What :func:`ferry.get_gmp_mad` returns: the stand-in for the GMP MAD object (``umad``) of
    the specification. ferry's devices have no subnet administrator; this completes paths from what
    the end port (and, when given, the verbs context) knows. A context manager; :meth:`close` is
    idempotent."""

    def __init__(self, end_port: EndPort, verbs: Optional[Context] = None) -> None:
        self.end_port = end_port
        self.verbs = verbs
        self.closed = False

    @property
    def parent(self) -> EndPort:
        """The end port paths are resolved from (the specification's name for it)."""
        return self.end_port

    @property
    def default_gid(self) -> IBA.GID:
        """The source GID for paths resolved here: the GID of the verbs context when one was given,
        else :attr:`ferry.EndPort.default_gid`."""
        if self.verbs is not None and not self.verbs.closed:
            port_id = self.end_port.port_id
            return IBA.GID(self.verbs.query_gid(port_id, self.verbs._default_gid_index(port_id)), raw=True)
        return self.end_port.default_gid

    def resolve_path(self, path: IBPath, reversible: bool = False,
                     properties: Optional[Mapping[str, Any]] = None) -> IBPath:
        """Same as :func:`resolve_path` with this resolver."""
        return resolve_path(self, path, reversible, properties)

    def close(self) -> None:
        """Marks the resolver closed (it holds nothing to release). Idempotent."""
        self.closed = True

    def __enter__(self) -> LocalPathResolver:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return "LocalPathResolver(%r)" % (str(self.end_port),)


# Path-record component names accepted in resolve_path(properties=...) and the path attribute each
# one sets.
_PROPERTY_ATTRS = {
    "PKey": "pkey", "SL": "SL", "MTU": "MTU", "rate": "rate", "TClass": "traffic_class",
    "flowLabel": "flow_label", "hopLimit": "hop_limit", "SGID": "SGID", "DGID": "DGID", "DLID": "DLID",
    "SLID": "SLID", "packetLifeTime": "packet_life_time",
}


def _end_port(path: Path) -> EndPort:
    """The path's end port, which the caller needs set."""
    return cast("EndPort", path.end_port)


def _is_soft_gid(gid: IBA.GID) -> bool:
    raw = bytes(gid)
    return (not any(raw[0:8]) and raw[10:12] == b"\xff\xff" and raw[8:10] != b"\x00\x00"
            and raw[12:16] != b"\x00\x00\x00\x00")


def resolve_path(mad: LocalPathResolver, path: IBPath, reversible: bool = False,
                 properties: Optional[Mapping[str, Any]] = None) -> IBPath:
    """Resolve *path* to a full path for use with a QP. *path* must have at least a DGID (or, on
    InfiniBand, a DLID). *mad* is what :func:`ferry.get_gmp_mad` returned.

    Without a subnet administrator the path is completed locally: SGID from the resolver, MTU,
    rate, packet lifetime and, for
    RoCE-style (Ethernet link layer) ports such as ferry's software devices, the GRH (has_grh,
    hop limit 64). As with a subnet administrator's answer, the MTU is the port's active one
    (or the smaller ``MTU`` property). *properties* is a dict of path-record fields (``PKey``, ``SL``, ``MTU``,
    ``rate``, ``TClass``, ``flowLabel``, ``hopLimit``, ``SGID``, ``DGID``, ``DLID``, ``SLID``,
    ``packetLifeTime``) that the path must have. Paths here are always reversible.
    Returns *path*.

    :raises SAPathNotFoundError: if the destination cannot be reached from the end port.
    :raises ValueError: if *path* names no destination or a property is unknown."""
    if path.end_port is None:
        path.end_port = mad.end_port
    end_port = path.end_port
    wanted_mtu: Optional[int] = None
    if properties:
        for key, value in properties.items():
            attr = _PROPERTY_ATTRS.get(key)
            if attr is None:
                raise ValueError("path record property %r cannot be resolved without a subnet administrator "
                                 "(known: %s)" % (key, ", ".join(sorted(_PROPERTY_ATTRS))))
            if attr == "MTU":
                wanted_mtu = value
            setattr(path, attr, IBA.GID(value) if attr in ("SGID", "DGID") else value)
    if path.DGID is None and not path.DLID:
        raise ValueError("the path needs a DGID (or a DLID) to resolve")
    if path.SGID is None:
        path.SGID = mad.default_gid
    if end_port._gid_index(IBA.GID(path.SGID)) is None:
        raise SAPathNotFoundError("no path from %s: the source GID is not one of %s" % (str(path.SGID), end_port))
    if path.pkey not in end_port.pkeys:
        raise SAPathNotFoundError("no path with P_Key 0x%x: %s has %s" % (
            path.pkey, end_port, ", ".join("0x%x" % p for p in end_port.pkeys)))

    if end_port.link_layer == 2 or end_port.parent.addressed_by_context:
        # RoCE-style addressing: GIDs route, every packet has a GRH, LIDs are unused.
        if path.DGID is None:
            raise SAPathNotFoundError("%s addresses peers by GID: the path needs a DGID" % end_port)
        dgid = IBA.GID(path.DGID)
        if end_port.parent.addressed_by_context and not _is_soft_gid(dgid):
            raise SAPathNotFoundError("no path to %s from %s: not the GID of a ferry software device "
                                      "(a verbs context)" % (str(dgid), end_port))
        path.DGID = dgid
        path.has_grh = True
        if not path.hop_limit:
            path.hop_limit = 64
        path.DLID = 0
        path.SLID = 0
    else:
        if not path.DLID:
            raise SAPathNotFoundError("%s needs a DLID: there is no subnet administrator to look up %s"
                                      % (end_port, str(path.DGID)))
        if path.DGID is not None:
            path.has_grh = True
            if not path.hop_limit:
                path.hop_limit = 64

    active_mtu = end_port.mtu
    path.MTU = min(active_mtu, wanted_mtu) if wanted_mtu else active_mtu
    if "rate" not in path.__dict__:
        path.rate = end_port.rate
    if "packet_life_time" not in path.__dict__:
        path.packet_life_time = end_port.subnet_timeout
    path.drop_cache()
    return path


def get_mad_path(mad: LocalPathResolver, ep_addr: IBA.GIDLike, **kwargs: Any) -> IBPath:
    """A resolved, reversible path from the end port of *mad* to *ep_addr* (a GID, its text, or a
    LID). *kwargs* set attributes first. Raises as :func:`resolve_path`."""
    if isinstance(ep_addr, int) and not isinstance(ep_addr, bool) and ep_addr < 0x10000:
        path = IBPath(mad.end_port, DLID=ep_addr, **kwargs)
    else:
        path = IBPath(mad.end_port, DGID=IBA.GID(ep_addr), **kwargs)
    return resolve_path(mad, path, True)


def fill_path(qp: QP, path: IBPath, max_rd_atomic: int = 255) -> IBPath:
    """Fill in the fields of *path* that come from *qp*, for use with that QP: the source QP
    number, the source GID (the QP's context), the ACK delay of the device, the READ/atomic depths
    (the smaller of the path's, the device's and *max_rd_atomic*) and random initial PSNs where
    they are 0. Fields describing the peer are kept. Set *max_rd_atomic* to 0 if RDMA READ and
    atomics will not be used."""
    ctx = qp.ctx
    if path.end_port is None:
        path.end_port = ctx.end_port if ctx.end_port is not None else ctx.node.end_ports[0]
    path.sqpn = qp.qp_num
    devinfo = ctx.query_device()
    path.sack_resp_time = devinfo.local_ca_ack_delay
    path.srdatomic = min(path.srdatomic, devinfo.max_qp_init_rd_atom, max_rd_atomic)
    path.drdatomic = min(path.drdatomic, devinfo.max_qp_rd_atom, max_rd_atomic)
    if path.sqpsn == 0:
        path.sqpsn = 1 + _secrets.randbelow(0xFFFFFF)
    if path.dqpsn == 0:
        path.dqpsn = 1 + _secrets.randbelow(0xFFFFFF)
    # The source GID must be one of the QP's context (on ferry's software devices each context has
    # exactly one, which also names it).
    port_id = path.end_port.port_id
    gids = [IBA.GID(ctx.query_gid(port_id, i), raw=True)
            for i in range(max(1, min(ctx.query_port(port_id).gid_tbl_len, 256)))]
    if path.SGID is None or IBA.GID(path.SGID) not in gids:
        index = ctx._default_gid_index(port_id)
        path.SGID = gids[index] if index < len(gids) else gids[0]
    path.drop_cache()
    return path
