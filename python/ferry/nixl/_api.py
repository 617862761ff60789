"""``nixl._api``: NIXL's Pythonic agent, name for name, over ferry's engine.

``nixl_agent`` builds its low-level agent through ``_bindings.nixlAgent``, looked up on the module
at call time (NIXL's tests substitute it). Backends ``FERRY`` and ``UCX`` are one engine (ferry's
agent layer: same-host memory, TCP, RDMA); an agent using one interoperates with a peer using the
other. DRAM moves everywhere; VRAM (a CUDA tensor, a CUDA array exporting
``__cuda_array_interface__``, VRAM descriptors) where CUDA's driver is usable, registered by address
as DRAM is; elsewhere VRAM, like the storage memory types, is refused with ``nixlNotFoundError``
naming the type and the driver's reason.
"""

import enum
import pickle

import numpy as np

from . import _bindings
from ._engine import close_all as _close_all
from ._engine import check_memory_type as _check_memory_type
from .logging import get_logger

# What transfer() and check_xfer_state() answer for the engine's status.
_STATES = {_bindings.NIXL_SUCCESS: "DONE", _bindings.NIXL_IN_PROG: "PROC"}

logger = get_logger(__name__)

DEFAULT_COMM_PORT = _bindings.DEFAULT_COMM_PORT
nixlBind = _bindings  # the name LightLLM imports

# Opaque backend handle: an int, never interpreted by the user.
nixl_backend_handle = int


class nixl_thread_sync_t(enum.Enum):
    """Thread synchronisation modes. ferry.nixl is safe from any thread in every mode."""

    NIXL_THREAD_SYNC_NONE = _bindings.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = _bindings.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = _bindings.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = _bindings.NIXL_THREAD_SYNC_DEFAULT


class nixl_agent_config:
    """Options of a :class:`nixl_agent` (positional order as NIXL's).

    ``enable_prog_thread`` is accepted (ferry's own threads progress everything whether or not
    anyone polls); ``enable_listen_thread`` starts the metadata listener on ``listen_port`` (0: the
    system picks one and it is printed on stderr); ``num_threads`` is passed to each backend."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=DEFAULT_COMM_PORT,
                 capture_telemetry=False, num_threads=0, backends=None, sync_mode=None):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError("sync_mode must be a nixl_thread_sync_t, not %s" % type(sync_mode).__name__)
        self.backends = ["UCX"] if backends is None else backends
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode


class _Handle:
    """An opaque request or prepared-list handle: ``release()`` frees it (also when collected)."""

    def __init__(self, agent, handle):
        self._agent = agent
        self._handle = handle
        self._released = False

    def __repr__(self):
        return "<%s 0x%x%s>" % (type(self).__name__, self._handle, " released" if self._released else "")

    def __int__(self):
        return self._handle


class nixl_xfer_handle(_Handle):
    """A transfer request (``initialize_xfer`` / ``make_prepped_xfer``)."""

    def release(self):
        """Frees the request. A running request is waited for until it settled (ferry cannot recall
        bytes already handed to the transport); its notification is then not sent."""
        if not self._released:
            self._agent.release_xfer_handle(self)

    def __del__(self):
        if getattr(self, "_released", True):
            return
        try:
            self._agent.release_xfer_handle(self)
        except Exception:
            try:
                logger.error("nixl_xfer_handle 0x%x: release failed; kept in the agent's leak list", self._handle)
                self._agent._leaked_xfer_handles.append(self._handle)
            except Exception:
                pass


class nixl_prepped_dlist_handle(_Handle):
    """A prepared descriptor list (``prep_xfer_dlist``)."""

    def release(self):
        if not self._released:
            self._agent.release_dlist_handle(self)

    def __del__(self):
        if getattr(self, "_released", True):
            return
        try:
            self._agent.release_dlist_handle(self)
        except Exception:
            pass


def _is_tensor(obj):
    return all(hasattr(obj, a) for a in ("data_ptr", "numel", "element_size", "device"))


def _tensor_desc(t, what):
    """(mem_type, (addr, len, devId)) of a tensor: DRAM on the CPU, VRAM on a CUDA device (where
    CUDA's driver is usable, else refused); None when it is not contiguous. ``what`` names the call."""
    if not t.is_contiguous():
        return None
    dev = t.device
    kind = getattr(dev, "type", str(dev))
    index = getattr(dev, "index", None)
    if kind == "cpu":
        mem = _bindings.DRAM_SEG
    elif kind == "cuda":
        mem = _bindings.VRAM_SEG
        _check_memory_type(mem, "%s of a cuda tensor" % what)
    else:
        raise _bindings.nixlNotFoundError("%s of a tensor on %s: no backend moves it: ferry's engine moves CPU "
                                          "(DRAM_SEG) and CUDA (VRAM_SEG) memory only" % (what, kind))
    return mem, (int(t.data_ptr()), int(t.numel() * t.element_size()), int(index or 0))


def _dlpack_desc(obj, what):
    """(mem_type, (addr, len, devId), owner) of a DLPack producer: its CPU memory (a NumPy view),
    its CUDA memory (a CudaArrayMemory, where CUDA's driver is usable), or a refusal."""
    from .. import errors
    from .._memory import registrable
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) == 2:  # kDLCUDA
        _check_memory_type(_bindings.VRAM_SEG, "%s of a DLPack object on a CUDA device" % what)
    elif int(dev_type) != 1:
        _check_memory_type(_bindings.VRAM_SEG if int(dev_type) in (3, 13) else _bindings.BLK_SEG,
                           "%s of a DLPack object on device type %d" % (what, int(dev_type)))
    try:
        memory = registrable(obj, what)
    except errors.NotSupported as e:
        raise _bindings.nixlNotFoundError("%s: no backend moves it: %s" % (what, e)) from None
    except errors.InvalidArgument as e:
        raise _bindings.nixlInvalidParamError(str(e)) from None
    if int(dev_type) == 2:
        return (_bindings.VRAM_SEG, (memory.data_ptr(), memory.numel() * memory.element_size(), memory.device.index),
                memory)
    arr = np.asarray(memory)
    return _bindings.DRAM_SEG, (int(arr.ctypes.data), int(arr.nbytes), 0), memory


