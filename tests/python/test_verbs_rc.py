"""RC queue pairs through ferry.verbs: data movement, work-completion and post errors, completion
channels, async events. Both sides live in this process, each on its own verbs context."""

import mmap
import select
import threading
import time

import pytest

import ferry
import ferry.path
import ferry.verbs as ibv
import ferry.vtools

try:
    import numpy as np
except ImportError:  # numpy is optional for ferry; the tests that need it skip
    np = None

ALL_ACCESS = (ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE | ibv.IBV_ACCESS_REMOTE_READ
              | ibv.IBV_ACCESS_REMOTE_ATOMIC)
WAIT = 5.0


class Side:
    def __init__(self, end_port, max_send_sge=1, max_inline_data=0, channel=False, qp_type=ibv.IBV_QPT_RC):
        self.ctx = ferry.get_verbs(end_port)
        self.pd = self.ctx.pd()
        self.cc = self.ctx.comp_channel() if channel else None
        self.cq = self.ctx.cq(64, self.cc)
        self.qp = self.pd.qp(qp_type, 16, self.cq, 16, self.cq, max_send_sge=max_send_sge,
                             max_inline_data=max_inline_data)


def connect(a, b, access=ALL_ACCESS):
    """The no-CM set-up of 7.2.3 between two sides of this process, paths as JSON text."""
    end_port = a.ctx.end_port
    path = ferry.path.IBPath(end_port, SGID=end_port.default_gid)
    ferry.path.fill_path(a.qp, path)
    path.reverse(for_reply=False)
    to_b = path.to_json()

    path_b = ferry.path.IBPath.from_json(to_b, end_port)
    ferry.path.fill_path(b.qp, path_b)
    with ferry.get_gmp_mad(path_b.end_port, verbs=b.ctx) as umad:
        ferry.path.resolve_path(umad, path_b)
    to_a = path_b.to_json()

    path_a = ferry.path.IBPath.from_json(to_a)
    path_a.reverse(for_reply=False)
    path_a.end_port = end_port
    a.qp.establish(path_a, access)
    b.qp.establish(path_b, access)
    return path_a, path_b


@pytest.fixture
def pair():
    end_port = ferry.get_end_port()
    a, b = Side(end_port), Side(end_port)
    connect(a, b)
    yield a, b
    a.ctx.close()
    b.ctx.close()


def poll_one(cq, timeout=WAIT):
    wcs = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=timeout))
    assert wcs, "no completion within %s s" % timeout
    return wcs[0]


def make_buffer(kind, size):
    if kind == "bytearray":
        return bytearray(size)
    if kind == "mmap":
        return mmap.mmap(-1, size)
    if np is None:
        pytest.skip("numpy is not installed")
    return np.zeros(size, dtype=np.uint8)


@pytest.mark.parametrize("kind", ["bytearray", "mmap", "numpy"])
def test_rdma_write_and_read_move_the_bytes(pair, kind):
    a, b = pair
    src = make_buffer(kind, 4096)
    dst = make_buffer(kind, 4096)
    back = make_buffer(kind, 4096)
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    memoryview(src)[:] = pattern
    mr_src = a.pd.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
    mr_back = a.pd.mr(back, ibv.IBV_ACCESS_LOCAL_WRITE)
    mr_dst = b.pd.mr(dst, ALL_ACCESS)

    a.qp.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_src.sge(length=1000, off=100), remote_addr=mr_dst.addr + 50,
                               rkey=mr_dst.rkey))
    wc = poll_one(a.cq)
    assert (wc.status, wc.opcode, wc.wr_id, wc.byte_len) == (ibv.IBV_WC_SUCCESS, ibv.IBV_WC_RDMA_WRITE, 1, 1000)
    assert bytes(memoryview(dst)[50:1050]) == pattern[100:1100]
    assert bytes(memoryview(dst)[:50]) == bytes(50)

    a.qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_RDMA_READ, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_back.sge(), remote_addr=mr_dst.addr, rkey=mr_dst.rkey))
    wc = poll_one(a.cq)
    assert (wc.status, wc.opcode, wc.byte_len) == (ibv.IBV_WC_SUCCESS, ibv.IBV_WC_RDMA_READ, 4096)
    assert bytes(back) == bytes(dst)


