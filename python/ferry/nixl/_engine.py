"""``nixlAgent``: NIXL's low-level agent over ferry's agent layer.

**Why the agent layer.** Every NIXL peer is named by its metadata, connected on first use, and may be
written to before the wireup finished; it may also die. ferry's agent (python/ferry/agent) does all
of that: ``connect_address`` with the worker address carried in the metadata returns a connection at
once and queues operations until it is wired, remote regions are named by key and resolved by the
owner (``mr_query``, so regions registered after the metadata was sent work), a dead peer fails its
operations with ``ferry.PeerGone``, and the lanes are the best the two hosts share (same-host
memory, TCP, RDMA). The Endpoint API alone would need one hand-made endpoint per pair and none of
that.

**Why a side channel for notifications.** NIXL delivers a notification to any agent from any agent,
including one whose metadata the receiver never loaded, and a receiver needs no call posted to take
it. The agent's message channel is not reachable from Python and its two-sided messages need a
receive posted per peer. So each agent serves one small TCP listener (``_wire.FrameServer``), named in
its metadata; a sender keeps one connection per peer, so its notifications arrive in order. A
transfer's notification is sent once ferry reports the transfer complete (WRITE: the bytes are in
the target's memory), so it never arrives before the bytes. The same listener is NIXL's metadata
listener when ``useListenThread`` is set.

**Progress.** ferry's own threads move the bytes whether or not anyone polls. One asyncio loop per
agent, on its own thread, awaits every posted transfer that carries a notification (ferry's futures
are awaitable: an eventfd per loop, no polling) and sends the notification as soon as the transfer
completes; ``getXferStatus`` (and a repost) finalizes a completed request itself too, whichever
comes first. So no delivery depends on either side polling.

**Threads.** Every method may be called from any thread; state is under one lock that is never held
while waiting for the network or a transfer. Waits release the GIL (ferry's futures do).
"""

import asyncio
import collections
import ctypes
import itertools
import logging
import math
import os
import sys
import threading
import time
import weakref

import numpy as np

from .. import errors as _ferry_errors
from .._core import agent as _core_agent
from ..agent import PeerAgent
from . import _wire
from ._descs import DRAM_SEG, nixl_mem_t, nixlRegDList, nixlXferDList
from ._errors import (NIXL_IN_PROG, NIXL_SUCCESS, from_ferry, nixlBackendError, nixlInvalidParamError,
                      nixlNoTelemetryError, nixlNotAllowedError, nixlNotFoundError, nixlNotPostedError,
                      nixlNotSupportedError, nixlRemoteDisconnectError, nixlRepostActiveError)

_log = logging.getLogger("ferry.nixl")

PLUGINS = ("FERRY", "UCX")
NIXL_INIT_AGENT = ""
NIXL_READ = 0
NIXL_WRITE = 1
NIXL_COST_ANALYTICAL_BACKEND = 0

_ucx_logged = []
_TRUE = {"y", "yes", "on", "1", "true", "enable"}
_FALSE = {"n", "no", "off", "0", "false", "disable"}


def plugin_params():
    """The init parameters ferry's engine takes (string -> string, as NIXL's plugins report)."""
    return {"num_threads": "0", "device": "", "lanes": ""}


def _mem_name(t):
    try:
        return nixl_mem_t(int(t)).name
    except ValueError:
        return str(t)


def _cuda_driver():
    from .. import _core
    return _core.cuda()


def served_memory_types():
    """The memory types ferry's engine moves here: DRAM_SEG, and VRAM_SEG where CUDA's driver is
    usable (the engine then locates device memory through it and moves it as it moves host memory)."""
    return ["DRAM_SEG", "VRAM_SEG"] if _cuda_driver()["usable"] else ["DRAM_SEG"]


def check_memory_type(mem_type, what):
    """Returns for a memory type ferry's engine moves here; nixlNotFoundError naming it and why for
    any other: VRAM_SEG where CUDA's driver is not usable (with the driver's reason), storage types."""
    if int(mem_type) == DRAM_SEG:
        return
    name = _mem_name(mem_type)
    if int(mem_type) == nixl_mem_t.VRAM_SEG:
        driver = _cuda_driver()
        if driver["usable"]:
            return
        why = ("ferry's engine moves CUDA memory only where CUDA's driver is usable, and it is not here: %s "
               "(no device pointer is ever read as host memory)" % driver["reason"])
    else:
        why = "ferry's engine moves DRAM_SEG and VRAM_SEG only; storage memory types are not served"
    raise nixlNotFoundError("%s: no backend moves %s: %s" % (what, name, why))


def _serves_other_hosts():
    from .. import _core
    values = {r["name"]: r["value"] for r in _core.config()}
    return bool(values.get("FERRY_AGENT_SECRET")) or values.get("FERRY_AGENT_ALLOW_REMOTE", "").lower() in ("1", "on")


def _telemetry_enabled(config_flag):
    raw = os.environ.get("NIXL_TELEMETRY_ENABLE")
    if raw is None:
        return bool(config_flag)
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise nixlInvalidParamError("NIXL_TELEMETRY_ENABLE=%r: expected one of %s or %s"
                                % (raw, sorted(_TRUE), sorted(_FALSE)))


class nixlAgentConfig:
    """The low-level agent's options (positional order as NIXL's): progress thread, listener,
    listener port, sync mode, worker count, progress-thread delay, listener delay, telemetry."""

    def __init__(self, useProgThread=True, useListenThread=False, listenPort=0, syncMode=0, numWorkers=1,
                 pthrDelay=0, lthrDelay=100000, captureTelemetry=False):
        self.useProgThread = bool(useProgThread)
        self.useListenThread = bool(useListenThread)
        self.listenPort = int(listenPort)
        self.syncMode = syncMode
        self.numWorkers = int(numWorkers)
        self.pthrDelay = int(pthrDelay)
        self.lthrDelay = int(lthrDelay)
        self.captureTelemetry = bool(captureTelemetry)


