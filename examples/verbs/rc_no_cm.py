"""Two processes set up an RC queue pair pair without a CM, exchanging paths over a side channel,
as in section 7.2.3 of the verbs specification; then they move data over it.

    python examples/verbs/rc_no_cm.py

Side A (this process) and side B (a child process) follow the specification's steps in its
order. The paths travel as ferry's JSON encoding (``path.to_json()`` / ``IBPath.from_json``)
where the specification pickles them: unpickling what a peer sends is unsafe
(docs/python-verbs.md). After the synchronised move to RTS, side A RDMA-writes 1 MiB into side B's
memory and sends a message from a BufferPool (7.2.6); side B waits on its completion channel
(7.2.5), raises WCError for a failed completion (7.2.4), checks every byte and reports back.
"""

import json
import multiprocessing
import select
import sys

import ferry
import ferry.path
import ferry.verbs as ibv
import ferry.vtools

WAIT = 10.0  # seconds; every wait is bounded so that a failure ends both processes
NBYTES = 1 << 20
DEPTH = 64
MESSAGE = "Hello message!"


def pattern():
    return bytes(range(256)) * (NBYTES // 256)


class SideChannel:
    """The side channel of the specification: a pipe between the two processes."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.conn.send_bytes(data if isinstance(data, bytes) else str(data).encode())

    def recv(self):
        if not self.conn.poll(WAIT):
            raise TimeoutError("nothing from the other side within %.0f s" % WAIT)
        return self.conn.recv_bytes()


def side_a(channel):
    send_to_side_b, recv_from_side_b = channel.send, channel.recv
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()
        cq = ctx.cq(2 * DEPTH, ctx.comp_channel())
        src = bytearray(pattern())
        src_mr = pd.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
        pool = ferry.vtools.BufferPool(pd, count=100, size=1024)

        qp = pd.qp(ibv.IBV_QPT_RC, DEPTH, cq, DEPTH, cq)
        path = ferry.path.IBPath(end_port, SGID=end_port.default_gid)
        ferry.path.fill_path(qp, path)
        path.reverse(for_reply=False)
        send_to_side_b(path.to_json())
        path = ferry.path.IBPath.from_json(recv_from_side_b())
        path.reverse(for_reply=False)
        path.end_port = end_port

        qp.establish(path, ibv.IBV_ACCESS_REMOTE_WRITE)

        # Synchronize transition to RTS
        send_to_side_b(True)
        recv_from_side_b()

        # Side B's region, then an RDMA WRITE into it and a SEND that follows it (RC keeps order).
        region = json.loads(recv_from_side_b())
        qp.post_send(ibv.send_wr(wr_id=ferry.vtools.BufferPool.NO_WR_ID, opcode=ibv.IBV_WR_RDMA_WRITE,
                                 send_flags=ibv.IBV_SEND_SIGNALED, sg_list=src_mr.sge(),
                                 remote_addr=region["addr"], rkey=region["rkey"]))
        buf_idx = pool.pop()
        pool.copy_to(MESSAGE, buf_idx)
        qp.post_send(pool.make_send_wr(buf_idx, len(MESSAGE)))  # connected QP: no path in the wr

        for wc in ferry.vtools.CQPoller(cq).iterwc(count=2, timeout=WAIT):
            if wc.status != ibv.IBV_WC_SUCCESS:
                raise ibv.WCError(wc, cq)
            pool.finish_wcs(qp, wc)
        report = json.loads(recv_from_side_b())
        pool.close()
    return report


def side_b(conn):
    channel = SideChannel(conn)
    send_to_side_a, recv_from_side_a = channel.send, channel.recv
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()
        cc = ctx.comp_channel()
        poll = select.poll()
        cc.register_poll(poll)
        cq = ctx.cq(2 * DEPTH, cc)
        dst = bytearray(NBYTES)
        dst_mr = pd.mr(dst, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        pool = ferry.vtools.BufferPool(pd, count=100, size=1024)

        qp = pd.qp(ibv.IBV_QPT_RC, DEPTH, cq, DEPTH, cq)
        path = ferry.path.IBPath.from_json(recv_from_side_a())
        path.end_port = end_port
        ferry.path.fill_path(qp, path)
        with ferry.get_gmp_mad(path.end_port) as umad:
            ferry.path.resolve_path(umad, path)
        send_to_side_a(path.to_json())

        qp.establish(path, ibv.IBV_ACCESS_REMOTE_WRITE)
        pool.post_recvs(qp, 50)

        # Synchronize transition to RTS
        recv_from_side_a()
        send_to_side_a(True)

        send_to_side_a(json.dumps({"addr": dst_mr.addr, "rkey": dst_mr.rkey, "length": dst_mr.length}))

        def get_wcs():
            cq.req_notify()
            # A completion that came before the CQ was armed raises no event: look once first.
            wcs = cq.poll()
            if wcs:
                return wcs
            while True:
                ret = poll.poll(WAIT * 1000)
                if not ret:
                    raise TimeoutError("no completion within %.0f s" % WAIT)
                for I in ret:
                    if cc.check_poll(I) is not None:
                        wcs = cq.poll()
                        if wcs is not None:
                            return wcs

        wcs = get_wcs()
        for wc in wcs:
            if wc.status != ibv.IBV_WC_SUCCESS:
                raise ibv.WCError(wc, cq)
        message = bytes(pool.copy_from(wcs[0].wr_id, 0, wcs[0].byte_len)).decode()
        pool.finish_wcs(qp, wcs)
        send_to_side_a(json.dumps({"message": message, "bytes_match": bytes(dst) == pattern(),
                                   "state": qp.state}))
        pool.close()


def main():
    mp = multiprocessing.get_context("spawn")
    here, there = mp.Pipe()
    peer = mp.Process(target=side_b, args=(there,))
    peer.start()
    there.close()  # side B's end lives in side B: its exit ends our reads
    try:
        report = side_a(SideChannel(here))
    finally:
        peer.join(WAIT)
        if peer.is_alive():
            peer.terminate()
            peer.join()
    ok = (report["message"] == MESSAGE and report["bytes_match"] and report["state"] == ibv.IBV_QPS_RTS
          and peer.exitcode == 0)
    print("RC without a CM: %d bytes written and a %d-byte message sent to the other process, %s"
          % (NBYTES, len(MESSAGE), "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