def test_alloc_mr_gives_zeroed_shared_memory_that_moves_the_bytes(pair):
    """PD.alloc_mr: registered memory ferry allocates (a same-host peer maps it), zero-filled,
    viewed without a copy, alive while a view is, and moving WRITE and READ byte-exact."""
    a, b = pair
    src = a.pd.alloc_mr(8192, ibv.IBV_ACCESS_LOCAL_WRITE)
    dst = b.pd.alloc_mr(5000, ALL_ACCESS)
    assert isinstance(dst.buf, ibv.SharedMemory)
    assert (dst.length, len(dst.buf), dst.buf.addr) == (5000, 5000, dst.addr)
    assert dst.addr % 4096 == 0
    assert bytes(dst.buf) == bytes(5000)
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(8192))
    memoryview(src.buf)[:] = pattern
    a.qp.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=src.sge(length=4000, off=10), remote_addr=dst.addr + 1000, rkey=dst.rkey))
    assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
    view = memoryview(dst.buf)
    assert bytes(view[1000:5000]) == pattern[10:4010]
    assert bytes(view[:1000]) == bytes(1000)
    a.qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_RDMA_READ, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=src.sge(length=5000, off=0), remote_addr=dst.addr, rkey=dst.rkey))
    assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
    assert bytes(memoryview(src.buf)[:5000]) == bytes(view)
    # A view outlives the region: the memory stays until the last view goes.
    dst.close()
    assert bytes(view[1000:1010]) == pattern[10:20]
    view.release()
    with pytest.raises(ValueError, match="must be positive"):
        a.pd.alloc_mr(0, ibv.IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(ValueError, match="must be positive"):
        ibv.alloc_shared(-1)


def test_alloc_mr_memory_is_a_numpy_array_and_a_torch_tensor_without_a_copy(pair):
    a, _ = pair
    mr = a.pd.alloc_mr(4096, ibv.IBV_ACCESS_LOCAL_WRITE)
    if np is not None:
        arr = np.frombuffer(mr.buf, dtype=np.uint32)
        assert arr.ctypes.data == mr.addr and arr.size == 1024
        arr[3] = 0xDEADBEEF
        assert bytes(mr.buf)[12:16] == (0xDEADBEEF).to_bytes(4, "little")
    try:
        import torch
    except ImportError:
        return
    t = torch.frombuffer(mr.buf, dtype=torch.uint8)
    assert t.data_ptr() == mr.addr and t.numel() == 4096
    t[0] = 7
    assert bytes(mr.buf)[0] == 7


@pytest.mark.parametrize("kind", ["bytes", "str"])
def test_rdma_read_from_read_only_memory(pair, kind):
    a, b = pair
    text = "read-only source: %s" % kind
    source = text.encode() if kind == "bytes" else text
    mr_src = b.pd.mr(source, ibv.IBV_ACCESS_REMOTE_READ)
    sink = bytearray(64)
    mr_sink = a.pd.mr(sink, ibv.IBV_ACCESS_LOCAL_WRITE)
    a.qp.post_send(ibv.send_wr(wr_id=9, opcode=ibv.IBV_WR_RDMA_READ, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_sink.sge(len(text)), remote_addr=mr_src.addr, rkey=mr_src.rkey))
    wc = poll_one(a.cq)
    assert (wc.status, wc.byte_len) == (ibv.IBV_WC_SUCCESS, len(text))
    assert bytes(sink[:len(text)]) == text.encode()
    # Writing to it is refused by the owner of the memory: the region has no REMOTE_WRITE.
    a.qp.post_send(ibv.send_wr(wr_id=10, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_sink.sge(4), remote_addr=mr_src.addr, rkey=mr_src.rkey))
    wc = list(ferry.vtools.CQPoller(a.cq).iterwc(count=1, timeout=WAIT))[0]
    assert wc.status == ibv.IBV_WC_REM_ACCESS_ERR
    assert bytes(mr_src.buf) == text.encode()


def test_send_recv_with_immediate_and_sge_list():
    end_port = ferry.get_end_port()
    a2 = Side(end_port, max_send_sge=2)
    b2 = Side(end_port)
    connect(a2, b2)
    try:
        head, tail = bytearray(b"Hello, "), bytearray(b"world!")
        mr1 = a2.pd.mr(head, ibv.IBV_ACCESS_LOCAL_WRITE)
        mr2 = a2.pd.mr(tail, ibv.IBV_ACCESS_LOCAL_WRITE)
        rbuf = bytearray(64)
        rmr = b2.pd.mr(rbuf, ibv.IBV_ACCESS_LOCAL_WRITE)
        b2.qp.post_recv(ibv.recv_wr(wr_id=77, sg_list=rmr.sge()))
        a2.qp.post_send(ibv.send_wr(wr_id=5, opcode=ibv.IBV_WR_SEND_WITH_IMM, send_flags=ibv.IBV_SEND_SIGNALED,
                                    imm_data=0x1234, sg_list=(mr1.sge(), mr2.sge())))
        assert poll_one(a2.cq).status == ibv.IBV_WC_SUCCESS
        wc = poll_one(b2.cq)
        assert (wc.status, wc.opcode, wc.wr_id, wc.byte_len) == (ibv.IBV_WC_SUCCESS, ibv.IBV_WC_RECV, 77, 13)
        assert wc.wc_flags & ibv.IBV_WC_WITH_IMM and wc.imm_data == 0x1234
        assert wc.qp_num == b2.qp.qp_num
        assert bytes(rbuf[:13]) == b"Hello, world!"
    finally:
        a2.ctx.close()
        b2.ctx.close()


def test_atomics(pair):
    a, b = pair
    if np is None:
        pytest.skip("numpy is not installed")
    target = np.array([40, 7], dtype=np.uint64)
    old = np.zeros(2, dtype=np.uint64)
    mr_t = b.pd.mr(target, ALL_ACCESS)
    mr_o = a.pd.mr(old, ibv.IBV_ACCESS_LOCAL_WRITE)
    a.qp.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_ATOMIC_FETCH_AND_ADD, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_o.sge(8, 0), remote_addr=mr_t.addr, rkey=mr_t.rkey, compare_add=2))
    assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
    a.qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_ATOMIC_CMP_AND_SWP, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_o.sge(8, 8), remote_addr=mr_t.addr + 8, rkey=mr_t.rkey, compare_add=7,
                               swap=99))
    assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
    assert list(old) == [40, 7]
    assert list(target) == [42, 99]


