"""ferry.vtools: tools that make verbs programming easier (the `rdma.vtools` module of the
verbs specification): :class:`BufferPool`, a pool of fixed-size registered buffers, and
:class:`CQPoller`, a blocking iterator over the completions of a CQ."""

from __future__ import annotations

import collections as _collections
import mmap as _mmap
import select as _select
from typing import TYPE_CHECKING, Deque, Iterable, Iterator, Literal, Optional, Union, cast

from . import errors as _errors
from . import path as _path
from . import verbs as ibv
from .tools import clock_monotonic

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["BufferPool", "CQPoller"]

# Longest single sleep of CQPoller.sleep(); between slices it notices a closed channel.
_SLEEP_SLICE = 0.5


class BufferPool:
    """Hold onto a block of fixed size buffers and provide some methods for using them as send
    and receive buffers with a QP.

    This can be used to provide send buffers for a QP, as well as receive buffers for a QP or a
    SRQ. Generally the *qp* argument to methods of this class can be a :class:`ferry.verbs.QP` or
    :class:`ferry.verbs.SRQ`.

    A :class:`ferry.verbs.MR` is created in *pd* with *count* buffers of *size* bytes (anonymous
    memory, LOCAL_WRITE access). Work request ids carry the buffer index: ``wr_id &
    BUF_ID_MASK``, with :attr:`RECV_FLAG` set for receives."""

    #: Mask to convert a wr_id back into a buf_idx.
    BUF_ID_MASK = 0xFFFFFFFF
    #: Constant value to set wr_id to when it is not being used.
    NO_WR_ID = 0xFFFFFFFF
    #: Constant value to or into wr_id to indicate it was posted as a recv.
    RECV_FLAG = 1 << 32

    #: Number of buffers.
    count: int = 0
    #: Size of a single buffer.
    size: int = 0

    def __init__(self, pd: ibv.PD, count: int, size: int) -> None:
        if count <= 0 or size <= 0:
            raise ValueError("a BufferPool needs count > 0 and size > 0")
        if count >= self.NO_WR_ID:
            raise ValueError("too many buffers for the wr_id encoding")
        self.pd = pd
        self.count = count
        self.size = size
        self._mem: Optional[_mmap.mmap] = _mmap.mmap(-1, count * size)
        self._mr: Optional[ibv.MR] = pd.mr(self._mem, ibv.IBV_ACCESS_LOCAL_WRITE)
        self._buffers: Deque[int] = _collections.deque(range(count))

    @property
    def mr(self) -> ibv.MR:
        """The :class:`ferry.verbs.MR` holding the buffers (None once closed)."""
        return cast(ibv.MR, self._mr)

    def close(self) -> None:
        """Close held objects (the MR, then the memory)."""
        if self._mr is not None:
            self._mr.close()
            self._mr = None
        if self._mem is not None:
            self._mem.close()
            self._mem = None

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.close()
        return False

    def pop(self) -> int:
        """Return a new buffer index. Raises IndexError when every buffer is in use."""
        try:
            return self._buffers.popleft()
        except IndexError:
            raise IndexError("BufferPool: all %d buffers are in use" % self.count) from None

    def push(self, buf_idx: int) -> None:
        """Give buffer *buf_idx* (or a wr_id naming it) back to the pool."""
        self._buffers.append(buf_idx & self.BUF_ID_MASK)

    @property
    def free(self) -> int:
        """Number of buffers not in use."""
        return len(self._buffers)

    def post_recvs(self, qp: Union[ibv.QP, ibv.SRQ], count: int) -> None:
        """Post *count* buffers for receive to *qp*, which may be any object with a `post_recv`
        method. IndexError when fewer buffers are free; :class:`ferry.verbs.WRError` when the
        queue refuses one (the buffers from the refused one on return to the pool)."""
        if count == 0:
            return
        if count > len(self._buffers):
            raise IndexError("BufferPool: %d receive buffers wanted, %d free" % (count, len(self._buffers)))
        bufs = [self._buffers.popleft() for _ in range(count)]
        wrs = [ibv.recv_wr(wr_id=buf_idx | self.RECV_FLAG, sg_list=self.make_sge(buf_idx, self.size))
               for buf_idx in bufs]
        try:
            qp.post_recv(wrs)
        except ibv.WRError as err:
            # The ones from bad_index on were not posted: keep them.
            for buf_idx in bufs[err.bad_index or 0:]:
                self._buffers.append(buf_idx)
            raise

    def finish_wcs(self, qp: Union[ibv.QP, ibv.SRQ], wcs: Union[ibv.wc, Iterable[Optional[ibv.wc]]]) -> None:
        """Process work completion list *wcs* to recover buffers attached to completed work and
        re-post recv buffers to *qp*. Every work request with an attached buffer must have a
        signaled completion to recover the buffer. *wcs* may be a single wc.

        :raises ferry.verbs.WCError: For WC's marked as error (the buffer is recovered, not
            re-posted)."""
        if isinstance(wcs, ibv.wc):
            wcs = (wcs,)
        new_recvs = 0
        try:
            for wc in wcs:
                if wc is None:
                    continue
                has_buf = wc.wr_id != self.NO_WR_ID
                is_recv = bool(wc.wr_id & self.RECV_FLAG) if has_buf else bool(wc.opcode & ibv.IBV_WC_RECV)
                if has_buf:
                    self._buffers.append(wc.wr_id & self.BUF_ID_MASK)
                if wc.status != ibv.IBV_WC_SUCCESS:
                    raise ibv.WCError(wc, None, obj=qp if isinstance(qp, (ibv.QP, ibv.SRQ)) else None,
                                      is_rq=is_recv)
                if is_recv:
                    new_recvs += 1
        finally:
            if new_recvs:
                self.post_recvs(qp, new_recvs)

    def make_send_wr(self, buf_idx: int, buf_len: int, path: Optional[_path.IBPath] = None) -> ibv.send_wr:
        """Return a :class:`ferry.verbs.send_wr` (a signaled SEND) for *buf_idx* and *path*. If
        *path* is None the wr does not contain path information (eg for connected QPs);
        otherwise it carries the path's AH (cached in the path), dqpn and qkey."""
        wr = ibv.send_wr(wr_id=buf_idx & self.BUF_ID_MASK, sg_list=self.make_sge(buf_idx, buf_len),
                         opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED)
        if path is not None:
            wr.ah = self.pd.ah(path)
            # A path to a UD peer names its QP and Q_Key; None is refused here (TypeError).
            wr.remote_qpn = cast(int, path.dqpn)
            wr.remote_qkey = cast(int, path.qkey)
        return wr

    def make_sge(self, buf_idx: int, buf_len: int) -> ibv.sge:
        """Return a :class:`ferry.verbs.sge` for *buf_len* bytes of buffer *buf_idx*. ValueError
        when *buf_len* exceeds the buffer size, IndexError for an index outside the pool."""
        if not 0 <= buf_len <= self.size:
            raise ValueError("buf_len %d is outside the buffer size %d" % (buf_len, self.size))
        return self.mr.sge(buf_len, self._offset(buf_idx))

    def _offset(self, buf_idx: int) -> int:
        idx = buf_idx & self.BUF_ID_MASK
        if idx >= self.count:
            raise IndexError("buffer index %d is outside the pool (%d buffers)" % (idx, self.count))
        return idx * self.size

    def copy_from(self, buf_idx: int, offset: int = 0, length: int = 0xFFFFFFFF) -> bytearray:
        """Return a copy of buffer *buf_idx* (from *offset*, at most *length* bytes). *buf_idx*
        may be a wr_id.

        :rtype: bytearray"""
        base = self._offset(buf_idx)
        length = max(0, min(length, self.size - offset))
        return bytearray(self._memory()[base + offset:base + offset + length])

    def copy_to(self, buf: Union[Buffer, str], buf_idx: int, offset: int = 0, length: int = 0xFFFFFFFF) -> None:
        """Copy *buf* (bytes-like, or a str as UTF-8) into the buffer *buf_idx* at *offset*, at most
        *length* bytes and no more than fit."""
        if isinstance(buf, str):
            buf = buf.encode("utf-8")
        data = memoryview(buf).cast("B")
        base = self._offset(buf_idx)
        length = max(0, min(length, self.size - offset, len(data)))
        self._memory()[base + offset:base + offset + length] = data[:length]

    def _memory(self) -> _mmap.mmap:
        return cast(_mmap.mmap, self._mem)


