"""ferry.verbs: devices, the object tree, memory registration, structures, constants, errors."""

import gc
import mmap
import select

import pytest

import ferry
import ferry.verbs as ibv

try:
    import numpy as np
except ImportError:  # numpy is optional for ferry; the tests that need it skip
    np = None


@pytest.fixture
def ctx():
    with ferry.get_verbs(ferry.get_end_port()) as c:
        yield c


def test_default_end_port_is_first_device_port_1():
    end_port = ferry.get_end_port()
    first = ferry.get_devices()[0]
    assert end_port.parent.name == first.name
    assert end_port.port_id == 1
    assert str(end_port) == "%s/1" % first.name
    assert ferry.get_end_port(first.name) == end_port
    assert ferry.get_end_port(first.name + "/1") == end_port
    with pytest.raises(ferry.RDMAError):
        ferry.get_end_port("no_such_device")
    with pytest.raises(ferry.RDMAError):
        ferry.get_end_port(first.name + "/9")


def test_soft_lo_is_always_there():
    names = [d.name for d in ferry.get_devices()]
    assert "soft_lo" in names
    dev = ferry.get_device("soft_lo")
    assert dev.address == "127.0.0.1"
    assert dev.provider == "soft"
    # What it is, as the layers above ask it: each context reached at the address and a port of
    # its own, one port, and the ACK delay its progress thread holds (4.096 us * 2**10).
    assert dev.addressed_by_context is True
    assert len(dev.end_ports) == 1
    with ferry.get_verbs(dev.end_ports[0]) as ctx:
        assert ctx.query_device().local_ca_ack_delay == 10


def test_spec_basic_example():
    # 7. "A basic example for getting a verbs instance and a protection domain"
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()
        assert isinstance(pd, ibv.PD)
        assert pd.ctx is ctx
        assert ctx.end_port is end_port
    assert ctx.closed and pd.closed


def test_closing_context_closes_every_child(ctx):
    pd = ctx.pd()
    cc = ctx.comp_channel()
    cq = ctx.cq(16, cc)
    qp = pd.qp(ibv.IBV_QPT_RC, 4, cq, 4, cq)
    buf = bytearray(128)
    mr = pd.mr(buf, ibv.IBV_ACCESS_LOCAL_WRITE)
    srq = pd.srq(8)
    objs = [pd, cc, cq, qp, mr, srq]
    assert not any(o.closed for o in objs)
    ctx.close()
    assert all(o.closed for o in objs)
    # The MR gave the buffer back: it can be resized again.
    buf.extend(b"more")
    # Closing again (parent or child) is harmless.
    ctx.close()
    for o in objs:
        o.close()


def test_closing_pd_closes_its_children_only(ctx):
    pd = ctx.pd()
    cq = ctx.cq(16)
    qp = pd.qp(ibv.IBV_QPT_RC, 4, cq, 4, cq)
    mr = pd.mr(bytearray(16), ibv.IBV_ACCESS_LOCAL_WRITE)
    with pd:
        pass
    assert pd.closed and qp.closed and mr.closed
    assert not cq.closed
    assert cq.poll() == []


def test_use_after_close_raises_ferry_error(ctx):
    pd = ctx.pd()
    cq = ctx.cq(16)
    cc = ctx.comp_channel()
    qp = pd.qp(ibv.IBV_QPT_RC, 4, cq, 4, cq)
    mr = pd.mr(bytearray(16), ibv.IBV_ACCESS_LOCAL_WRITE)
    ctx.close()
    calls = [
        ctx.pd, lambda: ctx.cq(4), ctx.comp_channel, ctx.query_device, ctx.query_port,
        lambda: pd.mr(bytearray(4)), lambda: pd.qp(ibv.IBV_QPT_RC, 1, cq, 1, cq), lambda: pd.srq(4),
        cq.poll, cq.req_notify, lambda: cq.resize(8), cc.fileno,
        lambda: qp.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND)), lambda: qp.post_recv(ibv.recv_wr()),
        lambda: qp.state, lambda: mr.lkey, lambda: mr.sge(),
    ]
    for call in calls:
        with pytest.raises(ferry.Closed):
            call()