class nixl_agent:
    """NIXL's agent. ``agent_name`` names it to its peers; ``nixl_conf`` (a
    :class:`nixl_agent_config`) chooses backends and the listener; ``instantiate_all`` creates every
    plugin when no config is given."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if isinstance(agent_name, bytes):
            agent_name = agent_name.decode()
        if not agent_name:
            raise ValueError("agent_name must be a non-empty string")
        if nixl_conf is None:
            nixl_conf = nixl_agent_config()
        else:
            instantiate_all = False
        if nixl_conf.sync_mode is not None:
            sync = nixl_conf.sync_mode
        elif nixl_conf.enable_listen:
            sync = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
        else:
            sync = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
        cfg = _bindings.nixlAgentConfig(nixl_conf.enable_pthread, nixl_conf.enable_listen, nixl_conf.port,
                                        sync.value, 1, 0, 100000, nixl_conf.capture_telemetry)
        self.name = agent_name
        self.notifs = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self._leaked_xfer_handles = []
        self._held = {}  # registered objects kept alive while registered
        self.nixl_mems = {"DRAM": _bindings.DRAM_SEG, "VRAM": _bindings.VRAM_SEG, "cpu": _bindings.DRAM_SEG,
                          "cuda": _bindings.VRAM_SEG, "FILE": _bindings.FILE_SEG, "BLOCK": _bindings.BLK_SEG,
                          "OBJ": _bindings.OBJ_SEG}
        self.nixl_ops = {"WRITE": _bindings.NIXL_WRITE, "READ": _bindings.NIXL_READ}
        self.agent = _bindings.nixlAgent(agent_name, cfg)

        self.plugin_list = list(self.agent.getAvailPlugins())
        if not self.plugin_list:
            raise RuntimeError("no NIXL plugins available")
        self.plugin_b_options = {}
        self.plugin_mem_types = {}
        for plugin in self.plugin_list:
            params, mems = self.agent.getPluginParams(plugin)
            self.plugin_b_options[plugin] = params
            self.plugin_mem_types[plugin] = mems

        wanted = self.plugin_list if instantiate_all else list(nixl_conf.backends or [])
        for bknd in wanted:
            if bknd not in self.plugin_list:
                logger.warning("backend %s is not a plugin here (ferry serves %s): skipped", bknd,
                               ", ".join(self.plugin_list))
                continue
            params = {}
            if nixl_conf.num_threads and nixl_conf.num_threads > 0:
                params["num_threads"] = str(nixl_conf.num_threads)
            self.create_backend(bknd, params)
        logger.debug("initialized ferry.nixl agent %s", agent_name)

    def __del__(self):
        agent = self.__dict__.get("agent")
        if agent is not None:
            try:
                agent.close()
            except Exception:
                pass

    # ---- plugins and backends ----
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        if backend in self.plugin_mem_types:
            return list(self.plugin_mem_types[backend])
        logger.warning("plugin %s is not available", backend)
        return []

    def get_plugin_params(self, backend):
        if backend in self.plugin_b_options:
            return dict(self.plugin_b_options[backend])
        logger.warning("plugin %s is not available", backend)
        return {}

    def get_backend_mem_types(self, backend):
        if backend in self.backend_mems:
            return list(self.backend_mems[backend])
        logger.warning("backend %s has not been created", backend)
        return []

    def get_backend_params(self, backend):
        if backend in self.backend_options:
            return dict(self.backend_options[backend])
        logger.warning("backend %s has not been created", backend)
        return {}

    def create_backend(self, backend, initParams=None):
        handle = self.agent.createBackend(backend, dict(initParams or {}))
        self.backends[backend] = handle
        params, mems = self.agent.getBackendParams(handle)
        self.backend_mems[backend] = mems
        self.backend_options[backend] = params

    def _handles(self, backends):
        return [self.backends[b] for b in (backends or [])]

    # ---- descriptors ----
    def _mem(self, mem_type):
        return self.nixl_mems[mem_type]  # an unknown key is NIXL's KeyError

    def _descs(self, descs, mem_type, width, cls, other_cls, what):
        """``descs`` as ``cls`` (the shared body of get_reg_descs / get_xfer_descs)."""
        mem = self._mem(mem_type) if mem_type is not None else None
        if isinstance(descs, cls):
            return descs, None
        if isinstance(descs, other_cls) or isinstance(descs, _bindings.nixlRemoteDList):
            logger.error("%s: a %s is not a %s", what, type(descs).__name__, cls.__name__)
            return None, None
        if isinstance(descs, np.ndarray):
            if descs.ndim == 2 and descs.shape[1] == 3:
                return cls(mem if mem is not None else _bindings.DRAM_SEG, _bindings_rows(descs)), None
            if not descs.flags.c_contiguous:
                logger.error("%s: the array is not contiguous", what)
                return None, None
            row = (int(descs.ctypes.data), int(descs.nbytes), 0) + ("",) * (width - 3)
            return cls(_bindings.DRAM_SEG, [row]), descs
        if _is_tensor(descs):
            descs = [descs]
        elif hasattr(type(descs), "__dlpack__") and hasattr(type(descs), "__dlpack_device__"):
            t, row, view = _dlpack_desc(descs, what)
            return cls(t, [row + ("",) * (width - 3)]), view
        elif isinstance(descs, (bytearray, memoryview)):
            arr = np.frombuffer(descs, dtype=np.uint8)
            return cls(_bindings.DRAM_SEG, [(int(arr.ctypes.data), int(arr.nbytes), 0) + ("",) * (width - 3)]), descs
        if not isinstance(descs, (list, tuple)):
            logger.error("%s: cannot make descriptors of a %s", what, type(descs).__name__)
            return None, None
        descs = list(descs)
        if descs and all(_is_tensor(t) for t in descs):
            rows, mems = [], set()
            for t in descs:
                d = _tensor_desc(t, what)
                if d is None:
                    logger.error("%s: a tensor is not contiguous", what)
                    return None, None
                mems.add(d[0])
                rows.append(d[1] + ("",) * (width - 3))
            if len(mems) != 1:
                logger.error("%s: tensors on different kinds of device", what)
                return None, None
            return cls(mems.pop(), rows), descs
        if mem is None:
            logger.error("%s: descriptors given as tuples need a mem_type", what)
            return None, None
        if not all(isinstance(d, tuple) and len(d) == width for d in descs):
            logger.error("%s: expected %d-tuples", what, width)
            return None, None
        return cls(mem, descs), None

    def get_reg_descs(self, descs, mem_type=None):
        """A nixlRegDList from 4-tuples + mem_type, tensors, an N x 3 array, a NumPy array, a
        DLPack object, or a nixlRegDList; None (logged) for what cannot be one."""
        return self._descs(descs, mem_type, 4, _bindings.nixlRegDList, _bindings.nixlXferDList, "get_reg_descs")[0]

    def get_xfer_descs(self, descs, mem_type=None):
        """A nixlXferDList from 3-tuples + mem_type, tensors, an N x 3 array, or a nixlXferDList;
        None (logged) for what cannot be one."""
        return self._descs(descs, mem_type, 3, _bindings.nixlXferDList, _bindings.nixlRegDList, "get_xfer_descs")[0]

    def get_remote_descs(self, descs, mem_type=None):
        if isinstance(descs, _bindings.nixlRemoteDList):
            return descs
        if mem_type is None or not isinstance(descs, list):
            return None
        return _bindings.nixlRemoteDList(self._mem(mem_type), descs)

    def get_serialized_descs(self, descs):
        """Pickled descriptors (unpickle only what a trusted peer sent)."""
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        return pickle.loads(serialized_descs)

    # ---- registration ----
    def register_memory(self, reg_list, mem_type=None, backends=None):
        """Registers memory; returns the nixlRegDList to deregister it with. The objects given
        (tensors, arrays) are kept alive until deregistered."""
        reg_descs, owner = self._descs(reg_list, mem_type, 4, _bindings.nixlRegDList, _bindings.nixlXferDList,
                                       "register_memory")
        if reg_descs is None:
            raise _bindings.nixlInvalidParamError("register_memory: cannot make registration descriptors of %s"
                                                  % type(reg_list).__name__)
        owners = None
        if owner is not None:
            owners = list(owner) if isinstance(owner, list) else [owner]
            if len(owners) != reg_descs.descCount():
                owners = None
        if owners is not None:
            self.agent.registerMem(reg_descs, self._handles(backends), owners)
        else:
            self.agent.registerMem(reg_descs, self._handles(backends))
        if owner is not None:
            self._held.setdefault(reg_descs.rows().tobytes(), []).append(owner)
        return reg_descs

    def deregister_memory(self, dereg_list, backends=None):
        self.agent.deregisterMem(dereg_list, self._handles(backends))
        held = self._held.get(dereg_list.rows().tobytes())
        if held:
            held.pop()

    def query_memory(self, reg_list, backend, mem_type=None):
        raise _bindings.nixlNotSupportedError("query_memory: ferry.nixl serves no storage backend")

    # ---- metadata ----
    def get_agent_metadata(self):
        return self.agent.getLocalMD()

    def get_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None):
        return self.agent.getLocalPartialMD(descs, inc_conn_info, self._handles(backends))

    def add_remote_agent(self, metadata):
        return self.agent.loadRemoteMD(metadata)

    def remove_remote_agent(self, agent):
        self.agent.invalidateRemoteMD(agent)

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.sendLocalMD(ip_addr, port)

    def send_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None, ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        self.agent.sendLocalPartialMD(descs, inc_conn_info, self._handles(backends), ip_addr, port, label)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        self.agent.fetchRemoteMD(remote_agent, ip_addr, port, label)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.invalidateLocalMD(ip_addr, port)

    def check_remote_metadata(self, remote_agent, descs=None):
        return self.agent.checkRemoteMD(remote_agent, descs)

    def make_connection(self, remote_agent, backends=None):
        self.agent.makeConnection(remote_agent, self._handles(backends))

    # ---- transfers ----
    def _xfer_list(self, descs, mem_type, what):
        out = self.get_xfer_descs(descs, mem_type)
        if out is None:
            raise _bindings.nixlInvalidParamError("%s: cannot make transfer descriptors of %s"
                                                  % (what, type(descs).__name__))
        return out

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=None):
        """Prepares one side: ``""``/``"NIXL_INIT_AGENT"`` local memory, this agent's own name a
        loopback target, another agent's name that agent's memory (its metadata loaded)."""
        descs = self._xfer_list(xfer_list, mem_type, "prep_xfer_dlist")
        name = agent_name.decode() if isinstance(agent_name, bytes) else agent_name
        if name == "NIXL_INIT_AGENT":
            name = ""
        h = self.agent.prepXferDlist(name, descs, self._handles(backends))
        return nixl_prepped_dlist_handle(self, h)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
                          notif_msg=b"", backends=None, skip_desc_merge=False):
        op = self.nixl_ops[operation]
        h = self.agent.makeXferReq(op, int(local_xfer_side._handle), local_indices, int(remote_xfer_side._handle),
                                   remote_indices, notif_msg, self._handles(backends), skip_desc_merge)
        return nixl_xfer_handle(self, h)

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"", backends=None):
        op = self.nixl_ops[operation]
        local = self._xfer_list(local_descs, "DRAM", "initialize_xfer")
        remote = self._xfer_list(remote_descs, "DRAM", "initialize_xfer")
        h = self.agent.createXferReq(op, local, remote, remote_agent, notif_msg, self._handles(backends))
        return nixl_xfer_handle(self, h)

    def transfer(self, handle, notif_msg=b""):
        return _STATES.get(self.agent.postXferReq(handle._handle, notif_msg if notif_msg else None), "ERR")

    def check_xfer_state(self, handle):
        return _STATES.get(self.agent.getXferStatus(handle._handle), "ERR")

    def get_xfer_telemetry(self, handle):
        return self.agent.getXferTelemetry(handle._handle)

    def query_xfer_backend(self, handle):
        b = self.agent.queryXferBackend(handle._handle)
        return next((name for name, h in self.backends.items() if h == b), None)

    def estimate_xfer_cost(self, handle):
        duration, margin, method = self.agent.estimateXferCost(handle._handle)
        return duration, margin, "ANALYTICAL_BACKEND" if method == _bindings.NIXL_COST_ANALYTICAL_BACKEND else "UNKNOWN"

    def release_xfer_handle(self, handle):
        """Frees a request; a running one is waited for until it settled, its notification unsent."""
        self.agent.releaseXferReq(handle._handle)
        handle._released = True

    def release_dlist_handle(self, handle):
        self.agent.releasedDlistH(handle._handle)
        handle._released = True

    def prep_mem_view(self, dlist, backends=None):
        return self.agent.prepMemView(dlist, backends)

    def release_mem_view(self, mvh):
        return self.agent.releaseMemView(mvh)

    # ---- notifications ----
    def get_new_notifs(self, backends=None):
        """Messages that arrived since the last call, by sender name: {name: [bytes, ...]}."""
        return self.agent.getNotifs({}, self._handles(backends))

    def update_notifs(self, backends=None):
        """Adds the new messages to ``self.notifs`` and returns it."""
        return self.agent.getNotifs(self.notifs, self._handles(backends))

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None, tag_is_prefix=True):
        """True (and the message removed) once a message from that agent starts with (or, with
        ``tag_is_prefix=False``, contains) ``lookup_tag``."""
        self.update_notifs(backends)
        name = remote_agent_name.decode() if isinstance(remote_agent_name, bytes) else remote_agent_name
        tag = lookup_tag.encode() if isinstance(lookup_tag, str) else bytes(lookup_tag)
        msgs = self.notifs.get(name, [])
        for i, msg in enumerate(msgs):
            if (msg.startswith(tag) if tag_is_prefix else tag in msg):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        self.agent.genNotif(remote_agent_name, notif_msg, backend)


def _bindings_rows(arr):
    if arr.dtype not in (np.uint64, np.int64):
        raise ValueError("descriptors as an Nx3 array must be uint64 or int64, not %s" % arr.dtype)
    if not arr.flags.c_contiguous:
        raise ValueError("descriptors as an Nx3 array must be C-contiguous")
    return arr


import atexit as _atexit  # noqa: E402

_atexit.register(_close_all)
