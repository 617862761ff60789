"""Devices, end ports and the entry points of the verbs interface (the top-level `rdma` names of
the verbs specification: ``get_end_port``, ``get_verbs``, ``get_gmp_mad``).

::

    import ferry
    end_port = ferry.get_end_port()          # the first device's port 1
    with ferry.get_verbs(end_port) as ctx:   # a ferry.verbs.Context
        pd = ctx.pd()

Importing :mod:`ferry` also makes :mod:`ferry.verbs`, :mod:`ferry.path`, :mod:`ferry.vtools`,
:mod:`ferry.IBA` and :mod:`ferry.tools` available as attributes.
"""

from __future__ import annotations

import threading as _threading
import weakref as _weakref
from typing import Any, List, Literal, Mapping, Optional, Union

from . import IBA, tools  # noqa: F401  (imported so that ferry.IBA, ferry.tools exist)
from . import errors as _errors
from . import path  # noqa: F401
from . import verbs
from . import vtools  # noqa: F401
from ._core import verbs as _core

__all__ = ["RDMADevice", "EndPort", "get_devices", "get_device", "get_end_port", "get_verbs", "get_gmp_mad"]


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
        self._contexts: List[_weakref.ref[verbs.Context]] = []
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

    def _context_opened(self, ctx: verbs.Context) -> None:
        with self._lock:
            self._contexts = [w for w in self._contexts if _live(w) is not None]
            self._contexts.append(_weakref.ref(ctx))

    def _live_context(self) -> Optional[verbs.Context]:
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


def _live(ref: _weakref.ref[verbs.Context]) -> Optional[verbs.Context]:
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
    subnet_timeout: int = path.DEFAULT_SUBNET_TIMEOUT

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
            if path._is_soft_gid(gid) and ".".join(str(b) for b in raw[12:16]) == self.parent.address:
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
    def sa_path(self) -> path.IBPath:
        """The path to this port's subnet administrator: QP1 at the subnet manager's LID
        (:attr:`sm_lid`, :attr:`sm_sl`) with the GSI Q_Key and the default P_Key, a new
        :class:`ferry.path.IBPath` on each access (change it freely). ferry's devices have no
        subnet manager: :func:`ferry.path.resolve_path` answers path queries locally, and the SA
        path names this port itself (its SM LID is the port's own LID, 0 on RoCE-style and software
        devices)."""
        return path.IBPath(self, SLID=self.lid, DLID=self.sm_lid, SL=self.sm_sl, sqpn=1, dqpn=1,
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


def get_verbs(end_port: Union[EndPort, RDMADevice, str, None] = None) -> verbs.Context:
    """Open a :class:`ferry.verbs.Context` for *end_port* (an :class:`EndPort`, an
    :class:`RDMADevice`, a name, or None for the default end port). Raises
    :class:`ferry.NotFound` for an unknown name, and the device's error when it cannot be
    opened."""
    if end_port is None or isinstance(end_port, str):
        end_port = get_end_port(end_port)
    return verbs.Context(end_port)


def get_gmp_mad(end_port: Union[EndPort, str, None] = None,
                verbs: Optional[verbs.Context] = None) -> path.LocalPathResolver:
    """The path resolver for *end_port*, a context manager standing in for the specification's
    GMP MAD object: pass it to :func:`ferry.path.resolve_path`. With *verbs* (a :class:`ferry.verbs.Context`)
    resolved paths start at that context's GID. ferry's devices have no subnet administrator:
    paths are completed locally (see :func:`ferry.path.resolve_path`)."""
    if end_port is None or isinstance(end_port, str):
        end_port = get_end_port(end_port)
    return path.LocalPathResolver(end_port, verbs)