def test_children_keep_parents_alive():
    end_port = ferry.get_end_port()
    ctx = ferry.get_verbs(end_port)
    pd = ctx.pd()
    cq = ctx.cq(8)
    qp = pd.qp(ibv.IBV_QPT_RC, 2, cq, 2, cq)
    del ctx, pd
    gc.collect()
    # The QP still names its PD and context; they are the same Python objects as before.
    assert isinstance(qp.pd, ibv.PD) and isinstance(qp.ctx, ibv.Context)
    assert qp.ctx.end_port is end_port
    qp.ctx.close()
    assert qp.closed


@pytest.mark.parametrize("kind", ["bytes", "str", "bytearray", "mmap", "numpy", "memoryview"])
def test_mr_over_python_buffers(ctx, kind):
    pd = ctx.pd()
    if kind == "bytes":
        buf, access = b"Hello", ibv.IBV_ACCESS_REMOTE_READ
    elif kind == "str":
        buf, access = "Hello", ibv.IBV_ACCESS_REMOTE_READ
    elif kind == "bytearray":
        buf, access = bytearray(256), ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE
    elif kind == "mmap":
        buf, access = mmap.mmap(-1, 256), ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE
    elif kind == "numpy":
        if np is None:
            pytest.skip("numpy is not installed")
        buf, access = np.zeros(64, dtype=np.uint32), ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE
    else:
        buf, access = memoryview(bytearray(32)), ibv.IBV_ACCESS_LOCAL_WRITE
    mr = pd.mr(buf, access)
    expected_len = len(buf) * (4 if kind == "numpy" else 1)
    assert mr.length == expected_len
    assert mr.lkey != 0 and mr.rkey != 0
    s = mr.sge()
    assert (s.addr, s.length, s.lkey) == (mr.addr, expected_len, mr.lkey)
    mr.close()


