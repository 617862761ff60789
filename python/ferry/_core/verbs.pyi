"""
The verbs layer
"""
from __future__ import annotations
import typing
import typing_extensions
__all__: list[str] = ['AH', 'CQ', 'CompChannel', 'Context', 'MR', 'PD', 'QP', 'SRQ', 'SharedMemory', 'alloc_shared', 'list_devices', 'list_providers', 'path_from_json', 'path_normalize_json', 'recv_wr', 'send_wr', 'sge', 'wc']
class sge:
    """
    ibv_sge: length bytes at addr, in the memory region with key lkey.
    """
    __hash__: typing.ClassVar[None] = None  # type: ignore[assignment]
    _fields: typing.ClassVar[tuple] = ('addr', 'length', 'lkey')
    def __copy__(self) -> sge:
        ...
    def __deepcopy__(self, arg0: typing.Any) -> sge:
        ...
    def __eq__(self, arg0: typing.Any) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        Create a sge; fields may be given by keyword (or by position in field order).
        """
    def __repr__(self) -> str:
        ...
    def _asdict(self) -> dict:
        ...
    @property
    def addr(self) -> int:
        ...
    @addr.setter
    def addr(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def length(self) -> int:
        ...
    @length.setter
    def length(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def lkey(self) -> int:
        ...
    @lkey.setter
    def lkey(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class send_wr:
    """
    ibv_send_wr. sg_list is an sge, a list/tuple of sge, or None; remote_addr/rkey serve RDMA and atomic opcodes, compare_add/swap atomics, ah/remote_qpn/remote_qkey UD sends.
    """
    __hash__: typing.ClassVar[None] = None  # type: ignore[assignment]
    _fields: typing.ClassVar[tuple] = ('wr_id', 'sg_list', 'opcode', 'send_flags', 'imm_data', 'remote_addr', 'rkey', 'compare_add', 'swap', 'ah', 'remote_qpn', 'remote_qkey')
    ah: typing.Any
    sg_list: typing.Any
    def __copy__(self) -> send_wr:
        ...
    def __deepcopy__(self, arg0: typing.Any) -> send_wr:
        ...
    def __eq__(self, arg0: typing.Any) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        Create a send_wr; fields may be given by keyword (or by position in field order).
        """
    def __repr__(self) -> str:
        ...
    def _asdict(self) -> dict:
        ...
    @property
    def compare_add(self) -> int:
        ...
    @compare_add.setter
    def compare_add(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def imm_data(self) -> int:
        ...
    @imm_data.setter
    def imm_data(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def opcode(self) -> int:
        ...
    @opcode.setter
    def opcode(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_addr(self) -> int:
        ...
    @remote_addr.setter
    def remote_addr(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_qkey(self) -> int:
        ...
    @remote_qkey.setter
    def remote_qkey(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_qpn(self) -> int:
        ...
    @remote_qpn.setter
    def remote_qpn(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def rkey(self) -> int:
        ...
    @rkey.setter
    def rkey(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def send_flags(self) -> int:
        ...
    @send_flags.setter
    def send_flags(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def swap(self) -> int:
        ...
    @swap.setter
    def swap(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wr_id(self) -> int:
        ...
    @wr_id.setter
    def wr_id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class recv_wr:
    """
    ibv_recv_wr. sg_list is an sge, a list/tuple of sge, or None.
    """
    __hash__: typing.ClassVar[None] = None  # type: ignore[assignment]
    _fields: typing.ClassVar[tuple] = ('wr_id', 'sg_list')
    sg_list: typing.Any
    def __copy__(self) -> recv_wr:
        ...
    def __deepcopy__(self, arg0: typing.Any) -> recv_wr:
        ...
    def __eq__(self, arg0: typing.Any) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        Create a recv_wr; fields may be given by keyword (or by position in field order).
        """
    def __repr__(self) -> str:
        ...
    def _asdict(self) -> dict:
        ...
    @property
    def wr_id(self) -> int:
        ...
    @wr_id.setter
    def wr_id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class wc:
    """
    ibv_wc: one work completion.
    """
    __hash__: typing.ClassVar[None] = None  # type: ignore[assignment]
    _fields: typing.ClassVar[tuple] = ('wr_id', 'status', 'opcode', 'vendor_err', 'byte_len', 'imm_data', 'qp_num', 'src_qp', 'wc_flags', 'pkey_index', 'slid', 'sl', 'dlid_path_bits')
    def __copy__(self) -> wc:
        ...
    def __deepcopy__(self, arg0: typing.Any) -> wc:
        ...
    def __eq__(self, arg0: typing.Any) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        Create a wc; fields may be given by keyword (or by position in field order).
        """
    def __repr__(self) -> str:
        ...
    def _asdict(self) -> dict:
        ...
    @property
    def byte_len(self) -> int:
        ...
    @byte_len.setter
    def byte_len(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def dlid_path_bits(self) -> int:
        ...
    @dlid_path_bits.setter
    def dlid_path_bits(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def imm_data(self) -> int:
        ...
    @imm_data.setter
    def imm_data(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def opcode(self) -> int:
        ...
    @opcode.setter
    def opcode(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def pkey_index(self) -> int:
        ...
    @pkey_index.setter
    def pkey_index(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def qp_num(self) -> int:
        ...
    @qp_num.setter
    def qp_num(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def sl(self) -> int:
        ...
    @sl.setter
    def sl(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def slid(self) -> int:
        ...
    @slid.setter
    def slid(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def src_qp(self) -> int:
        ...
    @src_qp.setter
    def src_qp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def status(self) -> int:
        ...
    @status.setter
    def status(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def vendor_err(self) -> int:
        ...
    @vendor_err.setter
    def vendor_err(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wc_flags(self) -> int:
        ...
    @wc_flags.setter
    def wc_flags(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wr_id(self) -> int:
        ...
    @wr_id.setter
    def wr_id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Context:
    """
    An opened verbs device.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, device_name: str) -> None:
        ...
    def _comp_channels(self) -> list:
        ...
    def _cqs(self) -> list:
        ...
    def _default_gid_index(self, port_id: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        The GID index a path from this port should use by default (a RoCE v2 GID on RoCE ports).
        """
    def _get_async_event(self, timeout: typing.SupportsFloat | typing.SupportsIndex) -> typing.Any:
        ...
    def _pds(self) -> list:
        ...
    def _query_device(self) -> dict:
        ...
    def _query_port(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> dict:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def query_gid(self, port_id: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex = 0) -> bytes:
        """
        One GID table entry of a port, as 16 bytes.
        """
    @property
    def async_fd(self) -> int:
        ...
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def device_name(self) -> str:
        ...
class PD:
    """
    A protection domain.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, ctx: typing.Any) -> None:
        ...
    def _ahs(self) -> list:
        ...
    def _mrs(self) -> list:
        ...
    def _qps(self) -> list:
        ...
    def _srqs(self) -> list:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
class SharedMemory:
    """
    Zero-filled memory a same-host peer maps.
    """
    def __len__(self) -> int:
        ...
    @property
    def addr(self) -> int:
        ...
class MR:
    """
    A memory registration over a Python buffer.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, pd: typing.Any, buf: typing.Any, access: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def sge(self, length: typing.SupportsInt | typing.SupportsIndex = -1, off: typing.SupportsInt | typing.SupportsIndex = 0) -> sge:
        """
        An sge over length bytes of this MR starting at off (length -1: to the end).
        """
    @property
    def access(self) -> int:
        ...
    @property
    def addr(self) -> int:
        ...
    @property
    def buf(self) -> typing.Any:
        """
        The registered buffer (None once closed).
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
    @property
    def length(self) -> int:
        ...
    @property
    def lkey(self) -> int:
        ...
    @property
    def pd(self) -> typing.Any:
        ...
    @property
    def rkey(self) -> int:
        ...
class CompChannel:
    """
    A completion channel.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, ctx: typing.Any) -> None:
        ...
    def _get_event(self, timeout: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> typing.Any:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def fileno(self) -> int:
        """
        The file descriptor: readable while CQ events are queued.
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
class CQ:
    """
    A completion queue.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, ctx: typing.Any, cqe: typing.SupportsInt | typing.SupportsIndex = 100, comp_chan: typing.Any | None = None) -> None:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def poll(self, limit: typing.SupportsInt | typing.SupportsIndex = -1) -> list:
        """
        Perform the poll_cq operation: a list of up to limit work completions (all there are for -1).
        """
    def req_notify(self, solicited_only: bool = False) -> None:
        """
        Request event notification for CQEs added to the CQ.
        """
    def resize(self, cqes: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Resize the CQ to have at least cqes entries.
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def comp_chan(self) -> typing.Any:
        ...
    @property
    def comp_events(self) -> int:
        """
        Completion events received for this CQ.
        """
    @comp_events.setter
    def comp_events(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def cqe(self) -> int:
        ...
    @property
    def ctx(self) -> typing.Any:
        ...
class SRQ:
    """
    A shared receive queue.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, pd: typing.Any, max_wr: typing.SupportsInt | typing.SupportsIndex = 100, max_sge: typing.SupportsInt | typing.SupportsIndex = 1, srq_limit: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    def _arm_limit(self, limit: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def _query(self) -> dict:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def post_recv(self, wrlist: typing.Any) -> None:
        """
        wrlist may be a single recv_wr or a list of them.
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
    @property
    def pd(self) -> typing.Any:
        ...
class AH:
    """
    An address handle.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, pd: typing.Any, ah_attr: typing.Any) -> None:
        ...
    def _attr(self) -> dict:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
    @property
    def pd(self) -> typing.Any:
        ...
class QP:
    """
    A queue pair.
    """
    def __enter__(self) -> typing_extensions.Self:
        ...
    def __exit__(self, *args: object) -> typing.Literal[False]:
        ...
    def __init__(self, pd: typing.Any, qp_type: typing.SupportsInt | typing.SupportsIndex, send_cq: typing.Any, recv_cq: typing.Any, srq: typing.Any, max_send_wr: typing.SupportsInt | typing.SupportsIndex, max_recv_wr: typing.SupportsInt | typing.SupportsIndex, max_send_sge: typing.SupportsInt | typing.SupportsIndex, max_recv_sge: typing.SupportsInt | typing.SupportsIndex, max_inline_data: typing.SupportsInt | typing.SupportsIndex, sq_sig_all: bool) -> None:
        ...
    def _attach_mcast(self, gid: bytes, lid: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def _detach_mcast(self, gid: bytes, lid: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def _modify(self, attr: typing.Any, mask: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def _query(self) -> dict:
        ...
    def close(self) -> None:
        """
        Free the verbs handle, after closing the objects created from it. Idempotent.
        """
    def post_recv(self, wrlist: typing.Any) -> None:
        """
        wrlist may be a single recv_wr or a list of them.
        """
    def post_send(self, wrlist: typing.Any) -> None:
        """
        wrlist may be a single send_wr or a list of them.
        """
    @property
    def _recv_cq(self) -> typing.Any:
        ...
    @property
    def _send_cq(self) -> typing.Any:
        ...
    @property
    def _srq(self) -> typing.Any:
        ...
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def ctx(self) -> typing.Any:
        ...
    @property
    def max_inline_data(self) -> int:
        ...
    @property
    def max_recv_sge(self) -> int:
        ...
    @property
    def max_recv_wr(self) -> int:
        ...
    @property
    def max_send_sge(self) -> int:
        ...
    @property
    def max_send_wr(self) -> int:
        ...
    @property
    def pd(self) -> typing.Any:
        ...
    @property
    def qp_num(self) -> int:
        ...
    @property
    def qp_type(self) -> int:
        ...
    @property
    def sq_sig_all(self) -> bool:
        ...
def alloc_shared(length: typing.SupportsInt | typing.SupportsIndex) -> SharedMemory:
    """
    Allocates length bytes of zero-filled memory that a same-host peer of the software provider maps (WRITE and READ on it are then loads and stores). Register it with PD.mr, or use PD.alloc_mr.
    """
def list_devices() -> list:
    """
    Every visible device (FERRY_DEVICES filters), highest-priority provider first, as dicts.
    """
def list_providers() -> list:
    """
    The providers ferry was built with, whether each is usable here, and why not.
    """
def path_from_json(text: str) -> dict:
    """
    Decodes a path (Path::fromJson, strict) into a dict of its fields; GIDs as 16 bytes. Raises ferry.InvalidArgument for anything malformed.
    """
def path_normalize_json(text: str) -> str:
    """
    Checks a path's JSON with the strict decoder and returns its canonical encoding (Path::toJson).
    """