def test_spec_wc_error_handling_bad_rkey(pair):
    # 7.2.4: a bad rkey completes with IBV_WC_REM_ACCESS_ERR; WCError formats it and names the QP.
    a, b = pair
    src = bytearray(b"z" * 64)
    dst = bytearray(64)
    mr_src = a.pd.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
    mr_dst = b.pd.mr(dst, ALL_ACCESS)
    a.qp.post_send(ibv.send_wr(wr_id=3, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                               sg_list=mr_src.sge(), remote_addr=mr_dst.addr, rkey=mr_dst.rkey ^ 0x5A5A00))
    cq = a.cq
    deadline = time.monotonic() + WAIT
    caught = None
    while caught is None and time.monotonic() < deadline:
        wcs = cq.poll()
        for wc in wcs:
            try:
                if wc.status != ibv.IBV_WC_SUCCESS:
                    raise ibv.WCError(wc, cq)
            except ibv.WCError as err:
                caught = err
    assert caught is not None
    assert caught.wc.status == ibv.IBV_WC_REM_ACCESS_ERR
    assert caught.wc.wr_id == 3
    assert caught.qp is a.qp and caught.cq is cq
    assert "remote access error" in str(caught)
    assert isinstance(caught, ferry.RDMAError) and isinstance(caught, ferry.WorkCompletionError)
    assert bytes(dst) == bytes(64)
    # The QP is in the error state; the target saw an access error.
    assert a.qp.state == ibv.IBV_QPS_ERR
    event = b.ctx.get_async_event(timeout=WAIT)
    assert event is not None and event.event_type == ibv.IBV_EVENT_QP_ACCESS_ERR
    assert event.obj is b.qp
    with pytest.raises(ibv.AsyncError):
        b.ctx.handle_async_event(event)