class CQPoller:
    """Simple wrapper for a :class:`ferry.verbs.CQ` and its :class:`ferry.verbs.CompChannel`
    to provide a blocking API for getting work completions.

    *cq* is the completion queue to read work completions from. If the cq does not have a
    completion channel then this will spin loop on cq, otherwise it sleeps on the completion
    channel.

    If *async_events* is True then the async event queue of the context is monitored while
    sleeping and each event goes through :meth:`ferry.verbs.Context.handle_async_event` (which
    raises :class:`ferry.verbs.AsyncError` for failures). *solicited_only* arms the CQ for
    solicited (and error) completions only."""

    #: True if iteration was stopped due to a timeout.
    timedout: bool = False
    #: Value of :func:`ferry.tools.clock_monotonic` to stop iterating (None: never). This can be
    #: altered while iterating.
    wakeat: Optional[float] = None

    def __init__(self, cq: ibv.CQ, async_events: bool = True, solicited_only: bool = False) -> None:
        self.cq = cq
        self._cc = cq.comp_chan
        self._ctx = cq.ctx
        self._async_events = async_events
        self._solicited_only = solicited_only
        self._poll: Optional[_select.poll] = None
        if self._cc is not None:
            self._poll = _select.poll()
            self._cc.register_poll(self._poll)
            if async_events:
                self._ctx.register_poll(self._poll)

    def sleep(self, wakeat: Optional[float]) -> Optional[bool]:
        """Go to sleep until the cq gets a completion. *wakeat* is the value of
        :func:`ferry.tools.clock_monotonic` after which the function returns None (None: no
        limit). Returns True if the completion channel triggered.

        If no completion channel is in use this just returns True. Raises :class:`ferry.Closed`
        when the CQ or its channel is closed meanwhile, and what
        :meth:`ferry.verbs.Context.handle_async_event` raises for an async error.

        Note: It is necessary to call :meth:`ferry.verbs.CQ.req_notify` on the CQ, then poll the
        CQ before calling sleep(). Otherwise the edge triggered nature of the completion channels
        can cause deadlock."""
        if self._cc is None or self._poll is None:
            return True
        while True:
            if self._cc.closed or self.cq.closed:
                raise _errors.Closed("the CQ or its completion channel was closed while waiting")
            if wakeat is None:
                slice_s = _SLEEP_SLICE
            else:
                left = wakeat - clock_monotonic()
                if left <= 0:
                    return None
                slice_s = min(left, _SLEEP_SLICE)
            # select.poll releases the GIL and is interrupted by signals (KeyboardInterrupt ...).
            events = self._poll.poll(max(1, int(slice_s * 1000 + 0.999)))
            triggered = False
            for event in events:
                if self._async_events and self._ctx.check_poll(event):
                    async_event = self._ctx.get_async_event()
                    if async_event is not None:
                        self._ctx.handle_async_event(async_event)
                    continue
                if self._cc.check_poll(event) is not None:
                    triggered = True
            if triggered:
                return True

    def iterwc(self, count: Optional[int] = None, timeout: Optional[float] = None,
               wakeat: Optional[float] = None) -> Iterator[ibv.wc]:
        """Generator that returns work completions from the CQ. If not None at most *count* wcs
        will be returned. *timeout* is the number of seconds this function can run for, and
        *wakeat* is the value of :func:`ferry.tools.clock_monotonic` after which iteration stops.
        With neither, it waits until *count* completions came (interruptible).

        :rtype: :class:`ferry.verbs.wc`"""
        self.timedout = False
        if timeout is not None:
            self.wakeat = clock_monotonic() + timeout
        else:
            self.wakeat = wakeat
        left = count
        armed = False
        while left is None or left > 0:
            wcs = self.cq.poll(-1 if left is None else left)
            if wcs:
                armed = False
                for wc in wcs:
                    if left is not None:
                        left -= 1
                    yield wc
                continue
            if self.wakeat is not None and clock_monotonic() >= self.wakeat:
                self.timedout = True
                return
            if self._cc is None:
                continue
            if not armed:
                # Arm, then poll once more: a completion that arrived before arming sends no event.
                self.cq.req_notify(self._solicited_only)
                armed = True
                continue
            if self.sleep(self.wakeat) is None:
                self.timedout = True
                return
            armed = False
