"""ferry's agent: name a peer and write to it.

Shaped like DLSlime's ``PeerAgent`` so that its users move over by changing an import::

    from ferry import start_peer_agent
    agent = start_peer_agent(store="ferry://127.0.0.1:4479", alias="prefill-0")
    agent.register_memory_region("kv", tensor)                 # or (name, ptr, offset, length)
    conn = agent.connect_to("decode-0")                        # usable at once
    agent.write("decode-0", [("kv", 0, 0, 4096)]).wait()       # queued until the wireup finished

A connection is usable the moment it is made: operations posted before the wireup finished wait in
its queue and are replayed in order. ``conn.wait(timeout)`` reports the wireup; the wireup has a
deadline (``connect_timeout``), after which queued operations raise ``ferry.TimedOut``. A peer that
dies (its kernel closes its connections), whose host is unreachable for ``peer_timeout``, or that
shuts down fails every pending operation with ``ferry.PeerGone`` (``heartbeat=`` seconds also finds a
hung one); the next operation to its alias finds it again (a restarted peer is wired anew). A peer
that is only paused keeps its connections.

Assignments (read, write, write_with_imm), one or a list:

- ``(region, local_offset, remote_offset, length)``: the same region name on both sides;
- ``(local_region, remote_region, local_offset, remote_offset, length)``: two names;
- the Endpoint API's ``(mr_key, remote_mr_key, target_offset, source_offset, length)`` with integer
  keys, and ``ferry.Assignment`` objects, unchanged.

Chunks (send, recv): ``(region, offset, length)``, one or a list. Futures are the Endpoint API's.

Operations (read, write, write_with_imm, send, recv, imm_recv) return at once with a future; the
future completes on ferry's progress thread (on the agent's thread when the operation fails before
it is posted), and ``wait()``, or ``await`` from asyncio, returns then. The memory an operation names
belongs to ferry from the call until its future completed, successfully or not; the batch itself
(the tuples, the list) is read during the call only. Bad input known locally (an unknown local
region, a range outside it, an empty batch) raises ``ferry.InvalidArgument`` from the call; the
future raises the operation's error: ``ferry.NotFound`` (the peer has no region of that name),
``ferry.TimedOut`` (the wireup's deadline passed), ``ferry.PeerGone``, ``ferry.Cancelled`` (this
agent shut down), ``ferry.WorkCompletionError`` (the device refused the transfer).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from .. import _core
from .._core import agent as _agent
from .._core import endpoint as _ep
from .._memory import registrable as _registrable
from ..endpoint import Assignment

__all__ = ["PeerAgent", "PeerConnection", "start_peer_agent"]

PeerConnection = _agent.PeerConnection

_Region = Union[str, int]
#: One assignment: ``(region, local_offset, remote_offset, length)``, ``(local_region,
#: remote_region, local_offset, remote_offset, length)``, the Endpoint API's tuple of integer keys,
#: or a :class:`ferry.Assignment`.
AssignmentLike = Union[Tuple[_Region, int, int, int], Tuple[_Region, _Region, int, int, int], Assignment]
#: An assignment or a list of them (one batch).
Assignments = Union[AssignmentLike, Sequence[AssignmentLike]]
#: One chunk of a message, ``(region, offset, length)``, or a list of them (gathered or scattered
#: in order).
Chunks = Union[Tuple[_Region, int, int], Sequence[Tuple[_Region, int, int]]]
#: A peer: its alias, or a connection to it.
Peer = Union[str, PeerConnection]


def _devices(device: Union[str, Sequence[str], None]) -> List[str]:
    if device is None:
        return []
    if isinstance(device, str):
        return [device]
    devices = list(device)
    if not all(isinstance(d, str) for d in devices):
        raise TypeError("device must be a device name, a list of names, or None")
    return devices


class PeerAgent:
    """An agent: discovery, wireup and reconnection for the connections of one process.

    ``store`` is a discovery store URL (``memory://``, ``ferry://host:port`` served by
    ``ferry store --port N``, ``redis://host:port``, ``etcd://host:port``); None takes
    ``FERRY_STORE`` from the environment, else no store (then peers connect by address).
    ``device`` restricts the devices offered (a name, a list, or None for every visible one);
    ``scope`` separates groups of agents sharing one store. The agent is a context manager.

    Keyword options: ``connect_timeout`` (seconds a wireup may take), ``peer_timeout`` (seconds a
    peer's host may be unreachable before it counts as gone), ``heartbeat`` (seconds between
    liveness probes; 0: none), ``lease_ttl`` (seconds the store keeps this agent's entry without a
    renewal), ``secret`` (the shared secret that authenticates the wireup; None:
    ``FERRY_AGENT_SECRET``), ``listen_host`` and ``listen_port`` (the wireup listener; port 0: any),
    ``lanes`` (lane overrides; None: ``FERRY_AGENT_LANES``), ``recv_depth`` and ``recv_buffer_size``
    (the endpoints' receive buffers: how many per queue pair, bytes each).

    Raises ferry.InvalidArgument for a bad option or store URL (``FERRY_STORE`` included),
    ferry.Unavailable when the store cannot be reached or the listener cannot be bound."""

    def __init__(self, alias: Optional[str] = None, store: Optional[str] = None,
                 device: Union[str, Sequence[str], None] = None, scope: Optional[str] = None, *,
                 connect_timeout: float = 30.0, peer_timeout: float = 5.0, heartbeat: float = 0.0,
                 lease_ttl: int = 10, secret: Optional[str] = None, listen_host: Optional[str] = None,
                 listen_port: int = 0, lanes: Optional[str] = None, recv_depth: Optional[int] = None,
                 recv_buffer_size: Optional[int] = None) -> None:
        if store is None:
            # FERRY_STORE through ferry's one table of variables: a malformed URL is refused, naming it.
            _core.check_config()
            store = next((row["value"] for row in _core.config() if row["name"] == "FERRY_STORE"), "")
        self._agent = _agent.Agent(
            alias=alias or "", store=store, scope=scope or "default", devices=_devices(device),
            listen_host=listen_host or "", listen_port=listen_port, connect_timeout=connect_timeout,
            peer_timeout=peer_timeout, heartbeat=heartbeat, lease_ttl=lease_ttl, secret=secret or "",
            lanes=lanes or "", recv_depth=recv_depth, recv_buffer_size=recv_buffer_size)
        self.store = store or None

    # ---- identity ----
    @property
    def alias(self) -> str:
        """This agent's name in the store."""
        return self._agent.alias

    @property
    def address(self) -> bytes:
        """The worker address (bytes): everything a peer needs to connect (``connect_address``)."""
        return self._agent.address

    @property
    def uuid(self) -> str:
        """This start's identity (a new one at every start)."""
        return self._agent.uuid

    # ---- connections ----
    def connect_to(self, alias: str, qp_num: int = 1) -> PeerConnection:
        """The connection to the agent named ``alias``: returned at once (an alias not registered
        yet is waited for until the wireup deadline). ``qp_num`` (1 to 64) is the number of queue
        pairs of its endpoints. ferry.InvalidArgument for this agent's own alias, a bad
        ``qp_num``, or an alias not connected on an agent without a store; ferry.Closed after
        :meth:`shutdown`. The wireup's own errors come from ``conn.wait()`` and the operations'
        futures."""
        return self._agent.connect_to(alias, qp_num)

    def connect_address(self, address: Union[bytes, bytearray, memoryview], qp_num: int = 1) -> PeerConnection:
        """The connection to the agent whose ``address`` (bytes, its :attr:`address`) this is; no
        store needed. ferry.InvalidArgument for a malformed address or a bad ``qp_num``."""
        return self._agent.connect_address(bytes(address), qp_num)

    def peer(self, alias: str) -> PeerConnection:
        """The live connection to ``alias`` (one this agent made, or the reply endpoint a peer's
        connection made here), else a new one, as ``connect_to`` would."""
        return self._agent.peer(alias)

    def _peer(self, peer: Peer) -> PeerConnection:
        if isinstance(peer, PeerConnection):
            return peer
        if not isinstance(peer, str):
            raise TypeError("peer must be an alias (str) or a PeerConnection")
        return self._agent.peer(peer)

    def lanes(self, peer: str) -> Dict[str, str]:
        """``{"messages": lane, "rma": lane, "atomics": lane}``, each ``"same_host"``, ``"tcp"`` or
        ``"rdma:<device>"``: the same on both sides. ``lanes_detail`` adds the devices and why.
        ``peer`` is an alias; ferry.NotFound for a peer never connected."""
        return self._agent.lanes(peer)

    def lanes_detail(self, peer: str) -> Dict[str, Dict[str, str]]:
        """The lanes of :meth:`lanes` with how each was chosen: per operation class
        (``"messages"``, ``"rma"``, ``"atomics"``) a dict of ``lane``, ``local_device``,
        ``remote_device`` and ``why``. ``peer`` is an alias; ferry.NotFound for a peer never
        connected."""
        return self._agent.lanes_detail(peer)

    def peers(self) -> List[str]:
        """The aliases with a connection (live or wiring up)."""
        return self._agent.peers()

    def list_agents(self) -> List[str]:
        """The aliases registered in the store under this agent's scope, sorted. ferry.Unavailable
        without a store or when it cannot be reached."""
        return self._agent.list_agents()

    # ---- memory ----
    def register_memory_region(self, name: str, ptr: object, offset: int = 0, length: Optional[int] = None) -> None:
        """Registers memory under ``name`` on every device and publishes it: ``ptr`` is an address
        (then ``length`` is needed), a buffer (bytearray, memoryview, mmap, NumPy array), a CPU or
        CUDA tensor or an object exporting CPU memory through DLPack (``__dlpack__``), or CUDA
        memory through DLPack and ``__cuda_array_interface__`` (CuPy); ``offset`` bytes are skipped,
        ``length`` bytes (None: the rest of the object) are registered. The object is kept alive
        while registered; a name registered again is replaced. ferry.InvalidArgument for a range
        outside the object, ferry.NotSupported for memory on another device than the CPU and CUDA,
        and for CUDA memory where CUDA's driver is not usable."""
        self._agent.register_memory_region(name, _registrable(ptr, "register_memory_region"), offset, length)

    def unregister_memory_region(self, name: str) -> None:
        """Deregisters the region ``name`` on every device and removes it from the store; when this
        returns no device touches its memory (an operation still in flight on it fails), and the
        object registered is released. ferry.NotFound for a name not registered."""
        self._agent.unregister_memory_region(name)

    def get_mr_info(self, peer: str, name: str) -> Dict[str, int]:
        """A peer's region, ``{"addr", "length", "rkey", "handle"}``, asked of the peer over its
        wireup link (connecting first when needed); the store holds only a region's length. Blocks
        up to ``connect_timeout``. ferry.NotFound when the peer has no such region, ferry.TimedOut
        when it does not answer, ferry.Unavailable without a connection or store to find it."""
        info: Dict[str, int] = json.loads(self._agent.get_mr_info(peer, name))
        return info

    # ---- operations (peer: an alias or a PeerConnection; see the module's documentation) ----
    def write(self, peer: Peer, assignments: Assignments) -> _ep.ReadWriteFuture:
        """RDMA WRITE of a batch: each assignment's ``length`` bytes go from the local region at
        ``local_offset`` to the peer's region at ``remote_offset``. Returns at once (queued until
        the wireup finished); the future completes when every byte is in the peer's memory. The
        local memory must stay unchanged until then. ferry.InvalidArgument for bad local input;
        the future raises the operation's error."""
        return self._peer(peer).write(assignments)

    def read(self, peer: Peer, assignments: Assignments) -> _ep.ReadWriteFuture:
        """RDMA READ of a batch: each assignment's ``length`` bytes come from the peer's region at
        ``remote_offset`` into the local region at ``local_offset``. Returns at once (queued until
        the wireup finished); the future completes when every byte is in local memory, which must
        not be read or written until then. ferry.InvalidArgument for bad local input; the future
        raises the operation's error."""
        return self._peer(peer).read(assignments)

    def write_with_imm(self, peer: Peer, assignments: Assignments, imm_data: int = 0) -> _ep.ReadWriteFuture:
        """:meth:`write`, then the 32-bit ``imm_data``, which the peer's :meth:`imm_recv` gets once
        all the written bytes are in its memory. Returns the write's future (as :meth:`write`)."""
        return self._peer(peer).write_with_imm(assignments, imm_data)

    def send(self, peer: Peer, chunks: Chunks) -> _ep.SendFuture:
        """Sends one message gathered from ``chunks`` (in order) to the peer, where a :meth:`recv`
        takes it. Returns at once; the future completes when the message was delivered into the
        peer's receive buffers, and the chunks' memory must stay unchanged until then.
        ferry.InvalidArgument for bad local input; the future raises the operation's error."""
        return self._peer(peer).send(chunks)

    def recv(self, peer: Peer, chunks: Chunks) -> _ep.RecvFuture:
        """Receives the peer's next message into ``chunks`` (scattered in order). Returns at once;
        the future completes when the message is in place (``future.nbytes()`` is its length;
        awaiting it gives the length); the memory must not be used until then. A message longer
        than the chunks fails the future with ferry.InvalidArgument."""
        return self._peer(peer).recv(chunks)

    def imm_recv(self, peer: Peer) -> _ep.ImmRecvFuture:
        """The peer's next :meth:`write_with_imm` immediate: the future completes once all the
        bytes of that write are here (``future.imm_data()`` is the value; awaiting it gives the
        value). Immediates that arrive before the call are queued."""
        return self._peer(peer).imm_recv()

    # ---- life ----
    def stats(self) -> Dict[str, int]:
        """Wireup counters: requests, replies, acks, retries, duplicates dropped, peers gone..."""
        return self._agent.stats()

    def shutdown(self) -> None:
        """Says goodbye to the peers, fails pending operations with ferry.Cancelled, leaves the
        store. Idempotent."""
        self._agent.shutdown()

    def __enter__(self) -> PeerAgent:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.shutdown()
        return False

    def __repr__(self) -> str:
        return "<ferry PeerAgent %r>" % (self.alias,)


def start_peer_agent(store: Optional[str] = None, alias: Optional[str] = None,
                     device: Union[str, Sequence[str], None] = None, scope: Optional[str] = None,
                     **options: Any) -> PeerAgent:
    """Starts a :class:`PeerAgent` (the keyword options are its own: connect_timeout, peer_timeout,
    secret, lanes, listen_host, listen_port, ...). Raises as :class:`PeerAgent` does."""
    return PeerAgent(alias=alias, store=store, device=device, scope=scope, **options)
