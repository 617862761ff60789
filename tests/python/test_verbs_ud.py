"""UD queue pairs through ferry.verbs: the single-destination set-up of 7.2.1, the reply path of
7.2.2 (WCPath), the 40-byte GRH at the head of receive buffers, Q_Keys, and BufferPool."""

import pytest

import ferry
import ferry.IBA as IBA
import ferry.path
import ferry.verbs as ibv
import ferry.vtools
from ferry.path import IBPath

WAIT = 5.0


def ud_supported():
    with ferry.get_verbs(ferry.get_end_port()) as ctx:
        cq = ctx.cq(1)
        try:
            ctx.pd().qp(ibv.IBV_QPT_UD, 1, cq, 1, cq)
        except ferry.NotSupported as err:
            return str(err)
    return None


_UD_REFUSAL = ud_supported()
pytestmark = pytest.mark.skipif(_UD_REFUSAL is not None,
                                reason="the provider reports UD QPs as not supported: %s" % _UD_REFUSAL)


class Receiver:
    """A UD QP on its own context with a BufferPool of posted receives."""

    def __init__(self, end_port, qkey=IBA.IB_DEFAULT_QP1_QKEY):
        self.ctx = ferry.get_verbs(end_port)
        self.pd = self.ctx.pd()
        self.cq = self.ctx.cq(64, self.ctx.comp_channel())
        self.qp = self.pd.qp(ibv.IBV_QPT_UD, 16, self.cq, 16, self.cq)
        self.path = IBPath(end_port, qkey=qkey)
        self.path.sqpn = self.qp.qp_num
        self.pool = ferry.vtools.BufferPool(self.pd, 32, 512)
        self.qp.establish(self.path)
        self.pool.post_recvs(self.qp, 8)
        self.gid = IBA.GID(self.ctx.query_gid(1, 0), raw=True)

    def close(self):
        self.pool.close()
        self.ctx.close()


def path_to(rx, ctx):
    """A resolved path from ctx's port to the Receiver rx, as 7.2.1 makes one."""
    path = IBPath(ctx.end_port, dpqn=rx.qp.qp_num, qkey=IBA.IB_DEFAULT_QP1_QKEY, DGID=rx.gid)
    with ferry.get_gmp_mad(path.end_port, verbs=ctx) as umad:
        ferry.path.resolve_path(umad, path, reversible=True)
    return path


