"""Completions through a completion channel with CQPoller, as in section 7.2.5 of the verbs
specification, on ferry.verbs.

    python examples/verbs/cq_poller.py

Two RC queue pairs in this process, each on its own verbs context, are connected with the no-CM
steps of 7.2.3 (both sides here). The receiving side's CQ has a completion channel; the sending
side posts eight messages, and the specification's loop prints every completion
``CQPoller.iterwc(timeout=1)`` yields while it sleeps on the channel. The program then checks that
each message landed in its receive buffer.
"""

import sys

import ferry
import ferry.path
import ferry.verbs as ibv
import ferry.vtools

COUNT = 8
SIZE = 64


def connect(end_port, qp_a, ctx_b, qp_b):
    """7.2.3 with both sides in this process (paths as ferry's JSON text)."""
    path = ferry.path.IBPath(end_port, SGID=end_port.default_gid)
    ferry.path.fill_path(qp_a, path)
    path.reverse(for_reply=False)
    path_b = ferry.path.IBPath.from_json(path.to_json(), end_port)
    ferry.path.fill_path(qp_b, path_b)
    with ferry.get_gmp_mad(path_b.end_port, verbs=ctx_b) as umad:
        ferry.path.resolve_path(umad, path_b)
    path_a = ferry.path.IBPath.from_json(path_b.to_json(), end_port)
    path_a.reverse(for_reply=False)
    qp_a.establish(path_a, ibv.IBV_ACCESS_REMOTE_WRITE)
    qp_b.establish(path_b, ibv.IBV_ACCESS_REMOTE_WRITE)


def main():
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx, ferry.get_verbs(end_port) as sender_ctx:
        depth = COUNT

        # --- 7.2.5 ---
        cc = ctx.comp_channel()
        cq = ctx.cq(2 * depth, cc)
        poller = ferry.vtools.CQPoller(cq)

        pd = ctx.pd()
        qp = pd.qp(ibv.IBV_QPT_RC, depth, cq, depth, cq)
        sender_pd = sender_ctx.pd()
        sender_cq = sender_ctx.cq(2 * depth)
        sender_qp = sender_pd.qp(ibv.IBV_QPT_RC, depth, sender_cq, depth, sender_cq)
        connect(end_port, qp, sender_ctx, sender_qp)

        inbox = bytearray(COUNT * SIZE)
        inbox_mr = pd.mr(inbox, ibv.IBV_ACCESS_LOCAL_WRITE)
        qp.post_recv([ibv.recv_wr(wr_id=i, sg_list=inbox_mr.sge(length=SIZE, off=i * SIZE)) for i in range(COUNT)])

        messages = [("message %d of %d" % (i + 1, COUNT)).encode() for i in range(COUNT)]
        outbox = bytearray(b"".join(m.ljust(SIZE, b"\0") for m in messages))
        outbox_mr = sender_pd.mr(outbox, ibv.IBV_ACCESS_LOCAL_WRITE)
        sender_qp.post_send([ibv.send_wr(wr_id=100 + i, opcode=ibv.IBV_WR_SEND,
                                         sg_list=outbox_mr.sge(length=len(m), off=i * SIZE))
                             for i, m in enumerate(messages)])

        wcs = []
        for wc in poller.iterwc(timeout=1):
            print(wc)
            wcs.append(wc)

        ok = (len(wcs) == COUNT and poller.timedout
              and all(wc.status == ibv.IBV_WC_SUCCESS and wc.opcode == ibv.IBV_WC_RECV for wc in wcs)
              and all(bytes(inbox[wc.wr_id * SIZE:wc.wr_id * SIZE + wc.byte_len]) == messages[wc.wr_id]
                      for wc in wcs)
              and sorted(wc.wr_id for wc in wcs) == list(range(COUNT)))
    print("CQPoller: %d completions from the completion channel within 1 s, %s"
          % (len(wcs), "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