def test_post_send_list_with_invalid_request_names_its_index(pair):
    a, b = pair
    src = bytearray(64)
    dst = bytearray(64)
    mr_src = a.pd.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
    mr_dst = b.pd.mr(dst, ALL_ACCESS)
    good = ibv.send_wr(wr_id=10, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                       sg_list=mr_src.sge(8), remote_addr=mr_dst.addr, rkey=mr_dst.rkey)
    too_many_sges = ibv.send_wr(wr_id=11, opcode=ibv.IBV_WR_RDMA_WRITE, sg_list=[mr_src.sge(4), mr_src.sge(4, 4)],
                                remote_addr=mr_dst.addr, rkey=mr_dst.rkey)
    with pytest.raises(ibv.WRError) as info:
        a.qp.post_send([good, too_many_sges, good])
    err = info.value
    assert err.bad_index == 1
    assert err.func == "ibv_post_send" and err.errno == 22
    assert isinstance(err, ferry.SysError) and isinstance(err, ferry.InvalidArgument)
    # The request before the bad one was posted and completes.
    assert poll_one(a.cq).wr_id == 10
    assert a.cq.poll() == []

    # Inline data outside any registered region of the PD is refused before the device reads it.
    stray = ibv.send_wr(wr_id=12, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_INLINE,
                        sg_list=ibv.sge(addr=8, length=8, lkey=mr_src.lkey))
    with pytest.raises(ibv.WRError) as info:
        a.qp.post_send([good, good, stray])
    assert info.value.bad_index == 2
    # Types are checked before anything is posted.
    with pytest.raises(TypeError):
        a.qp.post_send([good, ibv.recv_wr()])
    with pytest.raises(TypeError):
        a.qp.post_send([])
    with pytest.raises(TypeError):
        a.qp.post_send(ibv.send_wr(sg_list="not an sge"))


def test_post_recv_list_overflow_names_its_index(pair):
    a, b = pair
    mr = b.pd.mr(bytearray(1024), ibv.IBV_ACCESS_LOCAL_WRITE)
    wrs = [ibv.recv_wr(wr_id=i, sg_list=mr.sge(32, 32 * i)) for i in range(20)]
    with pytest.raises(ibv.WRError) as info:
        b.qp.post_recv(wrs)
    assert info.value.bad_index == 16  # max_recv_wr is 16
    assert info.value.func == "ibv_post_recv"


def test_spec_completion_channel_loop(pair):
    # 7.2.5: get_wcs() exactly as the document writes it, around a completion channel.
    a, b = pair
    end_port = a.ctx.end_port
    ctx = ferry.get_verbs(end_port)
    depth = 8
    try:
        cc = ctx.comp_channel()
        poll = select.poll()
        cc.register_poll(poll)
        cq = ctx.cq(2 * depth, cc)
        pd = ctx.pd()
        side = Side.__new__(Side)
        side.ctx, side.pd, side.cq, side.cc = ctx, pd, cq, cc
        side.qp = pd.qp(ibv.IBV_QPT_RC, depth, cq, depth, cq)
        peer = Side(end_port)
        connect(side, peer)
        buf = bytearray(16)
        mr = pd.mr(buf, ibv.IBV_ACCESS_LOCAL_WRITE)
        side.qp.post_recv(ibv.recv_wr(wr_id=42, sg_list=mr.sge()))

        def get_wcs():
            cq.req_notify()
            while True:
                ret = poll.poll(WAIT * 1000)
                assert ret, "the completion channel did not fire"
                for I in ret:
                    if cc.check_poll(I) is not None:
                        wcs = cq.poll()
                        if wcs is not None:
                            return wcs

        pmr = peer.pd.mr(bytearray(b"ping"), ibv.IBV_ACCESS_LOCAL_WRITE)
        # The peer sends once get_wcs() has armed the CQ (completion events are edge triggered).
        timer = threading.Timer(0.1, lambda: peer.qp.post_send(
            ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_SEND, sg_list=pmr.sge())))
        timer.start()
        wcs = get_wcs()
        timer.join()
        assert [w.wr_id for w in wcs] == [42]
        assert bytes(buf[:4]) == b"ping"
        assert cq.comp_events == 1
        peer.ctx.close()
    finally:
        ctx.close()