def test_spec_ud_single_destination_and_reply_path():
    end_port = ferry.get_end_port()
    rx = Receiver(end_port)
    ctx = ferry.get_verbs(end_port)
    try:
        # --- 7.2.1, as written (the destination is the receiver's QP rather than QP1) ---
        path = IBPath(end_port, dpqn=rx.qp.qp_num, qkey=IBA.IB_DEFAULT_QP1_QKEY, DGID=rx.gid)
        with ferry.get_gmp_mad(path.end_port, verbs=ctx) as umad:
            ferry.path.resolve_path(umad, path, reversible=True)
        with ctx.pd() as pd:
            depth = 16
            cq = pd.cq(2 * depth)
            qp = pd.qp(ibv.IBV_QPT_UD, depth, cq, depth, cq)
            path.sqpn = qp.qp_num
            # Post receive work requests to qp here (a receive queue takes them from INIT on)
            qp.modify_to_init(path)
            rbuf = bytearray(ibv.GRH_BYTES + 256)
            rmr = pd.mr(rbuf, ibv.IBV_ACCESS_LOCAL_WRITE)
            qp.post_recv(ibv.recv_wr(wr_id=500, sg_list=rmr.sge()))
            qp.establish(path)

            msg = bytearray(b"Hello over UD")
            mr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
            qp.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND,
                                     send_flags=ibv.IBV_SEND_SIGNALED,
                                     ah=pd.ah(path),
                                     remote_qpn=path.dpqn,
                                     remote_qkey=path.qkey,
                                     wr_id=1, sg_list=mr.sge()))
            sent = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=WAIT))
            assert [(w.status, w.opcode) for w in sent] == [(ibv.IBV_WC_SUCCESS, ibv.IBV_WC_SEND)]

            # --- at the receiver: the GRH, then the message ---
            got = list(ferry.vtools.CQPoller(rx.cq).iterwc(count=1, timeout=WAIT))
            assert len(got) == 1
            wc = got[0]
            assert (wc.status, wc.opcode) == (ibv.IBV_WC_SUCCESS, ibv.IBV_WC_RECV)
            assert wc.wc_flags & ibv.IBV_WC_GRH
            assert wc.byte_len == ibv.GRH_BYTES + len(msg)
            assert wc.src_qp == qp.qp_num and wc.qp_num == rx.qp.qp_num
            buf_idx = wc.wr_id & rx.pool.BUF_ID_MASK
            assert wc.wr_id & rx.pool.RECV_FLAG
            assert bytes(rx.pool.copy_from(buf_idx, ibv.GRH_BYTES, len(msg))) == bytes(msg)

            # --- 7.2.2: the reply path from the WC and the GRH ---
            qp_pkey, qp_qkey = IBA.DEFAULT_PKEY, IBA.IB_DEFAULT_QP1_QKEY
            rpath = ibv.WCPath(rx.ctx.end_port, wc, rx.pool.mr.buf, buf_idx * rx.pool.size,
                               pkey=qp_pkey, qkey=qp_qkey)
            assert rpath.SGID == path.SGID and rpath.DGID == rx.gid  # as received
            assert rpath.sqpn == qp.qp_num
            rpath.reverse()
            assert rpath.DGID == path.SGID and rpath.dpqn == qp.qp_num and rpath.hop_limit == 255
            ah = rx.pd.ah(rpath)
            reply = rx.pool.pop()
            rx.pool.copy_to(b"reply!", reply)
            wr = ibv.send_wr(opcode=ibv.IBV_WR_SEND, ah=ah, remote_qpn=rpath.dpqn, remote_qkey=rpath.qkey,
                             wr_id=reply, send_flags=ibv.IBV_SEND_SIGNALED, sg_list=rx.pool.make_sge(reply, 6))
            rx.qp.post_send(wr)
            back = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=WAIT))
            assert len(back) == 1 and back[0].wr_id == 500 and back[0].src_qp == rx.qp.qp_num
            assert bytes(rbuf[ibv.GRH_BYTES:ibv.GRH_BYTES + 6]) == b"reply!"
            assert bytes(rbuf[8:24]) == bytes(rx.gid)     # sender's GID in the GRH
            assert bytes(rbuf[24:40]) == bytes(path.SGID)  # receiver's GID
            # The pool got the send buffer back and re-posted the receive.
            free_before = rx.pool.free
            rx.pool.finish_wcs(rx.qp, list(ferry.vtools.CQPoller(rx.cq).iterwc(count=1, timeout=WAIT)) + [wc])
            assert rx.pool.free == free_before + 1
    finally:
        ctx.close()
        rx.close()


