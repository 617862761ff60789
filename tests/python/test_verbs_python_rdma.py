"""The verbs patterns of python-rdma's own test suite, as its programs write them, on ferry.verbs.

Each test does what one of that suite's tests does (their names are kept): the basics of a UD
QP (attach and detach a multicast group, an AH for the port's SA path, an SRQ), the loop of two
UD QPs over one SRQ and a BufferPool, a send that runs past its memory region and surfaces as
WCError from ``BufferPool.finish_wcs``, and a multicast receive whose GRH (read by ``WCPath``)
says what a NIC writes: the group as destination, the sender's traffic class, flow label and hop
limit. And a send through the SA path's LID-routed AH, which arrives without a GRH.
"""

import os
import sys

import pytest

import ferry
import ferry.IBA as IBA
import ferry.path
import ferry.verbs as ibv
import ferry.vtools
from ferry.path import IBPath

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_verbs_ud import ud_supported  # noqa: E402

WAIT = 5.0
DEPTH = 16

_REFUSAL = ud_supported()
pytestmark = pytest.mark.skipif(_REFUSAL is not None, reason="no UD QPs on this provider: %s" % _REFUSAL)


@pytest.fixture
def end_port():
    return ferry.get_end_port()


@pytest.fixture
def ctx(end_port):
    with ferry.get_verbs(end_port) as ctx:
        yield ctx


def test_basic(end_port, ctx):
    pd = ctx.pd()
    cq = ctx.cq(100)
    assert cq.poll() == []
    qp = pd.qp(ibv.IBV_QPT_UD, 100, cq, 100, cq)
    mpath = IBPath(ctx.end_port, DLID=0xC000, DGID=IBA.GID("ff02::1"))
    qp.attach_mcast(mpath)
    qp.detach_mcast(mpath)
    with pytest.raises(TypeError):
        pd.ah(None)
    ah = pd.ah(end_port.sa_path)  # LID-routed: no GRH, the port's own SA
    assert not ah.closed
    srq = pd.srq()
    assert srq.query().max_wr >= 1
    srq.modify(100)
    # A LID this port cannot reach is refused, and says why.
    with pytest.raises(ferry.InvalidArgument, match="LID 4660"):
        pd.ah(IBPath(end_port, DLID=0x1234))


def _get_loop(ctx, pd, qp_type, depth=DEPTH):
    """Two QPs on one CQ and one SRQ, each path the reverse of the other (python-rdma's _get_loop)."""
    end_port = ctx.end_port
    cc = ctx.comp_channel()
    cq = ctx.cq(2 * depth, cc)
    poller = ferry.vtools.CQPoller(cq, cc)
    srq = pd.srq(depth)
    pool = ferry.vtools.BufferPool(pd, 2 * depth, 256 + 40)
    pool.post_recvs(srq, depth)
    path_a = IBPath(end_port, qkey=999, DGID=end_port.default_gid)
    with ferry.get_gmp_mad(end_port, verbs=ctx) as vmad:
        ferry.path.resolve_path(vmad, path_a, reversible=True)
    qp_a = pd.qp(qp_type, depth, cq, depth, cq, srq=srq)
    ferry.path.fill_path(qp_a, path_a, max_rd_atomic=0)
    qp_b = pd.qp(qp_type, depth, cq, depth, cq, srq=srq)
    path_b = path_a.copy().reverse(for_reply=False)
    ferry.path.fill_path(qp_b, path_b, max_rd_atomic=0)
    qp_b.establish(path_b)
    path_a = path_b.copy().reverse(for_reply=False)
    qp_a.establish(path_a)
    return path_a, qp_a, path_b, qp_b, poller, srq, pool


def test_ud_loop(ctx):
    with ctx.pd() as pd:
        path_a, qp_a, path_b, qp_b, poller, srq, pool = _get_loop(ctx, pd, ibv.IBV_QPT_UD)
        qp_b.post_send(pool.make_send_wr(pool.pop(), 256, path_b))
        qp_a.post_send(pool.make_send_wr(pool.pop(), 256, path_a))
        recvs = sends = 0
        for wc in poller.iterwc(count=4, timeout=WAIT):
            assert wc.status == ibv.IBV_WC_SUCCESS, ibv.WCError(wc, poller._cq)
            if wc.opcode & ibv.IBV_WC_RECV:
                recvs += 1
            if wc.opcode == ibv.IBV_WC_SEND:
                sends += 1
            pool.finish_wcs(srq, wc)
        assert not poller.timedout
        assert (recvs, sends) == (2, 2)