def test_spec_cq_poller_iterwc(pair):
    # 7.2.5: CQPoller over a CQ with a completion channel.
    a, b = pair
    ctx = a.ctx
    depth = 8
    cc = ctx.comp_channel()
    cq = ctx.cq(2 * depth, cc)
    poller = ferry.vtools.CQPoller(cq)
    t0 = time.monotonic()
    got = list(poller.iterwc(timeout=0.3))
    elapsed = time.monotonic() - t0
    assert got == []
    assert poller.timedout
    assert 0.25 <= elapsed < 2.0
    # wakeat stops iteration at a clock_monotonic() value.
    poller2 = ferry.vtools.CQPoller(cq)
    assert list(poller2.iterwc(wakeat=ferry.tools.clock_monotonic() + 0.1)) == []
    assert poller2.timedout


def test_cq_poller_count_returns_completions_from_the_channel(pair):
    a, b = pair
    ctx = b.ctx
    cc = ctx.comp_channel()
    cq = ctx.cq(32, cc)
    pd = b.pd
    qp = pd.qp(ibv.IBV_QPT_RC, 8, cq, 8, cq)
    peer = Side(ctx.end_port)
    me = Side.__new__(Side)
    me.ctx, me.pd, me.cq, me.cc, me.qp = ctx, pd, cq, cc, qp
    connect(peer, me)
    try:
        rmr = pd.mr(bytearray(256), ibv.IBV_ACCESS_LOCAL_WRITE)
        qp.post_recv([ibv.recv_wr(wr_id=i, sg_list=rmr.sge(64, 64 * i)) for i in range(4)])
        smr = peer.pd.mr(bytearray(b"abcd"), ibv.IBV_ACCESS_LOCAL_WRITE)
        poller = ferry.vtools.CQPoller(cq)
        # The sends are posted after the poller went to sleep on the channel.
        timer = threading.Timer(0.1, lambda: peer.qp.post_send(
            [ibv.send_wr(wr_id=i, opcode=ibv.IBV_WR_SEND, sg_list=smr.sge()) for i in range(3)]))
        timer.start()
        wcs = list(poller.iterwc(count=3, timeout=WAIT))
        timer.join()
        assert [w.wr_id for w in wcs] == [0, 1, 2]
        assert not poller.timedout
        assert all(w.opcode == ibv.IBV_WC_RECV and w.byte_len == 4 for w in wcs)
    finally:
        peer.ctx.close()


def test_close_while_work_is_outstanding_flushes_and_never_crashes(pair):
    a, b = pair
    buf = bytearray(1 << 16)
    mr = b.pd.mr(buf, ALL_ACCESS)
    src = a.pd.mr(bytearray(1 << 16), ibv.IBV_ACCESS_LOCAL_WRITE)
    a.qp.post_send([ibv.send_wr(wr_id=i, opcode=ibv.IBV_WR_RDMA_WRITE, sg_list=src.sge(), remote_addr=mr.addr,
                                rkey=mr.rkey, send_flags=ibv.IBV_SEND_SIGNALED) for i in range(8)])
    b.ctx.close()   # the target goes away with writes in flight
    mr_closed_buf = buf
    mr_closed_buf.extend(b"!")   # its memory is released back to Python at once
    a.ctx.close()
    with pytest.raises(ferry.Closed):
        a.cq.poll()