class nixlXferTelemetry:
    """One finished request's telemetry: ``startTime`` (us since the epoch), ``postDuration`` and
    ``xferDuration`` (us, never 0 once done), ``totalBytes``, ``descCount``."""

    __slots__ = ("_v",)

    def __init__(self, startTime, postDuration, xferDuration, totalBytes, descCount):
        object.__setattr__(self, "_v", (startTime, postDuration, xferDuration, totalBytes, descCount))

    startTime = property(lambda self: self._v[0])
    postDuration = property(lambda self: self._v[1])
    xferDuration = property(lambda self: self._v[2])
    totalBytes = property(lambda self: self._v[3])
    descCount = property(lambda self: self._v[4])

    def __setattr__(self, name, value):
        raise AttributeError("nixlXferTelemetry is read-only")

    def __repr__(self):
        return ("nixlXferTelemetry(startTime=%d, postDuration=%d, xferDuration=%d, totalBytes=%d, descCount=%d)"
                % self._v)


class _RegionTable:
    """Registered ranges of one agent, looked up by address range without a Python loop per row."""

    def __init__(self):
        self.keys = []
        self.starts = np.zeros(0, dtype=np.uint64)
        self.ends = np.zeros(0, dtype=np.uint64)
        self._order = np.zeros(0, dtype=np.int64)

    def set(self, regions):
        """``regions``: list of (key, addr, len)."""
        self.keys = [r[0] for r in regions]
        self.starts = np.array([r[1] for r in regions], dtype=np.uint64)
        self.ends = self.starts + np.array([r[2] for r in regions], dtype=np.uint64)
        self._order = np.argsort(self.starts, kind="stable")

    def resolve(self, addrs, lens):
        """(region index per row, offset per row); index -1 where no region covers the range."""
        n = len(addrs)
        idx = np.full(n, -1, dtype=np.int64)
        if n == 0 or len(self.keys) == 0:
            return idx, np.zeros(n, dtype=np.uint64)
        ends = addrs + lens
        sorted_starts = self.starts[self._order]
        pos = np.searchsorted(sorted_starts, addrs, side="right") - 1
        ok = pos >= 0
        cand = self._order[np.where(ok, pos, 0)]
        ok &= (self.starts[cand] <= addrs) & (self.ends[cand] >= ends)
        idx[ok] = cand[ok]
        # Overlapping registrations: a nearer start may not cover a range a wider region does.
        for i in np.nonzero(~ok)[0]:
            hit = np.nonzero((self.starts <= addrs[i]) & (self.ends >= ends[i]))[0]
            if len(hit):
                idx[i] = hit[0]
        offsets = np.where(idx >= 0, addrs - self.starts[np.where(idx >= 0, idx, 0)], 0).astype(np.uint64)
        return idx, offsets


class _Remote:
    """What this agent knows of a peer: its metadata and, once used, its connection."""

    def __init__(self, name):
        self.name = name
        self.address = None
        self.notify = []
        self.regions = {}  # key -> (addr, len, devId)
        self.table = _RegionTable()
        self.conn = None
        self.sender = None

    def reindex(self):
        self.table.set([(k, v[0], v[1]) for k, v in self.regions.items()])


class _Side:
    """One prepared side of a transfer (prepXferDlist): the rows resolved to region keys."""

    def __init__(self, agent_name, rows, keys, key_index, offsets, loopback):
        self.agent_name = agent_name  # "" for local
        self.rows = rows
        self.keys = keys  # region key per distinct region
        self.key_index = key_index  # per row: index into keys
        self.offsets = offsets
        self.loopback = loopback
        self.released = False


class _Request:
    """A transfer request: what to move, and the state of its latest post."""

    def __init__(self, op, plan, assignments, remote_name, notif, total_bytes, desc_count, loopback):
        self.op = op
        self.plan = plan  # loopback: (local addr, target addr, length) per descriptor
        self.remote_name = remote_name
        self.assignments = assignments  # ferry's named assignments (built once, reused on every repost)
        self.notif = notif
        self.total_bytes = total_bytes
        self.desc_count = desc_count
        self.loopback = loopback
        self.lock = threading.Lock()
        self.future = None
        self.state = "INIT"  # INIT, PROC, DONE, ERR
        self.error = None
        self.cancelled = False
        self.post_notif = None
        self.t_start = 0.0
        self.t0 = 0.0
        self.post_us = 0
        self.xfer_us = 0
        self.released = False
        self.batches = [assignments]  # what one post sends: several lists for a request above BATCH_BYTES


# A request above BATCH_BYTES moves in batches of at most that many bytes, WINDOW of them in flight:
# what lets release_xfer_handle stop a running request instead of waiting for all of it.
BATCH_BYTES = 64 << 20
WINDOW = 4


def _batches(assignments, limit):
    """ferry's assignments (local, remote, local offset, remote offset, length) cut into lists of
    at most `limit` bytes each (a longer assignment is split across lists)."""
    out, cur, size = [], [], 0
    for lk, rk, lo, ro, n in assignments:
        if n == 0:
            cur.append((lk, rk, lo, ro, 0))
        while n > 0:
            take = min(n, limit - size)
            cur.append((lk, rk, lo, ro, take))
            lo, ro, n, size = lo + take, ro + take, n - take, size + take
            if size == limit:
                out.append(cur)
                cur, size = [], 0
    if cur:
        out.append(cur)
    return out


