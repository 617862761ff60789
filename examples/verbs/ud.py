"""UD datagrams between two processes: the single-destination set-up of section 7.2.1 of the verbs
specification and the reply path of 7.2.2, on ferry.verbs.

    python examples/verbs/ud.py

Side B (a child process) answers every datagram through the path built from the work completion
and the GRH at the head of the receive buffer (``WCPath`` ... ``reverse()``). Side A (this
process) resolves a path to side B, sends a message and checks the answer byte for byte.

Both sides set their QP up in the specification's order: receives are posted before
``establish()``, while the QP is still in RESET.
"""

import json
import multiprocessing
import sys

import ferry
import ferry.IBA as IBA
import ferry.path
import ferry.verbs as ibv
import ferry.vtools
from ferry.path import IBPath

WAIT = 10.0  # seconds; every wait is bounded so that a failure ends both processes
MESSAGE = b"Hello over UD"


class SideChannel:
    """A pipe between the two processes."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, data):
        self.conn.send_bytes(data.encode() if isinstance(data, str) else data)

    def recv(self):
        if not self.conn.poll(WAIT):
            raise TimeoutError("nothing from the other side within %.0f s" % WAIT)
        return self.conn.recv_bytes()


def side_b(conn):
    """Answers one datagram with ``echo:`` and its bytes, through the reply path (7.2.2)."""
    channel = SideChannel(conn)
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        qp_pkey, qp_qkey = IBA.DEFAULT_PKEY, IBA.IB_DEFAULT_QP1_QKEY
        path = IBPath(end_port, qkey=qp_qkey)
        with ctx.pd() as pd:
            depth = 16
            cq = ctx.cq(2 * depth, ctx.comp_channel())
            qp = pd.qp(ibv.IBV_QPT_UD, depth, cq, depth, cq)
            path.sqpn = qp.qp_num
            pool = ferry.vtools.BufferPool(pd, count=2 * depth, size=1024)
            # Post receive work requests to qp here
            pool.post_recvs(qp, depth)
            qp.establish(path)
            channel.send(json.dumps({"gid": str(IBA.GID(ctx.query_gid(1, 0), raw=True)), "qpn": qp.qp_num}))

            answered = False
            for wc in ferry.vtools.CQPoller(cq).iterwc(timeout=WAIT):
                if wc.status != ibv.IBV_WC_SUCCESS:
                    raise ibv.WCError(wc, cq)
                if wc.opcode == ibv.IBV_WC_RECV:
                    buf_idx = wc.wr_id & pool.BUF_ID_MASK
                    buf, off = pool.mr.buf, buf_idx * pool.size
                    path = ibv.WCPath(end_port, wc,
                                      buf, off,
                                      pkey=qp_pkey,
                                      qkey=qp_qkey)
                    path.reverse()
                    ah = pd.ah(path)
                    payload = bytes(pool.copy_from(buf_idx, ibv.GRH_BYTES, wc.byte_len - ibv.GRH_BYTES))
                    reply = pool.pop()
                    pool.copy_to(b"echo:" + payload, reply)
                    wr = ibv.send_wr(opcode=ibv.IBV_WR_SEND,
                                     ah=ah,
                                     remote_qpn=path.dpqn,
                                     remote_qkey=path.qkey,
                                     wr_id=reply,
                                     send_flags=ibv.IBV_SEND_SIGNALED,
                                     sg_list=pool.make_sge(reply, len(payload) + 5))
                    qp.post_send(wr)
                    pool.finish_wcs(qp, wc)
                else:  # the reply went out
                    pool.finish_wcs(qp, wc)
                    answered = True
                    break
            if not answered:
                raise TimeoutError("no datagram within %.0f s" % WAIT)
            channel.recv()  # side A has its answer
            pool.close()


def side_a(channel):
    """Sends one datagram to side B (7.2.1, one destination) and returns the answer's bytes."""
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        peer = json.loads(channel.recv())
        # The specification sends to QP1 (dpqn=1); ferry's devices have none: send to side B's QP.
        path = IBPath(end_port, dpqn=peer["qpn"], qkey=IBA.IB_DEFAULT_QP1_QKEY, DGID=IBA.GID(peer["gid"]))
        with ferry.get_gmp_mad(path.end_port, verbs=ctx) as umad:
            ferry.path.resolve_path(umad, path, reversible=True)
        with ctx.pd() as pd:
            depth = 16
            cq = pd.cq(2 * depth)
            qp = pd.qp(ibv.IBV_QPT_UD, depth, cq, depth, cq)
            path.sqpn = qp.qp_num
            # Post receive work requests to qp here
            rbuf = bytearray(ibv.GRH_BYTES + 256)
            rmr = pd.mr(rbuf, ibv.IBV_ACCESS_LOCAL_WRITE)
            qp.post_recv(ibv.recv_wr(wr_id=1, sg_list=rmr.sge()))
            qp.establish(path)

            msg = bytearray(MESSAGE)
            mr = pd.mr(msg, ibv.IBV_ACCESS_LOCAL_WRITE)
            qp.post_send(ibv.send_wr(opcode=ibv.IBV_WR_SEND,
                                     send_flags=ibv.IBV_SEND_SIGNALED,
                                     ah=pd.ah(path),
                                     remote_qpn=path.dpqn,
                                     remote_qkey=path.qkey,
                                     wr_id=2,
                                     sg_list=mr.sge()))
            answer = None
            for wc in ferry.vtools.CQPoller(cq).iterwc(count=2, timeout=WAIT):
                if wc.status != ibv.IBV_WC_SUCCESS:
                    raise ibv.WCError(wc, cq)
                if wc.opcode == ibv.IBV_WC_RECV:
                    # The GRH: the sender's GID at bytes 8-23, ours at 24-39.
                    if bytes(rbuf[8:24]) != bytes(path.DGID) or bytes(rbuf[24:40]) != bytes(path.SGID):
                        raise RuntimeError("the GRH does not name the two sides")
                    answer = bytes(rbuf[ibv.GRH_BYTES:wc.byte_len])
            channel.send(b"done")
            return answer


def main():
    mp = multiprocessing.get_context("spawn")
    here, there = mp.Pipe()
    peer = mp.Process(target=side_b, args=(there,))
    peer.start()
    there.close()  # side B's end lives in side B: its exit ends our reads
    try:
        answer = side_a(SideChannel(here))
    finally:
        peer.join(WAIT)
        if peer.is_alive():
            peer.terminate()
            peer.join()
    ok = answer == b"echo:" + MESSAGE and peer.exitcode == 0
    print("UD: sent %r, the other process answered %r through the reply path, %s"
          % (MESSAGE.decode(), (answer or b"").decode(), "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