def test_raw_modify_with_qp_attr_and_path_as_ah_attr():
    end_port = ferry.get_end_port()
    a, b = Side(end_port), Side(end_port)
    try:
        path_a, path_b = connect(a, b)
        # A fresh QP on side A, taken through the states by hand, with the path as ah_attr.
        qp = a.pd.qp(ibv.IBV_QPT_RC, 4, a.cq, 4, a.cq)
        with pytest.raises(ferry.SysError) as info:
            qp.modify(ibv.qp_attr(qp_state=ibv.IBV_QPS_RTS), ibv.IBV_QP_STATE)  # RESET -> RTS is illegal
        assert info.value.func == "ibv_modify_qp" and info.value.errno == 22
        attr = ibv.qp_attr(qp_state=ibv.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=ibv.IBV_ACCESS_REMOTE_WRITE)
        qp.modify(attr, attr.MASK)
        assert qp.state == ibv.IBV_QPS_INIT
        attr = ibv.qp_attr(qp_state=ibv.IBV_QPS_RTR, path_mtu=path_a.MTU, dest_qp_num=path_a.dqpn,
                           rq_psn=path_a.dqpsn, max_dest_rd_atomic=1, min_rnr_timer=12, ah_attr=path_a)
        qp.modify(attr, attr.MASK)
        got, _ = qp.query()
        assert got.qp_state == ibv.IBV_QPS_RTR
        assert got.dest_qp_num == path_a.dqpn and got.rq_psn == path_a.dqpsn
        assert got.ah_attr.grh.dgid == path_a.DGID and got.ah_attr.is_global
        with pytest.raises(TypeError):
            qp.modify("not a qp_attr", ibv.IBV_QP_STATE)
        with pytest.raises(ValueError):
            qp.modify(ibv.qp_attr(rq_psn=1 << 24), ibv.IBV_QP_RQ_PSN)
    finally:
        a.ctx.close()
        b.ctx.close()


def test_cq_poller_raises_async_errors_while_sleeping():
    end_port = ferry.get_end_port()
    a, b = Side(end_port), Side(end_port, channel=True)
    try:
        connect(a, b)
        mr_src = a.pd.mr(bytearray(8), ibv.IBV_ACCESS_LOCAL_WRITE)
        mr_dst = b.pd.mr(bytearray(8), ALL_ACCESS)
        poller = ferry.vtools.CQPoller(b.cq)
        timer = threading.Timer(0.1, lambda: a.qp.post_send(ibv.send_wr(
            opcode=ibv.IBV_WR_RDMA_WRITE, sg_list=mr_src.sge(), remote_addr=mr_dst.addr, rkey=mr_dst.rkey + 1)))
        timer.start()
        with pytest.raises(ibv.AsyncError) as info:
            for _ in poller.iterwc(timeout=WAIT):
                pass
        timer.join()
        assert info.value.event.event_type == ibv.IBV_EVENT_QP_ACCESS_ERR
        assert info.value.event.obj is b.qp
        assert "IBV_EVENT_QP_ACCESS_ERR" in str(info.value)
    finally:
        a.ctx.close()
        b.ctx.close()


def test_inline_send_from_registered_memory():
    end_port = ferry.get_end_port()
    a, b = Side(end_port, max_inline_data=64), Side(end_port)
    try:
        connect(a, b)
        msg = bytearray(b"inline payload")
        mr = a.pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
        rbuf = bytearray(32)
        rmr = b.pd.mr(rbuf, ibv.IBV_ACCESS_LOCAL_WRITE)
        b.qp.post_recv(ibv.recv_wr(wr_id=1, sg_list=rmr.sge()))
        a.qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_SEND,
                                   send_flags=ibv.IBV_SEND_INLINE | ibv.IBV_SEND_SIGNALED, sg_list=mr.sge()))
        msg[:] = b"X" * len(msg)  # inline data was copied at post time
        assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
        wc = poll_one(b.cq)
        assert bytes(rbuf[:wc.byte_len]) == b"inline payload"
    finally:
        a.ctx.close()
        b.ctx.close()