def test_wrong_qkey_is_dropped_and_ud_posting_errors():
    end_port = ferry.get_end_port()
    rx = Receiver(end_port, qkey=0x1234)
    ctx = ferry.get_verbs(end_port)
    try:
        pd = ctx.pd()
        cq = ctx.cq(16)
        qp = pd.qp(ibv.IBV_QPT_UD, 8, cq, 8, cq)
        with ferry.get_gmp_mad(end_port, verbs=ctx) as umad:
            path = ferry.path.resolve_path(umad, IBPath(end_port, DGID=rx.gid, dqpn=rx.qp.qp_num, qkey=0x1234))
        path.sqpn = qp.qp_num
        qp.establish(path)
        mr = pd.mr(bytearray(b"x" * 64), ibv.IBV_ACCESS_LOCAL_WRITE)
        good = ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_SEND, ah=pd.ah(path), remote_qpn=path.dqpn,
                           remote_qkey=path.qkey, sg_list=mr.sge(8))
        wrong_key = ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_SEND, ah=pd.ah(path), remote_qpn=path.dqpn,
                                remote_qkey=0x4321, sg_list=mr.sge(8))
        no_ah = ibv.send_wr(wr_id=3, opcode=ibv.IBV_WR_SEND, remote_qpn=path.dqpn, remote_qkey=path.qkey,
                            sg_list=mr.sge(8))
        with pytest.raises(ibv.WRError) as info:
            qp.post_send([wrong_key, good, no_ah])
        assert info.value.bad_index == 2
        # Only the datagram with the right Q_Key arrives.
        got = list(ferry.vtools.CQPoller(rx.cq).iterwc(count=2, timeout=0.5))
        assert [w.src_qp for w in got] == [qp.qp_num]
        # RDMA operations are not UD operations.
        rdma = ibv.send_wr(wr_id=4, opcode=ibv.IBV_WR_RDMA_WRITE, ah=pd.ah(path), sg_list=mr.sge(8))
        with pytest.raises(ibv.WRError) as info:
            qp.post_send(rdma)
        assert info.value.bad_index == 0
        # A closed AH is refused.
        ah = pd.ah(path)
        ah.close()
        stale = ibv.send_wr(wr_id=5, opcode=ibv.IBV_WR_SEND, ah=ah, remote_qpn=path.dqpn, remote_qkey=path.qkey)
        with pytest.raises(ibv.WRError):
            qp.post_send(stale)
        # The cache notices the closed AH and makes a new one.
        assert pd.ah(path) is not ah and not pd.ah(path).closed
    finally:
        ctx.close()
        rx.close()


def test_buffer_pool_methods():
    end_port = ferry.get_end_port()
    rx = Receiver(end_port)
    try:
        pool = rx.pool
        assert (pool.count, pool.size) == (32, 512)
        assert pool.free == 32 - 8
        idx = pool.pop()
        pool.copy_to("Hello message!", idx)
        assert pool.copy_from(idx)[:14] == bytearray(b"Hello message!")
        assert pool.copy_from(idx, 6, 7) == bytearray(b"message")
        pool.copy_to(b"ABCDEFGH", idx, offset=4, length=3)
        assert pool.copy_from(idx, 0, 8) == bytearray(b"HellABCe")
        assert pool.copy_from(idx | pool.RECV_FLAG, 0, 4) == bytearray(b"Hell")  # a wr_id works too
        sge = pool.make_sge(idx, 100)
        assert sge.length == 100 and sge.addr == pool.mr.addr + idx * pool.size
        wr = pool.make_send_wr(idx, 14)
        assert (wr.opcode, wr.wr_id, wr.ah) == (ibv.IBV_WR_SEND, idx, None)
        assert wr.send_flags & ibv.IBV_SEND_SIGNALED
        with pytest.raises(ValueError):
            pool.make_sge(idx, 513)
        # A completion without a buffer (NO_WR_ID) is accepted and returns nothing.
        free = pool.free
        pool.finish_wcs(rx.qp, ibv.wc(wr_id=pool.NO_WR_ID, opcode=ibv.IBV_WC_SEND))
        assert pool.free == free
        pool.finish_wcs(rx.qp, ibv.wc(wr_id=idx, opcode=ibv.IBV_WC_SEND))
        assert pool.free == free + 1
        # An error completion raises WCError, with the buffer recovered.
        idx2 = pool.pop()
        with pytest.raises(ibv.WCError) as info:
            pool.finish_wcs(rx.qp, [ibv.wc(wr_id=idx2, status=ibv.IBV_WC_LOC_LEN_ERR, opcode=ibv.IBV_WC_SEND,
                                           qp_num=rx.qp.qp_num)])
        assert info.value.qp is rx.qp and info.value.is_rq is False
        assert pool.free == free + 1
        while pool.free:
            pool.pop()
        with pytest.raises(IndexError):
            pool.pop()
    finally:
        rx.close()