def test_mr_keeps_buffer_alive_and_unresizable(ctx):
    pd = ctx.pd()
    data = bytearray(b"x" * 64)
    mr = pd.mr(data, ibv.IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(BufferError):
        data.extend(b"y")
    m = mmap.mmap(-1, 4096)
    mr2 = pd.mr(m, ibv.IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(BufferError):
        m.close()
    # Dropping the caller's reference does not free the memory: the MR holds it.
    del data
    gc.collect()
    assert bytes(mr.buf) == b"x" * 64
    mr.close()
    mr2.close()
    m.close()
    assert mr.buf is None


def test_read_only_buffer_with_write_access_is_refused(ctx):
    pd = ctx.pd()
    for flags in (ibv.IBV_ACCESS_LOCAL_WRITE, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE,
                  ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_ATOMIC):
        with pytest.raises(TypeError):
            pd.mr(b"read only", flags)
        with pytest.raises(TypeError):
            pd.mr("read only", flags)
    with pytest.raises(TypeError):
        pd.mr(object(), 0)
    if np is not None:
        strided = np.zeros(16, dtype=np.uint8)[::2]
        with pytest.raises(TypeError):
            pd.mr(strided, ibv.IBV_ACCESS_LOCAL_WRITE)
        frozen = np.zeros(16, dtype=np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(TypeError):
            pd.mr(frozen, ibv.IBV_ACCESS_LOCAL_WRITE)


def test_verbs_refusal_is_sys_error_with_function_and_errno(ctx):
    pd = ctx.pd()
    # REMOTE_WRITE without LOCAL_WRITE is refused by verbs with EINVAL.
    with pytest.raises(ferry.SysError) as info:
        pd.mr(bytearray(8), ibv.IBV_ACCESS_REMOTE_WRITE)
    assert info.value.func == "ibv_reg_mr"
    assert info.value.errno == 22
    assert isinstance(info.value, ferry.InvalidArgument)
    assert "ibv_reg_mr" in str(info.value)
    with pytest.raises(ferry.SysError) as info:
        ctx.cq(0)
    assert info.value.func == "ibv_create_cq"


def test_mr_sge(ctx):
    pd = ctx.pd()
    mr = pd.mr(bytearray(256), ibv.IBV_ACCESS_LOCAL_WRITE)
    full = mr.sge()
    part = mr.sge(length=128, off=10)
    assert full.length == 256 and full.addr == mr.addr
    assert (part.addr, part.length, part.lkey) == (mr.addr + 10, 128, mr.lkey)
    assert mr.sge(off=250).length == 6
    with pytest.raises(ValueError):
        mr.sge(length=250, off=10)
    with pytest.raises(ValueError):
        mr.sge(off=-1)


def test_structures_keyword_construction_and_assignment():
    wr = ibv.send_wr(opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED, wr_id=5)
    assert (wr.opcode, wr.send_flags, wr.wr_id, wr.sg_list, wr.ah) == (2, 2, 5, None, None)
    wr.remote_qpn = 0x123456
    wr.sg_list = [ibv.sge(addr=1, length=2, lkey=3)]
    assert wr.sg_list[0] == ibv.sge(1, 2, 3)
    with pytest.raises(TypeError):
        wr.wr_id = -1
    with pytest.raises(TypeError):
        wr.rkey = 1 << 32
    with pytest.raises(AttributeError):
        ibv.send_wr(no_such_field=1)
    assert "opcode=2" in repr(wr)
    rwr = ibv.recv_wr(wr_id=9, sg_list=ibv.sge(addr=4, length=5, lkey=6))
    assert rwr.sg_list.length == 5

    attr = ibv.qp_attr(qp_state=ibv.IBV_QPS_INIT, pkey_index=0)
    assert attr.MASK == ibv.IBV_QP_STATE | ibv.IBV_QP_PKEY_INDEX
    attr.qkey = 7
    assert attr.MASK & ibv.IBV_QP_QKEY
    with pytest.raises(TypeError):
        ibv.qp_attr(not_a_field=1)
    ah = ibv.ah_attr(dlid=3, is_global=1)
    ah.grh.hop_limit = 9
    assert ah.grh.hop_limit == 9 and ah.port_num == 1
    cap = ibv.qp_cap(max_send_wr=4)
    assert cap == ibv.qp_cap(max_send_wr=4) and cap != ibv.qp_cap(max_send_wr=5)


def test_constants_have_libibverbs_numbers():
    assert (ibv.IBV_QPT_RC, ibv.IBV_QPT_UC, ibv.IBV_QPT_UD) == (2, 3, 4)
    assert (ibv.IBV_WR_RDMA_WRITE, ibv.IBV_WR_SEND, ibv.IBV_WR_RDMA_READ,
            ibv.IBV_WR_ATOMIC_FETCH_AND_ADD) == (0, 2, 4, 6)
    assert (ibv.IBV_SEND_FENCE, ibv.IBV_SEND_SIGNALED, ibv.IBV_SEND_SOLICITED, ibv.IBV_SEND_INLINE) == (1, 2, 4, 8)
    assert (ibv.IBV_ACCESS_LOCAL_WRITE, ibv.IBV_ACCESS_REMOTE_WRITE, ibv.IBV_ACCESS_REMOTE_READ,
            ibv.IBV_ACCESS_REMOTE_ATOMIC) == (1, 2, 4, 8)
    assert (ibv.IBV_WC_SUCCESS, ibv.IBV_WC_WR_FLUSH_ERR, ibv.IBV_WC_REM_ACCESS_ERR, ibv.IBV_WC_RETRY_EXC_ERR) == \
        (0, 5, 10, 12)
    assert (ibv.IBV_WC_RECV, ibv.IBV_WC_RECV_RDMA_WITH_IMM) == (128, 129)
    assert (ibv.IBV_QPS_RESET, ibv.IBV_QPS_RTS, ibv.IBV_QPS_ERR) == (0, 3, 6)
    assert (ibv.IBV_QP_STATE, ibv.IBV_QP_AV, ibv.IBV_QP_DEST_QPN) == (1, 1 << 7, 1 << 20)
    assert (ibv.IBV_EVENT_CQ_ERR, ibv.IBV_EVENT_QP_ACCESS_ERR, ibv.IBV_EVENT_SRQ_LIMIT_REACHED) == (0, 3, 15)
    assert ibv.IBV_MTU_4096 == 5
    assert ibv.wc_status_str(ibv.IBV_WC_REM_ACCESS_ERR) == "remote access error"
    assert ferry.IBA.IB_DEFAULT_QP1_QKEY == 0x80010000 and ferry.IBA.DEFAULT_PKEY == 0xFFFF


def test_query_device_and_port(ctx):
    dev = ctx.query_device()
    assert dev.phys_port_cnt >= 1
    assert dev.max_qp_rd_atom > 0 and dev.max_sge >= 1
    assert isinstance(dev.node_guid, ferry.IBA.GUID)
    port = ctx.query_port()
    assert port.state == ibv.IBV_PORT_ACTIVE
    assert port.active_mtu in range(ibv.IBV_MTU_256, ibv.IBV_MTU_4096 + 1)
    assert ctx.end_port.mtu == port.active_mtu
    gid = ctx.end_port.default_gid
    assert gid == ferry.IBA.GID(ctx.query_gid(1, 0), raw=True)
    assert not gid.is_zero()


def test_cq_resize_and_attributes(ctx):
    cc = ctx.comp_channel()
    cq = ctx.cq(8, cc)
    assert cq.ctx is ctx and cq.comp_chan is cc and cq.comp_events == 0
    cq.resize(64)
    assert cq.cqe >= 64
    with pytest.raises(ferry.SysError):
        cq.resize(0)
    p = select.poll()
    cc.register_poll(p)
    cq.req_notify()
    assert p.poll(0) == []
    assert cc.check_poll((cc.fileno(), select.POLLIN)) is None


def test_async_event_wait_times_out(ctx):
    import time
    t0 = time.monotonic()
    assert ctx.get_async_event(timeout=0.2) is None
    assert time.monotonic() - t0 >= 0.15
    assert ctx.get_async_event() is None
    p = select.poll()
    ctx.register_poll(p)
    assert p.poll(0) == []  # nothing queued: the async fd is not readable
    assert ctx.check_poll((ctx.async_fd, select.POLLIN))
    assert not ctx.check_poll((ctx.async_fd + 1000, select.POLLIN))


def test_unsupported_operations_say_so(ctx):
    pd = ctx.pd()
    cq = ctx.cq(4)
    qp = pd.qp(ibv.IBV_QPT_RC, 1, cq, 1, cq)
    # Multicast is for UD queue pairs (see test_verbs_ud.py), and needs a group.
    with pytest.raises(ValueError):
        qp.attach_mcast(ferry.path.IBPath(ctx.end_port))
    with pytest.raises(ferry.InvalidArgument):
        qp.attach_mcast(ferry.path.IBPath(ctx.end_port, DGID=ferry.IBA.GID("ff0e::1")))
    srq = pd.srq(8)
    with pytest.raises(ferry.NotSupported):
        srq.modify(max_wr=16)
    srq.modify(srq_limit=2)
    assert srq.query() == ibv.srq_attr(max_wr=8, max_sge=1, srq_limit=2)


def test_srq_post_recv_and_qp_query(ctx):
    pd = ctx.pd()
    cq = ctx.cq(8)
    srq = pd.srq(4)
    qp = pd.qp(ibv.IBV_QPT_RC, 2, cq, 2, cq, srq=srq)
    mr = pd.mr(bytearray(64), ibv.IBV_ACCESS_LOCAL_WRITE)
    srq.post_recv([ibv.recv_wr(wr_id=i, sg_list=mr.sge(16, 16 * i)) for i in range(4)])
    with pytest.raises(ibv.WRError) as info:
        srq.post_recv(ibv.recv_wr(wr_id=9, sg_list=mr.sge(16)))
    assert info.value.bad_index == 0
    assert isinstance(info.value, ferry.ResourceExhausted)
    attr, init = qp.query()
    assert attr.qp_state == ibv.IBV_QPS_RESET
    assert init.srq is srq and init.send_cq is cq and init.cap.max_send_wr == 2
    assert qp.state == ibv.IBV_QPS_RESET
    assert pd.from_qp_num(qp.qp_num) is qp and ctx.from_qp_num(qp.qp_num) is qp
    assert ctx.from_qp_num(1) is None