def test_receives_posted_before_establish_are_kept_and_delivered():
    """The verbs document posts receives and then establishes ("Post receive work requests to qp
    here"): the QP moves from RESET to INIT for them, establish() still applies the path's access
    flags (INIT -> INIT), and the receives take the peer's SENDs in order."""
    end_port = ferry.get_end_port()
    a, b = Side(end_port), Side(end_port)
    try:
        rbuf = bytearray(32)
        rmr = b.pd.mr(rbuf, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        assert b.qp.query(ibv.IBV_QP_STATE)[0].qp_state == ibv.IBV_QPS_RESET
        b.qp.post_recv([ibv.recv_wr(wr_id=1, sg_list=rmr.sge(length=16, off=0)),
                        ibv.recv_wr(wr_id=2, sg_list=rmr.sge(length=16, off=16))])
        assert b.qp.query(ibv.IBV_QP_STATE)[0].qp_state == ibv.IBV_QPS_INIT
        connect(a, b, access=ibv.IBV_ACCESS_REMOTE_WRITE)
        assert b.qp.query(ibv.IBV_QP_ACCESS_FLAGS)[0].qp_access_flags & ibv.IBV_ACCESS_REMOTE_WRITE
        sbuf = bytearray(b"first message...second message..")
        smr = a.pd.mr(sbuf, ibv.IBV_ACCESS_LOCAL_WRITE)
        for i in range(2):
            a.qp.post_send(ibv.send_wr(wr_id=10 + i, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED,
                                       sg_list=smr.sge(length=16, off=16 * i)))
        got = [poll_one(b.cq) for _ in range(2)]
        assert [(wc.status, wc.wr_id, wc.byte_len) for wc in got] == [(ibv.IBV_WC_SUCCESS, 1, 16),
                                                                     (ibv.IBV_WC_SUCCESS, 2, 16)]
        assert bytes(rbuf) == bytes(sbuf)
        # The peer may WRITE into b: establish() applied the path's access flags over INIT's.
        a.qp.post_send(ibv.send_wr(wr_id=20, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=smr.sge(length=8), remote_addr=rmr.addr, rkey=rmr.rkey))
        assert [poll_one(a.cq).status for _ in range(3)] == [ibv.IBV_WC_SUCCESS] * 3
        assert bytes(rbuf[:8]) == b"first me"
    finally:
        a.ctx.close()
        b.ctx.close()


def test_uc_queue_pairs_write_and_send_without_acknowledgements():
    """IBV_QPT_UC through the document's no-CM set-up: WRITE and SEND arrive; READ is refused at
    post; a SEND no receive waits for completes at the sender and is dropped at the target."""
    end_port = ferry.get_end_port()
    a, b = Side(end_port, qp_type=ibv.IBV_QPT_UC), Side(end_port, qp_type=ibv.IBV_QPT_UC)
    try:
        connect(a, b, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        assert a.qp.state == ibv.IBV_QPS_RTS and b.qp.state == ibv.IBV_QPS_RTS
        src = bytearray(b"unreliable but connected" * 10)
        dst = bytearray(len(src))
        mr_src = a.pd.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
        mr_dst = b.pd.mr(dst, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        a.qp.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=mr_src.sge(16)))  # no receive posted: dropped
        assert poll_one(a.cq).status == ibv.IBV_WC_SUCCESS
        b.qp.post_recv(ibv.recv_wr(wr_id=7, sg_list=mr_dst.sge()))
        a.qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=mr_src.sge()))
        got = poll_one(b.cq)
        assert (got.wr_id, got.status, got.byte_len) == (7, ibv.IBV_WC_SUCCESS, len(src))
        assert dst == src
        dst[:] = bytes(len(dst))
        a.qp.post_send(ibv.send_wr(wr_id=3, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=mr_src.sge(), remote_addr=mr_dst.addr, rkey=mr_dst.rkey))
        assert [w.wr_id for w in ferry.vtools.CQPoller(a.cq).iterwc(count=2, timeout=WAIT)] == [2, 3]
        deadline = time.monotonic() + WAIT
        while dst != src and time.monotonic() < deadline:
            time.sleep(0.001)
        assert dst == src
        with pytest.raises(ibv.WRError) as info:
            a.qp.post_send(ibv.send_wr(wr_id=4, opcode=ibv.IBV_WR_RDMA_READ, sg_list=mr_src.sge(8),
                                       remote_addr=mr_dst.addr, rkey=mr_dst.rkey))
        assert info.value.bad_index == 0 and isinstance(info.value, ferry.InvalidArgument)
    finally:
        a.ctx.close()
        b.ctx.close()