class _Pipeline:
    """One post of a request in batches: `window` of them in flight, the next posted (on the agent's
    loop thread) as the oldest ends. cancel() posts nothing more; wait() returns once the batches in
    flight ended, and then no byte of the request lands any more. Stands in for the engine's future
    of a one-batch post (done(), wait())."""

    def __init__(self, post, batches, loop, window, on_done):
        self._post = post
        self._waiting = collections.deque(batches)
        self._loop = loop
        self._window = window
        self._on_done = on_done
        self._lock = threading.Lock()
        self._inflight = collections.deque()
        self._stopped = False
        self._error = None
        self._done = threading.Event()

    def start(self):
        """Posts the first window from the caller's thread: a refusal of the first batch raises, as
        the post of a one-batch request does; a later one ends the request with that error."""
        self._inflight.append(self._post(self._waiting.popleft()))
        with self._lock:
            self._fill()
        asyncio.run_coroutine_threadsafe(self._pump(), self._loop)

    def _fill(self):
        while not self._stopped and self._waiting and len(self._inflight) < self._window:
            try:
                self._inflight.append(self._post(self._waiting.popleft()))
            except _ferry_errors.Error as e:
                self._fail(e)

    def _fail(self, error):
        if self._error is None:
            self._error = error
        self._stopped = True

    async def _pump(self):
        while True:
            with self._lock:
                if not self._inflight:
                    break
                oldest = self._inflight[0]
            try:
                await oldest
            except _ferry_errors.Error as e:
                with self._lock:
                    self._fail(e)
            with self._lock:
                if self._inflight and self._inflight[0] is oldest:  # else a poll() took it
                    self._inflight.popleft()
                self._fill()
        self._done.set()
        try:
            self._on_done()
        except Exception as e:  # noqa: BLE001  (logged: nobody is there to raise it to)
            _log.warning("ferry.nixl: completing a transfer: %s", e)

    def cancel(self):
        with self._lock:
            self._stopped = True

    def abandon(self):
        """The agent is closing: nothing more is posted and nobody waits for the loop."""
        self.cancel()
        self._done.set()

    def done(self):
        return self._done.is_set()

    def poll(self):
        """The step of a caller's poll loop (check_xfer_state): takes the completions of the batches
        in flight on the caller's thread and posts the next ones as the oldest end. Without it the
        window is refilled only when the agent's loop thread gets the interpreter, which a caller
        spinning on check_xfer_state hands over every few milliseconds: a request of many batches
        then moved at a third of the engine's rate. The loop thread still ends the request."""
        if self._done.is_set():
            return True
        with self._lock:
            while self._inflight and self._inflight[0].poll():
                finished = self._inflight.popleft()
                try:
                    finished.check()
                except _ferry_errors.Error as e:
                    self._fail(e)
                self._fill()
        return self._done.is_set()

    def check(self):
        """As the engine's futures: whether the post ended, raising its error when it failed."""
        if not self._done.is_set():
            return False
        if self._error is not None:
            raise self._error
        return True

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            raise _ferry_errors.TimedOut("the transfer did not end within %s s" % timeout)
        if self._error is not None:
            raise self._error
        return 0


def _us(seconds):
    return max(1, int(math.ceil(seconds * 1e6)))


_live_agents = weakref.WeakSet()


