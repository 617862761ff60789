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
"""


from .. import _core
from .._core import agent as _agent
from .._memory import registrable as _registrable

__all__ = ["PeerAgent", "PeerConnection", "start_peer_agent"]

PeerConnection = _agent.PeerConnection


def _devices(device):
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
    ``scope`` separates groups of agents sharing one store. The agent is a context manager."""

    def __init__(self, alias=None, store=None, device=None, scope=None, *, connect_timeout=30.0,
                 peer_timeout=5.0, heartbeat=0.0, lease_ttl=10, secret=None, listen_host=None,
                 listen_port=0, lanes=None, recv_depth=None, recv_buffer_size=None):
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
    def alias(self):
        """This agent's name in the store."""
        return self._agent.alias

    @property
    def address(self):
        """The worker address (bytes): everything a peer needs to connect (``connect_address``)."""
        return self._agent.address

    @property
    def uuid(self):
        """This start's identity (a new one at every start)."""
        return self._agent.uuid

    # ---- connections ----
    def connect_to(self, alias, qp_num=1):
        """The connection to the agent named ``alias``: returned at once (an alias not registered
        yet is waited for until the wireup deadline)."""
        return self._agent.connect_to(alias, qp_num)

    def connect_address(self, address, qp_num=1):
        """The connection to the agent whose ``address`` (bytes) this is; no store needed."""
        return self._agent.connect_address(bytes(address), qp_num)

    def peer(self, alias):
        """The live connection to ``alias`` (one this agent made, or the reply endpoint a peer's
        connection made here), else a new one, as ``connect_to`` would."""
        return self._agent.peer(alias)

    def _peer(self, peer):
        if isinstance(peer, PeerConnection):
            return peer
        if not isinstance(peer, str):
            raise TypeError("peer must be an alias (str) or a PeerConnection")
        return self._agent.peer(peer)

    def lanes(self, peer):
        """``{"messages": lane, "rma": lane, "atomics": lane}``, each ``"same_host"``, ``"tcp"`` or
        ``"rdma:<device>"``: the same on both sides. ``lanes_detail`` adds the devices and why."""
        return self._agent.lanes(peer)

    def lanes_detail(self, peer):
        return self._agent.lanes_detail(peer)

    def peers(self):
        """The aliases with a connection (live or wiring up)."""
        return self._agent.peers()

    def list_agents(self):
        """The aliases registered in the store under this agent's scope, sorted."""
        return self._agent.list_agents()

    # ---- memory ----
    def register_memory_region(self, name, ptr, offset=0, length=None):
        """Registers memory under ``name`` on every device and publishes it: ``ptr`` is an address
        (then ``length`` is needed), a buffer (bytearray, memoryview, mmap, NumPy array), a CPU
        tensor or an object exporting CPU memory through DLPack (``__dlpack__``); ``offset`` bytes
        are skipped. The object is kept alive while registered."""
        self._agent.register_memory_region(name, _registrable(ptr, "register_memory_region"), offset, length)

    def unregister_memory_region(self, name):
        self._agent.unregister_memory_region(name)

    def get_mr_info(self, peer, name):
        """A peer's region, ``{"addr", "length", "rkey", "handle"}``, asked of the peer over its
        wireup link (connecting first when needed); the store holds only a region's length."""
        import json
        return json.loads(self._agent.get_mr_info(peer, name))

    # ---- operations (peer: an alias or a PeerConnection) ----
    def write(self, peer, assignments):
        return self._peer(peer).write(assignments)

    def read(self, peer, assignments):
        return self._peer(peer).read(assignments)

    def write_with_imm(self, peer, assignments, imm_data=0):
        return self._peer(peer).write_with_imm(assignments, imm_data)

    def send(self, peer, chunks):
        return self._peer(peer).send(chunks)

    def recv(self, peer, chunks):
        return self._peer(peer).recv(chunks)

    def imm_recv(self, peer):
        return self._peer(peer).imm_recv()

    # ---- life ----
    def stats(self):
        """Wireup counters: requests, replies, acks, retries, duplicates dropped, peers gone..."""
        return self._agent.stats()

    def shutdown(self):
        """Says goodbye to the peers, fails pending operations with ferry.Cancelled, leaves the
        store. Idempotent."""
        self._agent.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    def __repr__(self):
        return "<ferry PeerAgent %r>" % (self.alias,)


def start_peer_agent(store=None, alias=None, device=None, scope=None, **options):
    """Starts a :class:`PeerAgent` (the keyword options are its own: connect_timeout, peer_timeout,
    secret, lanes, listen_host, listen_port, ...)."""
    return PeerAgent(alias=alias, store=store, device=device, scope=scope, **options)
