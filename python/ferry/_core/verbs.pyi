"""
The verbs layer
"""
from __future__ import annotations
import typing
import typing_extensions
__all__: list[str] = ['AH', 'CQ', 'CompChannel', 'Context', 'MR', 'PD', 'QP', 'SRQ', 'SharedMemory', 'alloc_shared', 'list_devices', 'list_providers', 'path_from_json', 'path_normalize_json', 'qp_attr_fields', 'recv_wr', 'send_wr', 'sge', 'wc']
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
        """
        The start address of the buffer (int).
        """
    @addr.setter
    def addr(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def length(self) -> int:
        """
        The buffer's length in bytes (up to 2^32-1).
        """
    @length.setter
    def length(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def lkey(self) -> int:
        """
        The local key of the memory region that holds the buffer (MR.lkey).
        """
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
    """UD: the AH of the destination (created in the QP's PD)."""
    sg_list: typing.Any
    """The data to send or write, or where a READ or atomic puts its result: an sge, a list/tuple of sge, or None (no data)."""
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
        """
        Atomics: the value compared (IBV_WR_ATOMIC_CMP_AND_SWP) or added (IBV_WR_ATOMIC_FETCH_AND_ADD); 64
        bits.
        """
    @compare_add.setter
    def compare_add(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def imm_data(self) -> int:
        """
        The immediate of IBV_WR_SEND_WITH_IMM and IBV_WR_RDMA_WRITE_WITH_IMM: 32 bits, delivered unchanged
        in the receiver's wc.imm_data.
        """
    @imm_data.setter
    def imm_data(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def opcode(self) -> int:
        """
        The operation: IBV_WR_* (IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, ...); 0 is
        IBV_WR_RDMA_WRITE.
        """
    @opcode.setter
    def opcode(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_addr(self) -> int:
        """
        RDMA and atomic opcodes: the peer's address, in the region of rkey (8-byte aligned for atomics).
        """
    @remote_addr.setter
    def remote_addr(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_qkey(self) -> int:
        """
        UD: the destination QP's Q_Key.
        """
    @remote_qkey.setter
    def remote_qkey(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remote_qpn(self) -> int:
        """
        UD: the destination QP number.
        """
    @remote_qpn.setter
    def remote_qpn(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def rkey(self) -> int:
        """
        RDMA and atomic opcodes: the remote key of the peer's region (its MR.rkey).
        """
    @rkey.setter
    def rkey(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def send_flags(self) -> int:
        """
        IBV_SEND_* flags, or'ed: SIGNALED (a completion even without sq_sig_all), FENCE, SOLICITED, INLINE.
        """
    @send_flags.setter
    def send_flags(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def swap(self) -> int:
        """
        IBV_WR_ATOMIC_CMP_AND_SWP: the value written when the comparison matches; 64 bits.
        """
    @swap.setter
    def swap(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wr_id(self) -> int:
        """
        A value of the caller's choosing, returned in the completion's wc.wr_id.
        """
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
    """Where an incoming message goes: an sge, a list/tuple of sge, or None; on UD its first 40 bytes take the GRH."""
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
        """
        A value of the caller's choosing, returned in the completion's wc.wr_id.
        """
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
        """
        Bytes received for a receive (including the 40-byte GRH on UD); the bytes transferred for RDMA READ
        and atomics.
        """
    @byte_len.setter
    def byte_len(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def dlid_path_bits(self) -> int:
        """
        UD receives: the destination LID's path bits.
        """
    @dlid_path_bits.setter
    def dlid_path_bits(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def imm_data(self) -> int:
        """
        The immediate the sender gave (32 bits, unchanged), valid when wc_flags has IBV_WC_WITH_IMM.
        """
    @imm_data.setter
    def imm_data(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def opcode(self) -> int:
        """
        The operation that completed: IBV_WC_* (IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM, ...).
        """
    @opcode.setter
    def opcode(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def pkey_index(self) -> int:
        """
        The P_Key index of the receive (GSI QPs only).
        """
    @pkey_index.setter
    def pkey_index(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def qp_num(self) -> int:
        """
        The number of the local QP the work request was posted to.
        """
    @qp_num.setter
    def qp_num(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def sl(self) -> int:
        """
        UD receives: the service level of the message.
        """
    @sl.setter
    def sl(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def slid(self) -> int:
        """
        UD receives: the sender's LID.
        """
    @slid.setter
    def slid(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def src_qp(self) -> int:
        """
        UD receives: the QP number of the sender.
        """
    @src_qp.setter
    def src_qp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def status(self) -> int:
        """
        IBV_WC_SUCCESS, else the IBV_WC_* error; in an error completion only wr_id, status, qp_num and
        vendor_err are valid.
        """
    @status.setter
    def status(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def vendor_err(self) -> int:
        """
        The device's own error syndrome, for an error completion.
        """
    @vendor_err.setter
    def vendor_err(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wc_flags(self) -> int:
        """
        IBV_WC_* flags, or'ed: IBV_WC_GRH (the buffer's first 40 bytes hold a GRH), IBV_WC_WITH_IMM
        (imm_data is valid).
        """
    @wc_flags.setter
    def wc_flags(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def wr_id(self) -> int:
        """
        The wr_id of the work request that completed.
        """
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
        """
        The file descriptor of the device's asynchronous events: readable while an event is queued
        (get_async_event() takes it).
        """
    @property
    def closed(self) -> bool:
        """
        True once close() was called (or a parent was closed).
        """
    @property
    def device_name(self) -> str:
        """
        The device's name, as list_devices() gives it.
        """
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
        """
        The Context this PD was allocated on.
        """
class SharedMemory:
    """
    Zero-filled memory a same-host peer maps.
    """
    def __len__(self) -> int:
        ...
    @property
    def addr(self) -> int:
        """
        The address of the memory's first byte (int).
        """
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
        """
        The IBV_ACCESS_* flags the memory was registered with, or'ed.
        """
    @property
    def addr(self) -> int:
        """
        The address of the registered memory's first byte (int).
        """
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
        """
        The Context of the MR's PD.
        """
    @property
    def length(self) -> int:
        """
        The registered length in bytes.
        """
    @property
    def lkey(self) -> int:
        """
        The local key: what an sge over this memory carries as its lkey.
        """
    @property
    def pd(self) -> typing.Any:
        """
        The PD this MR is registered in.
        """
    @property
    def rkey(self) -> int:
        """
        The remote key: what a peer puts in send_wr.rkey to READ, WRITE or do atomics on this memory (as far
        as the access flags allow).
        """
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
        """
        The Context this completion channel was created on.
        """
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
        """
        The CompChannel that reports this CQ's completion events (after req_notify()), or None.
        """
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
        """
        The number of completions the CQ holds (at least the number asked for; resize() changes it).
        """
    @property
    def ctx(self) -> typing.Any:
        """
        The Context this CQ was created on.
        """
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
        """
        The Context of the SRQ's PD.
        """
    @property
    def pd(self) -> typing.Any:
        """
        The PD this SRQ was created in.
        """
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
        """
        The Context of the address handle's PD.
        """
    @property
    def pd(self) -> typing.Any:
        """
        The PD this address handle was created in.
        """
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
        """
        The Context of the QP's PD.
        """
    @property
    def max_inline_data(self) -> int:
        """
        The most bytes a send work request may carry inline (IBV_SEND_INLINE), as asked for at creation.
        """
    @property
    def max_recv_sge(self) -> int:
        """
        The most sge per receive work request, as asked for at creation.
        """
    @property
    def max_recv_wr(self) -> int:
        """
        The most work requests outstanding on the receive queue, as asked for at creation.
        """
    @property
    def max_send_sge(self) -> int:
        """
        The most sge per send work request, as asked for at creation.
        """
    @property
    def max_send_wr(self) -> int:
        """
        The most work requests outstanding on the send queue, as asked for at creation.
        """
    @property
    def pd(self) -> typing.Any:
        """
        The PD this QP was created in.
        """
    @property
    def qp_num(self) -> int:
        """
        The QP number (24 bits) a peer addresses: the dest_qp_num of a connected peer, a UD send's
        remote_qpn.
        """
    @property
    def qp_type(self) -> int:
        """
        The transport: IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD.
        """
    @property
    def sq_sig_all(self) -> bool:
        """
        Whether every send work request generates a completion (else only those with IBV_SEND_SIGNALED).
        """
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
qp_attr_fields: tuple = (('qp_state', 1), ('cur_qp_state', 2), ('path_mtu', 256), ('path_mig_state', 262144), ('qkey', 64), ('rq_psn', 4096), ('sq_psn', 65536), ('dest_qp_num', 1048576), ('qp_access_flags', 8), ('cap', 524288), ('ah_attr', 128), ('alt_ah_attr', 16384), ('pkey_index', 16), ('alt_pkey_index', 16384), ('en_sqd_async_notify', 4), ('sq_draining', 0), ('max_rd_atomic', 8192), ('max_dest_rd_atomic', 131072), ('min_rnr_timer', 32768), ('port_num', 32), ('timeout', 512), ('retry_cnt', 1024), ('rnr_retry', 2048), ('alt_port_num', 16384), ('alt_timeout', 16384))