class nixlAgent:
    """NIXL's low-level agent (``nixl._bindings.nixlAgent``), served by ferry's engine."""

    _ids = itertools.count(1)

    def __init__(self, name, cfg=None):
        if isinstance(name, bytes):
            name = name.decode()
        if not isinstance(name, str) or not name:
            raise nixlInvalidParamError("agent name must be a non-empty str")
        self._name = name
        self._cfg = cfg if cfg is not None else nixlAgentConfig()
        self._telemetry = _telemetry_enabled(getattr(self._cfg, "captureTelemetry", False))
        self._lock = threading.RLock()
        self._backends = {}  # handle -> (type, params)
        self._regions = {}  # key -> (addr, len, devId)
        self._readonly = set()  # keys of regions registered from read-only memory
        self._vram = set()  # keys of regions registered as VRAM_SEG (never touched by this process)
        self._table = _RegionTable()
        self._remotes = {}
        self._notifs = {}
        self._sides = {}
        self._requests = {}
        self._handle_ids = itertools.count(1)
        self._keys = itertools.count(1)
        self._closed = False
        self._etcd = _central_store()  # (Store, namespace) when NIXL_ETCD_ENDPOINTS is set, else None
        self._engine = PeerAgent(alias=name)
        listen = bool(getattr(self._cfg, "useListenThread", False))
        port = int(getattr(self._cfg, "listenPort", 0)) if listen else 0
        # The metadata listener listens on every address, as NIXL's does. The notification channel
        # alone listens on loopback unless the agent serves other hosts (FERRY_AGENT_SECRET or
        # FERRY_AGENT_ALLOW_REMOTE). Either way the agent's own rule holds (docs/security.md): without
        # them, peers of this host only; with a secret, every frame carries its MAC (_wire.py).
        self._server = _wire.FrameServer("" if listen or _serves_other_hosts() else "127.0.0.1", port,
                                         self._on_frame, this_host_only=not _serves_other_hosts())
        if listen and port == 0 and os.environ.get("NIXL_LOG_LEVEL", "INFO").upper() in ("INFO", "DEBUG", "TRACE"):
            sys.stderr.write("MD listener is listening on port %d\n" % self._server.port)
            sys.stderr.flush()
        self._loop = None
        self._loop_ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="ferry.nixl progress %s" % name, daemon=True)
        self._thread.start()
        self._loop_ready.wait()
        _live_agents.add(self)

    # ---- life ----
    def _run_loop(self):
        self._loop = asyncio.new_event_loop()
        self._loop_ready.set()
        self._loop.run_forever()

    def close(self):
        """Ends the listener, the progress thread and the engine. Idempotent; never blocks long."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            remotes = list(self._remotes.values())
        self._server.close()
        with self._lock:
            pipelines = [r.future for r in self._requests.values() if isinstance(r.future, _Pipeline)]
        for p in pipelines:
            p.abandon()
        for r in remotes:
            if r.sender is not None:
                r.sender.close()
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:
            pass
        try:
            self._engine.shutdown()
        except _ferry_errors.Error as e:
            _log.debug("ferry.nixl: engine shutdown: %s", e)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _notify_addresses(self):
        host = self._server.host
        if host in ("", "0.0.0.0", "::"):
            import socket
            try:
                ip = socket.gethostbyname(socket.gethostname())
            except OSError:
                ip = "127.0.0.1"
            return [("127.0.0.1", self._server.port)] + ([(ip, self._server.port)] if ip != "127.0.0.1" else [])
        return [(host, self._server.port)]

    # ---- plugins and backends ----
    def getAvailPlugins(self):
        return list(PLUGINS)

    def getPluginParams(self, type):
        if type not in PLUGINS:
            raise nixlNotFoundError("no plugin named %r: ferry serves %s" % (type, ", ".join(PLUGINS)))
        return plugin_params(), served_memory_types()

    def getBackendParams(self, backend):
        with self._lock:
            if backend not in self._backends:
                raise nixlNotFoundError("no backend with handle %r" % (backend,))
            return dict(self._backends[backend][1]), served_memory_types()

    def createBackend(self, type, initParams=None):
        if type not in PLUGINS:
            raise nixlNotFoundError("no plugin named %r: ferry serves %s" % (type, ", ".join(PLUGINS)))
        params = plugin_params()
        params.update({str(k): str(v) for k, v in (initParams or {}).items()})
        with self._lock:
            if any(t == type for t, _ in self._backends.values()):
                raise nixlInvalidParamError("agent %r already has a %s backend" % (self._name, type))
            handle = next(self._handle_ids)
            self._backends[handle] = (type, params)
        if type == "UCX" and not _ucx_logged:
            _ucx_logged.append(True)
            _log.info("ferry.nixl: the UCX backend is served by ferry's engine (same-host memory, TCP, RDMA)")
        return handle

    def _backend_type(self, handle):
        return self._backends[handle][0] if handle in self._backends else None

    # ---- memory ----
    def registerMem(self, descs, backends=(), owners=None):
        """Registers each descriptor as one ferry region. ``owners`` (ferry.nixl's own argument):
        per descriptor, the object that holds its memory or None; a region registered from its
        object keeps it alive and keeps read-only memory (bytes, a read-only array) read-only,
        which an address alone cannot say."""
        if not isinstance(descs, nixlRegDList):
            raise TypeError("registerMem takes a nixlRegDList")
        check_memory_type(descs.getType(), "registerMem")
        device = descs.getType() == nixl_mem_t.VRAM_SEG
        with self._lock:
            if not self._backends:
                raise nixlNotFoundError("registerMem: agent %r has no backend to register with (create_backend)"
                                        % self._name)
        done = []
        try:
            for i, (addr, length, dev) in enumerate(descs.rows().tolist()):
                if length == 0:
                    raise nixlInvalidParamError("registerMem: descriptor (%#x, 0, %d) is empty" % (addr, dev))
                key = "nixl.%d" % next(self._keys)
                try:
                    owner = owners[i] if owners is not None else None
                    if owner is not None:
                        self._engine.register_memory_region(key, owner)
                        if _is_readonly(owner):
                            with self._lock:
                                self._readonly.add(key)
                    else:
                        self._engine.register_memory_region(key, addr, 0, length)
                except _ferry_errors.Error as e:
                    raise from_ferry(e, "registerMem of (%#x, %d, %d)" % (addr, length, dev)) from None
                done.append(key)
                with self._lock:
                    self._regions[key] = (addr, length, dev)
                    if device:
                        self._vram.add(key)
        except BaseException:
            for key in done:
                self._unregister(key)
            raise
        finally:
            self._reindex()
        return NIXL_SUCCESS

    def _unregister(self, key):
        with self._lock:
            self._regions.pop(key, None)
            self._readonly.discard(key)
            self._vram.discard(key)
        try:
            self._engine.unregister_memory_region(key)
        except _ferry_errors.Error as e:
            _log.warning("ferry.nixl: unregistering %s: %s", key, e)

    def _reindex(self):
        with self._lock:
            self._table.set([(k, v[0], v[1]) for k, v in self._regions.items()])

    def deregisterMem(self, descs, backends=()):
        if not isinstance(descs, nixlRegDList):
            raise TypeError("deregisterMem takes a nixlRegDList")
        with self._lock:
            keys = []
            taken = set()
            for addr, length, dev in descs.rows().tolist():
                key = next((k for k, v in self._regions.items() if v == (addr, length, dev) and k not in taken), None)
                if key is None:
                    raise nixlNotFoundError("deregisterMem: (%#x, %d, %d) is not registered with agent %r"
                                            % (addr, length, dev, self._name))
                taken.add(key)
                keys.append(key)
        for key in keys:
            self._unregister(key)
        self._reindex()
        return NIXL_SUCCESS

    def queryMem(self, descs, backend):
        raise nixlNotSupportedError("queryMem: ferry's engine serves no storage backend")

    # ---- metadata ----
    def _metadata(self, regions, with_conn, partial=False):
        return _wire.encode_metadata(self._name, self._engine.address if with_conn else None,
                                     self._notify_addresses(), regions, partial=partial)

    def getLocalMD(self):
        with self._lock:
            regions = [(k,) + v for k, v in self._regions.items()]
        return self._metadata(regions, True)

    def getLocalPartialMD(self, descs, inc_conn_info=False, backends=()):
        with self._lock:
            regions = []
            if descs is not None:
                for addr, length, dev in descs.rows().tolist():
                    hit = [(k,) + v for k, v in self._regions.items()
                           if v[0] <= addr and addr + length <= v[0] + v[1]]
                    if not hit:
                        raise nixlNotFoundError("getLocalPartialMD: (%#x, %d, %d) is not registered with agent %r"
                                                % (addr, length, dev, self._name))
                    regions.append(hit[0])
        return self._metadata(regions, inc_conn_info, partial=True)

    def loadRemoteMD(self, metadata):
        md = _wire.decode_metadata(metadata)
        name = md["name"]
        with self._lock:
            remote = self._remotes.get(name)
            if md["address"] is None and remote is None:
                raise nixlNotFoundError("metadata of agent %r carries no connection information and none was "
                                        "loaded before" % name)
            if remote is None or (md["address"] is not None and md["address"] != remote.address):
                fresh = _Remote(name)
                if remote is not None and md["partial"]:
                    fresh.regions = dict(remote.regions)
                if remote is not None and remote.sender is not None:
                    remote.sender.close()
                remote = self._remotes[name] = fresh
            if md["address"] is not None:
                remote.address = md["address"]
                remote.notify = md["notify"]
            if not md["partial"]:
                remote.regions = {}
            for key, addr, length, dev in md["regions"]:
                remote.regions[key] = (addr, length, dev)
            remote.reindex()
        return name.encode()

    def invalidateRemoteMD(self, remote_agent):
        name = _name(remote_agent)
        with self._lock:
            remote = self._remotes.pop(name, None)
        if remote is not None and remote.sender is not None:
            remote.sender.close()
        return NIXL_SUCCESS

    def checkRemoteMD(self, remote_agent, descs=None):
        name = _name(remote_agent)
        with self._lock:
            remote = self._remotes.get(name)
            if remote is None or remote.address is None:
                return False
            if descs is None or descs.descCount() == 0:
                return True
            rows = descs.rows()
            idx, _ = remote.table.resolve(rows[:, 0], rows[:, 1])
            return bool((idx >= 0).all())

    def _remote(self, name, what):
        with self._lock:
            remote = self._remotes.get(name)
        if remote is None:
            raise nixlNotFoundError("%s: no metadata of agent %r is loaded (add_remote_agent)" % (what, name))
        return remote

    # ---- the side channel: metadata listener and notifications ----
    def _on_frame(self, header, body, sock):
        kind = header["type"]
        if kind == "notif":
            with self._lock:
                self._notifs.setdefault(header["from"], []).append(bytes(body))
        elif kind == "md":
            try:
                self.loadRemoteMD(body)
            except Exception as e:
                _log.warning("ferry.nixl: metadata pushed by %r refused: %s", header["from"], e)
        elif kind == "fetch":
            wanted = header.get("name")
            md = self.getLocalMD() if wanted == self._name else b""
            sock.sendall(_wire.pack_frame("md", self._name, md))
        elif kind == "invalidate":
            self.invalidateRemoteMD(header["from"])
        else:
            raise ValueError("unknown frame type %r" % kind)

    def _sender(self, remote):
        with self._lock:
            if remote.sender is None:
                if not remote.notify:
                    raise nixlNotFoundError("agent %r: its metadata names no notification channel" % remote.name)
                remote.sender = _wire.FrameSender(remote.notify)
            return remote.sender

    def _send_notif(self, name, msg):
        if name == self._name:
            with self._lock:
                self._notifs.setdefault(name, []).append(bytes(msg))
            return
        remote = self._remote(name, "genNotif")
        frame = _wire.pack_frame("notif", self._name, msg)
        try:
            self._sender(remote).send(frame)
        except OSError as e:
            raise nixlRemoteDisconnectError("notification to agent %r: %s" % (name, e)) from None

    def genNotif(self, remote_agent, msg, backend=None):
        self._send_notif(_name(remote_agent), _bytes(msg))
        return NIXL_SUCCESS

    def getNotifs(self, notif_map=None, backends=()):
        with self._lock:
            new, self._notifs = self._notifs, {}
        if notif_map is not None:
            for k, v in new.items():
                notif_map.setdefault(k, []).extend(v)
            return notif_map
        return new

    def _async(self, fn, what):
        def run():
            try:
                fn()
            except Exception as e:
                _log.info("ferry.nixl: %s: %s", what, e)
        threading.Thread(target=run, name="ferry.nixl " + what, daemon=True).start()

    # Without an address, metadata goes through etcd (NIXL_ETCD_ENDPOINTS), as NIXL's does: an
    # agent's metadata under {namespace}{agent}/{label}, the full one under the label "metadata".
    def _etcd_key(self, agent, label, what):
        if self._etcd is None:
            raise nixlNotSupportedError("%s without ip_addr uses etcd: set NIXL_ETCD_ENDPOINTS (e.g. "
                                        "http://127.0.0.1:2379) before creating the agent, or give ip_addr "
                                        "and port" % what)
        return "%s%s/%s" % (self._etcd[1], agent, label or ETCD_METADATA_LABEL)

    def sendLocalMD(self, ip_addr="", port=0):
        md = self.getLocalMD()
        if not ip_addr:
            key = self._etcd_key(self._name, "", "sendLocalMD")
            self._async(lambda: self._etcd[0].set(key, md), "publishing metadata to etcd at %s" % key)
            return
        self._async(lambda: _wire.request(ip_addr, port, _wire.pack_frame("md", self._name, md), False),
                    "sending metadata to %s:%d" % (ip_addr, port))

    def sendLocalPartialMD(self, descs, inc_conn_info=False, backends=(), ip_addr="", port=0, label=""):
        md = self.getLocalPartialMD(descs, inc_conn_info, backends)
        if not ip_addr:
            if not label or label == ETCD_METADATA_LABEL:
                raise nixlInvalidParamError("sendLocalPartialMD to etcd needs a label of its own (not %r)"
                                            % ETCD_METADATA_LABEL)
            key = self._etcd_key(self._name, label, "sendLocalPartialMD")
            self._async(lambda: self._etcd[0].set(key, md), "publishing partial metadata to etcd at %s" % key)
            return
        self._async(lambda: _wire.request(ip_addr, port, _wire.pack_frame("md", self._name, md), False),
                    "sending partial metadata to %s:%d" % (ip_addr, port))

    def fetchRemoteMD(self, remote_agent, ip_addr="", port=0, label=""):
        name = _name(remote_agent)
        if not ip_addr:
            key = self._etcd_key(name, label, "fetchRemoteMD")

            def watch():
                md = self._etcd[0].wait(key, ETCD_WATCH_TIMEOUT)
                if md is None:
                    raise nixlNotFoundError("no metadata at %s in etcd within %g s" % (key, ETCD_WATCH_TIMEOUT))
                self.loadRemoteMD(md)

            self._async(watch, "fetching %r's metadata from etcd" % name)
            return

        def fetch():
            reply = _wire.request(ip_addr, port, _wire.pack_frame("fetch", self._name, name=name), True)
            if reply is None or not reply[1]:
                raise nixlNotFoundError("the listener at %s:%d does not serve agent %r" % (ip_addr, port, name))
            self.loadRemoteMD(reply[1])

        self._async(fetch, "fetching %r's metadata from %s:%d" % (name, ip_addr, port))

    def invalidateLocalMD(self, ip_addr="", port=0):
        if not ip_addr:
            prefix = self._etcd_key(self._name, "", "invalidateLocalMD").rsplit("/", 1)[0] + "/"

            def erase_all():
                for key, _ in self._etcd[0].list(prefix):
                    self._etcd[0].erase(key)

            self._async(erase_all, "removing our metadata from etcd under %s" % prefix)
            return
        self._async(lambda: _wire.request(ip_addr, port, _wire.pack_frame("invalidate", self._name), False),
                    "invalidating our metadata at %s:%d" % (ip_addr, port))

    def makeConnection(self, remote_agent, backends=()):
        name = _name(remote_agent)
        if name != self._name:
            self._connection(self._remote(name, "makeConnection"))

    def _connection(self, remote):
        with self._lock:
            conn = remote.conn
        if conn is None:
            try:
                conn = self._engine.connect_address(remote.address)
            except _ferry_errors.Error as e:
                raise from_ferry(e, "connecting to agent %r" % remote.name) from None
            with self._lock:
                if remote.conn is None:
                    remote.conn = conn
                conn = remote.conn
        return conn

    # ---- transfers ----
    def prepXferDlist(self, agent_name, descs, backends=()):
        if not isinstance(descs, nixlXferDList):
            raise TypeError("prepXferDlist takes a nixlXferDList")
        check_memory_type(descs.getType(), "prepXferDlist")
        name = _name(agent_name)
        rows = descs.rows()
        if name in ("", "NIXL_INIT_AGENT"):
            return self._side("", rows, self._local_table(), "local", loopback=False)
        if name == self._name:
            return self._side(name, rows, self._local_table(), "loopback", loopback=True)
        remote = self._remote(name, "prepXferDlist")
        with self._lock:
            keys, table = remote.table.keys, remote.table
        return self._side(name, rows, (keys, table), "agent %r" % name, loopback=False)

    def _local_table(self):
        with self._lock:
            return self._table.keys, self._table

    def _side(self, name, rows, keys_table, where, loopback):
        keys, table = keys_table
        idx, offsets = table.resolve(rows[:, 0], rows[:, 1])
        if (idx < 0).any():
            bad = int(np.nonzero(idx < 0)[0][0])
            a, n, d = (int(x) for x in rows[bad])
            raise nixlNotFoundError("descriptor %d (%#x, %d, %d) is outside every registration of %s"
                                    % (bad, a, n, d, where))
        side = _Side(name, rows, list(keys), idx, offsets, loopback)
        with self._lock:
            h = next(self._handle_ids)
            self._sides[h] = side
        return h

    def releasedDlistH(self, handle):
        with self._lock:
            side = self._sides.pop(handle, None)
        if side is None:
            raise nixlNotFoundError("no prepared descriptor list with handle %r" % (handle,))
        return NIXL_SUCCESS

    def makeXferReq(self, operation, local_side, local_indices, remote_side, remote_indices, notif_msg=b"",
                    backends=(), skip_desc_merge=False):
        with self._lock:
            local = self._sides.get(local_side)
            remote = self._sides.get(remote_side)
        if local is None or remote is None:
            raise nixlNotFoundError("makeXferReq: unknown prepared list handle %r" % (local_side if local is None
                                                                                       else remote_side,))
        if local.agent_name != "":
            raise nixlInvalidParamError("makeXferReq: the local side must be prepared for the local agent")
        li = _indices(local_indices, len(local.rows), "local_indices")
        ri = _indices(remote_indices, len(remote.rows), "remote_indices")
        if len(li) != len(ri):
            raise nixlInvalidParamError("makeXferReq: %d local and %d remote indices" % (len(li), len(ri)))
        return self._request(operation, local, li, remote, ri, notif_msg)

    def createXferReq(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"", backends=()):
        if operation not in (NIXL_READ, NIXL_WRITE):
            raise nixlInvalidParamError("operation must be NIXL_READ or NIXL_WRITE")
        for d in (local_descs, remote_descs):
            if not isinstance(d, nixlXferDList):
                raise TypeError("createXferReq takes two nixlXferDList")
        if local_descs.descCount() != remote_descs.descCount():
            raise nixlInvalidParamError("createXferReq: %d local and %d remote descriptors"
                                        % (local_descs.descCount(), remote_descs.descCount()))
        self._check_lengths(local_descs.rows(), remote_descs.rows())
        name = _name(remote_agent)
        if name in ("", "NIXL_INIT_AGENT"):
            raise nixlInvalidParamError("createXferReq: name the remote agent (or this agent for a loopback)")
        l_h = self.prepXferDlist("", local_descs)
        r_h = self.prepXferDlist(name, remote_descs)
        try:
            n = local_descs.descCount()
            all_rows = np.arange(n, dtype=np.int64)
            return self._request(operation, self._sides[l_h], all_rows, self._sides[r_h], all_rows, notif_msg)
        finally:
            self.releasedDlistH(l_h)
            self.releasedDlistH(r_h)

    @staticmethod
    def _check_lengths(lrows, rrows):
        bad = np.nonzero(lrows[:, 1] != rrows[:, 1])[0]
        if len(bad):
            i = int(bad[0])
            raise nixlInvalidParamError("descriptor %d: local length %d and remote length %d differ"
                                        % (i, int(lrows[i, 1]), int(rrows[i, 1])))

    def _request(self, operation, local, li, remote, ri, notif_msg):
        if operation not in (NIXL_READ, NIXL_WRITE):
            raise nixlInvalidParamError("operation must be NIXL_READ or NIXL_WRITE")
        lrows, rrows = local.rows[li], remote.rows[ri]
        self._check_lengths(lrows, rrows)
        lengths = lrows[:, 1]
        total = int(lengths.sum()) if len(lengths) else 0
        if remote.loopback:
            # One process: the bytes move by memmove between this agent's own registrations.
            laddr, raddr = lrows[:, 0], rrows[:, 0]
            plan = list(zip(laddr.tolist(), raddr.tolist(), lengths.tolist()))
            req = _Request(operation, plan, None, self._name, _bytes(notif_msg), total, len(li), True)
        else:
            lk, rk = local.key_index[li], remote.key_index[ri]
            lo, ro = local.offsets[li], remote.offsets[ri]
            lkeys = [local.keys[i] for i in lk.tolist()]
            rkeys = [remote.keys[i] for i in rk.tolist()]
            tuples = list(zip(lkeys, rkeys, lo.tolist(), ro.tolist(), lengths.tolist()))
            req = _Request(operation, None, tuples, remote.agent_name, _bytes(notif_msg), total, len(li), False)
            req.batches = _batches(tuples, BATCH_BYTES) if total > BATCH_BYTES else [tuples]
        with self._lock:
            h = next(self._handle_ids)
            self._requests[h] = req
        return h

    def _req(self, handle):
        req = self._requests.get(handle)  # one dict lookup: atomic, no lock needed
        if req is None:
            raise nixlNotFoundError("no transfer request with handle %r" % (handle,))
        return req

    def postXferReq(self, handle, notif_msg=None):
        req = self._req(handle)
        if req.state == "PROC":
            self._finalize(req)  # a request nobody polled since it completed
        with req.lock:
            if req.state == "PROC":
                raise nixlRepostActiveError("the request is still running: wait for DONE before posting it again")
            req.post_notif = req.notif if notif_msg is None else _bytes(notif_msg)
            req.error = None
            req.cancelled = False
            timed = self._telemetry  # the clock is read only for telemetry
            if timed:
                req.t_start = time.time()
                req.t0 = time.perf_counter()
            if req.loopback:
                self._post_loopback(req)
            elif not req.assignments:
                req.future = None
                req.state = "PROC"
            else:
                remote = self._remotes.get(req.remote_name)  # atomic: the lock is for updates
                conn = remote.conn if remote is not None else None
                if conn is None:
                    conn = self._connection(self._remote(req.remote_name, "postXferReq"))
                try:
                    post = conn.read if req.op == NIXL_READ else conn.write
                    if len(req.batches) == 1:
                        req.future = post(req.assignments)
                    else:
                        req.future = _Pipeline(post, req.batches, self._loop, WINDOW, lambda: self._finalize(req))
                        req.future.start()
                except _ferry_errors.Error as e:
                    req.state = "ERR"
                    raise from_ferry(e, "posting a transfer to agent %r" % req.remote_name) from None
                req.state = "PROC"
            if timed:
                req.post_us = _us(time.perf_counter() - req.t0)
            # A same-host transfer is often done within its post: one poll takes its completion.
            if req.state == "PROC" and (req.future is None or req.future.poll()):
                self._finalize_locked(req)
        if req.state == "PROC" and req.post_notif and not isinstance(req.future, _Pipeline):
            # A pipeline finalizes itself. Only a notification needs completion to be acted on
            # without anyone polling; a request without one is finalized by the next getXferStatus
            # (waking the loop thread costs more than the transfer of a small request).
            asyncio.run_coroutine_threadsafe(self._watch(req, req.future), self._loop)
        return NIXL_SUCCESS if req.state == "DONE" else NIXL_IN_PROG if req.state == "PROC" else self._raise(req)

    def _post_loopback(self, req):
        """Moves the bytes of a request to this agent itself (memmove), after checking that both
        ranges are still registered, neither is VRAM (memmove would read a device pointer as host
        memory) and the landing one is writable."""
        with self._lock:
            table, readonly, vram = self._table, set(self._readonly), set(self._vram)
        plan = np.array(req.plan, dtype=np.uint64).reshape(-1, 3)
        for col, lands in ((0, req.op == NIXL_READ), (1, req.op == NIXL_WRITE)):
            idx, _ = table.resolve(plan[:, col], plan[:, 2])
            if (idx < 0).any():
                bad = int(np.nonzero(idx < 0)[0][0])
                req.state = "ERR"
                raise nixlNotFoundError("loopback: (%#x, %d) is no longer registered"
                                        % (int(plan[bad, col]), int(plan[bad, 2])))
            if any(table.keys[i] in vram for i in idx.tolist()):
                req.state = "ERR"
                raise nixlNotSupportedError("loopback: a transfer within one agent is a host memmove, and part of "
                                            "it is VRAM_SEG memory; move it with a second agent")
            if lands and any(table.keys[i] in readonly for i in idx.tolist()):
                req.state = "ERR"
                raise nixlInvalidParamError("loopback: the landing memory is registered read-only")
        for laddr, raddr, n in req.plan:
            if req.op == NIXL_WRITE:
                ctypes.memmove(raddr, laddr, n)
            else:
                ctypes.memmove(laddr, raddr, n)
        req.future = None
        req.state = "PROC"

    async def _watch(self, req, future):
        try:
            await future
        except Exception:
            pass
        try:
            self._finalize(req)
        except Exception as e:
            _log.warning("ferry.nixl: completing a transfer to %r: %s", req.remote_name, e)

    def _finalize(self, req):
        """Moves a completed post to DONE or ERR and sends its notification: once per post."""
        with req.lock:
            self._finalize_locked(req)

    def _finalize_locked(self, req):
        if req.state != "PROC":
            return
        if req.future is not None:
            try:
                if not req.future.check():
                    return
            except _ferry_errors.Error as e:
                req.error = from_ferry(e, "transfer with agent %r" % req.remote_name)
        if req.error is None and req.post_notif and not req.cancelled:
            try:
                self._send_notif(req.remote_name, req.post_notif)
            except (nixlRemoteDisconnectError, nixlNotFoundError) as e:
                req.error = e
        if self._telemetry:
            req.xfer_us = max(req.post_us, _us(time.perf_counter() - req.t0))
        req.state = "ERR" if req.error is not None else "DONE"

    def _raise(self, req):
        raise req.error if req.error is not None else nixlBackendError("transfer failed")

    def getXferStatus(self, handle):
        req = self._req(handle)
        if req.state == "PROC":
            # The caller polls: take the completions that are there on its thread (a waiting loop
            # of check_xfer_state then costs no wake-up of the engine's thread).
            if req.future is not None:
                req.future.poll()
            self._finalize(req)
        if req.state == "DONE":
            return NIXL_SUCCESS
        if req.state == "PROC":
            return NIXL_IN_PROG
        if req.state == "ERR":
            self._raise(req)
        raise nixlNotPostedError("the request was never posted (transfer)")

    def releaseXferReq(self, handle):
        """Frees a request. A running one is stopped: nothing more of it is posted, the batches in
        flight (at most WINDOW x BATCH_BYTES) are waited for, and when this returns no byte of it
        lands any more; its notification is not sent."""
        req = self._req(handle)
        with req.lock:
            req.cancelled = True
            future = req.future if req.state == "PROC" else None
        if isinstance(future, _Pipeline):
            future.cancel()
        if future is not None:
            try:
                future.wait()
            except _ferry_errors.Error:
                pass
            self._finalize(req)
        with self._lock:
            self._requests.pop(handle, None)
        req.released = True
        return NIXL_SUCCESS

    def getXferTelemetry(self, handle):
        req = self._req(handle)
        if not self._telemetry:
            raise nixlNoTelemetryError("telemetry is off for agent %r (NIXL_TELEMETRY_ENABLE or capture_telemetry)"
                                       % self._name)
        if req.state != "DONE":
            raise nixlNotAllowedError("telemetry is ready once the request is DONE")
        return nixlXferTelemetry(int(req.t_start * 1e6), req.post_us, req.xfer_us, req.total_bytes, req.desc_count)

    def estimateXferCost(self, handle):
        req = self._req(handle)
        # A plain model: 10 GB/s and 5 us per request.
        duration = 5 + req.total_bytes / 10e3
        return int(duration), int(duration / 2), NIXL_COST_ANALYTICAL_BACKEND

    def queryXferBackend(self, handle):
        """The backend handle serving the request: ferry's one engine serves every backend, so the
        first one created."""
        self._req(handle)
        with self._lock:
            return next(iter(self._backends), 0)

    def prepMemView(self, *args, **kwargs):
        raise nixlNotSupportedError("memory views are a GPU-initiated transfer feature, which ferry does not serve")

    releaseMemView = prepMemView


def _is_readonly(obj):
    try:
        return memoryview(obj).readonly
    except TypeError:
        return False


def _name(n):
    if isinstance(n, (bytes, bytearray)):
        return bytes(n).decode()
    if isinstance(n, str):
        return n
    raise TypeError("an agent name is str or bytes, not %s" % type(n).__name__)


def _bytes(msg):
    if msg is None:
        return b""
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise TypeError("a notification is bytes or str, not %s" % type(msg).__name__)


ETCD_METADATA_LABEL = "metadata"  # the label of an agent's full metadata in etcd
ETCD_WATCH_TIMEOUT = 5.0  # seconds fetch_remote_metadata waits for a key etcd does not hold yet


def _central_store():
    """(ferry's etcd store, namespace) from NIXL_ETCD_ENDPOINTS and NIXL_ETCD_NAMESPACE, or None.

    NIXL takes a comma-separated list of endpoints such as ``http://127.0.0.1:2379``; ferry's etcd
    client speaks to one, the first. A malformed value is a nixlInvalidParamError at agent creation."""
    endpoints = os.environ.get("NIXL_ETCD_ENDPOINTS", "").strip()
    if not endpoints:
        return None
    first = endpoints.split(",")[0].strip()
    scheme, sep, rest = first.partition("://")
    if not sep:
        scheme, rest = "http", first
    host, _, port = rest.rstrip("/").rpartition(":")
    if scheme != "http" or not host or not port.isdigit() or "/" in host:
        raise nixlInvalidParamError("NIXL_ETCD_ENDPOINTS: %r is not http://host:port (ferry's etcd client speaks "
                                    "plain HTTP)" % first)
    namespace = os.environ.get("NIXL_ETCD_NAMESPACE", "/nixl/agents/")
    if not namespace.endswith("/"):
        namespace += "/"
    try:
        store = _core_agent.Store("etcd://%s:%s" % (host, port))
    except _ferry_errors.Error as e:
        raise from_ferry(e, "NIXL_ETCD_ENDPOINTS") from None
    return store, namespace


def _indices(indices, count, what):
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise nixlInvalidParamError("%s must be one-dimensional" % what)
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise nixlInvalidParamError("%s must be integers" % what)
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= count:
        raise nixlInvalidParamError("%s: an index outside 0 .. %d" % (what, count - 1))
    return arr


def close_all():
    for a in list(_live_agents):
        try:
            a.close()
        except Exception:
            pass