def test_wc_raise(ctx):
    """Go past the end of the MR during a send: posted, then an error completion, as on a NIC."""
    with ctx.pd() as pd:
        path_a, qp_a, path_b, qp_b, poller, srq, pool = _get_loop(ctx, pd, ibv.IBV_QPT_UD)
        wr = pool.make_send_wr(pool.pop(), 256, path_b)
        wr.sg_list.length = 1024 * 1024
        qp_b.post_send(wr)
        seen = []
        for wc in poller.iterwc(count=1, timeout=WAIT):
            seen.append(wc)
            assert wc.status != ibv.IBV_WC_SUCCESS and wc.qp_num == qp_b.qp_num
            assert wc.status == ibv.IBV_WC_LOC_PROT_ERR
            with pytest.raises(ibv.WCError):
                pool.finish_wcs(srq, wc)
        assert len(seen) == 1 and not poller.timedout
        # Within the MR but above the MTU: a local length error, nothing sent.
        if ctx.node.provider == "soft":
            big = pd.mr(bytearray(8192), ibv.IBV_ACCESS_LOCAL_WRITE)
            qp_b.post_send(ibv.send_wr(wr_id=77, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED,
                                       ah=pd.ah(path_b), remote_qpn=path_b.dqpn, remote_qkey=path_b.qkey,
                                       sg_list=big.sge()))
            wcs = list(poller.iterwc(count=1, timeout=WAIT))
            assert [(w.wr_id, w.status) for w in wcs] == [(77, ibv.IBV_WC_LOC_LEN_ERR)]
        # Nothing arrived at qp_a.
        assert list(poller.iterwc(count=1, timeout=0.2)) == []


def test_multicast_grh_is_the_one_a_nic_writes(end_port, ctx):
    """A group send received by another QP: WCPath of it gives the group as DGID and the sender's
    SGID, traffic class, flow label and hop limit."""
    group = IBA.GID("ff02::4652:%x" % (os.getpid() & 0xFFFF))
    pd = ctx.pd()
    cq = ctx.cq(8)
    member = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
    member.establish(IBPath(end_port, qkey=0x1234, sqpn=member.qp_num))
    buf = bytearray(ibv.GRH_BYTES + 64)
    rmr = pd.mr(buf, ibv.IBV_ACCESS_LOCAL_WRITE)
    member.post_recv(ibv.recv_wr(wr_id=1, sg_list=rmr.sge()))
    member.attach_mcast(IBPath(end_port, DGID=group))
    sender = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
    sender.establish(IBPath(end_port, qkey=0x1234, sqpn=sender.qp_num))
    msg = bytearray(b"to the group")
    smr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
    path = IBPath(end_port, DGID=group, has_grh=True, dqpn=0xFFFFFF, qkey=0x1234, flow_label=0x2468A,
                  traffic_class=0x28, hop_limit=7)
    sender.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED, ah=pd.ah(path),
                                 remote_qpn=0xFFFFFF, remote_qkey=0x1234, wr_id=2, sg_list=smr.sge()))
    wcs = {w.wr_id: w for w in ferry.vtools.CQPoller(cq).iterwc(count=2, timeout=WAIT)}
    assert sorted(wcs) == [1, 2] and all(w.status == ibv.IBV_WC_SUCCESS for w in wcs.values())
    wc = wcs[1]
    assert wc.wc_flags & ibv.IBV_WC_GRH and wc.src_qp == sender.qp_num
    got = ibv.WCPath(end_port, wc, buf, 0)
    assert got.DGID == group
    assert got.SGID == IBA.GID(ctx.query_gid(1, 0), raw=True)
    assert (got.flow_label, got.traffic_class, got.hop_limit) == (0x2468A, 0x28, 7)
    assert bytes(buf[ibv.GRH_BYTES:wc.byte_len]) == bytes(msg)
    member.detach_mcast(IBPath(end_port, DGID=group))


def test_a_send_through_the_lid_routed_sa_path_arrives_without_a_grh(end_port, ctx):
    pd = ctx.pd()
    cq = ctx.cq(8)
    rx = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
    rx.establish(IBPath(end_port, qkey=IBA.IB_DEFAULT_QP1_QKEY, sqpn=rx.qp_num))
    buf = bytearray(b"\xee" * (ibv.GRH_BYTES + 64))
    rmr = pd.mr(buf, ibv.IBV_ACCESS_LOCAL_WRITE)
    rx.post_recv(ibv.recv_wr(wr_id=1, sg_list=rmr.sge()))
    tx = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
    tx.establish(IBPath(end_port, qkey=IBA.IB_DEFAULT_QP1_QKEY, sqpn=tx.qp_num))
    path = end_port.sa_path
    msg = bytearray(b"by LID")
    smr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
    tx.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED, ah=pd.ah(path),
                             remote_qpn=rx.qp_num, remote_qkey=path.qkey, wr_id=2, sg_list=smr.sge()))
    wcs = {w.wr_id: w for w in ferry.vtools.CQPoller(cq).iterwc(count=2, timeout=WAIT)}
    assert sorted(wcs) == [1, 2] and all(w.status == ibv.IBV_WC_SUCCESS for w in wcs.values())
    assert not wcs[1].wc_flags & ibv.IBV_WC_GRH
    assert bytes(buf[:ibv.GRH_BYTES]) == b"\xee" * ibv.GRH_BYTES, "the GRH bytes of the receive were written"
    assert bytes(buf[ibv.GRH_BYTES:ibv.GRH_BYTES + len(msg)]) == bytes(msg)
    # WCPath of a receive without a GRH is LID-routed too: has_grh stays off.
    assert not ibv.WCPath(end_port, wcs[1], buf, 0).has_grh