def test_a_send_holds_its_slot_until_its_completion_is_polled():
    """A UD QP of depth 16 takes 16 signaled sends; one post_send of 16,384 fails with WRError at
    index 16 (ENOMEM), the 16 before it posted; polling their completions frees the slots."""
    end_port = ferry.get_end_port()
    rx = Receiver(end_port)
    ctx = ferry.get_verbs(end_port)
    try:
        path = path_to(rx, ctx)
        with ctx.pd() as pd:
            cq = pd.cq(64)
            qp = pd.qp(ibv.IBV_QPT_UD, 16, cq, 16, cq)
            depth = qp.query(ibv.IBV_QP_CAP)[1].cap.max_send_wr
            path.sqpn = qp.qp_num
            qp.establish(path)
            msg = bytearray(b"x" * 64)
            mr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
            ah = pd.ah(path)
            wrs = [ibv.send_wr(opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED, ah=ah,
                               remote_qpn=path.dpqn, remote_qkey=path.qkey, wr_id=i, sg_list=mr.sge())
                   for i in range(16384)]
            with pytest.raises(ibv.WRError) as info:
                qp.post_send(wrs)
            assert info.value.bad_index == depth
            assert info.value.errno == 12 and isinstance(info.value, ferry.ResourceExhausted)
            done = list(ferry.vtools.CQPoller(cq).iterwc(count=depth, timeout=WAIT))
            assert [w.wr_id for w in done] == list(range(depth))
            qp.post_send(wrs[:depth])  # the polled completions gave the slots back
            assert len(list(ferry.vtools.CQPoller(cq).iterwc(count=depth, timeout=WAIT))) == depth
    finally:
        ctx.close()
        rx.close()


_MCAST_MEMBER = r"""
import sys
import ferry, ferry.IBA as IBA, ferry.verbs as ibv, ferry.vtools
from ferry.path import IBPath
group = IBA.GID(sys.argv[1])
end_port = ferry.get_end_port()
with ferry.get_verbs(end_port) as ctx:
    pd = ctx.pd()
    cq = ctx.cq(4)
    qp = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
    qp.establish(IBPath(end_port, qkey=0x1234, sqpn=qp.qp_num))
    buf = bytearray(ibv.GRH_BYTES + 64)
    mr = pd.mr(buf, ibv.IBV_ACCESS_LOCAL_WRITE)
    qp.post_recv(ibv.recv_wr(wr_id=1, sg_list=mr.sge()))
    qp.attach_mcast(IBPath(end_port, DGID=group))
    print("ready", flush=True)
    wcs = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=10))
    assert wcs and wcs[0].status == ibv.IBV_WC_SUCCESS, wcs
    print(bytes(buf[ibv.GRH_BYTES:wcs[0].byte_len]).decode(), flush=True)
    qp.detach_mcast(IBPath(end_port, DGID=group))
"""


def test_multicast_reaches_every_attached_qp_across_processes():
    """attach_mcast as the verbs document has it: two other processes attach a UD QP each to a
    group; one send to the group (destination QP 0xFFFFFF) reaches both."""
    import os
    import subprocess
    import sys
    group = "ff0e::4652:%x" % os.getpid()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    members = [subprocess.Popen([sys.executable, "-c", _MCAST_MEMBER, group], stdout=subprocess.PIPE, text=True,
                                env=env) for _ in range(2)]
    try:
        for m in members:
            assert m.stdout.readline().strip() == "ready"
        end_port = ferry.get_end_port()
        with ferry.get_verbs(end_port) as ctx:
            pd = ctx.pd()
            cq = ctx.cq(4)
            qp = pd.qp(ibv.IBV_QPT_UD, 4, cq, 4, cq)
            qp.establish(IBPath(end_port, qkey=0x1234, sqpn=qp.qp_num))
            msg = bytearray(b"to every member of the group")
            mr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
            path = IBPath(end_port, DGID=IBA.GID(group), has_grh=True, dqpn=0xFFFFFF, qkey=0x1234)
            qp.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED, ah=pd.ah(path),
                                     remote_qpn=0xFFFFFF, remote_qkey=0x1234, wr_id=1, sg_list=mr.sge()))
            assert len(list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=WAIT))) == 1
            with pytest.raises(ferry.InvalidArgument):
                qp.attach_mcast(IBPath(end_port, DGID=end_port.default_gid))  # not a multicast GID
        for m in members:
            out, _ = m.communicate(timeout=20)
            assert out.strip() == msg.decode()
            assert m.returncode == 0
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait()
