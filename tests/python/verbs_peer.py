"""The other process of the two-process verbs tests, and the pipe framing both sides use.

Run as ``python verbs_peer.py MODE``; it talks to the test over stdin/stdout with length-prefixed
messages (4-byte big-endian length, then the bytes). Modes:

- ``rc-json`` / ``rc-pickle``: side B of the no-CM RC set-up of the verbs specification (7.2.3),
  with the path sent as ferry's JSON encoding or pickled as the specification shows. Then it checks
  what side A wrote into its memory and writes an answer back into side A's memory.
- ``ud-echo N``: N UD queue pairs, each on its own verbs context (so each has its own GID); it
  reports their GIDs and QP numbers, then answers every datagram through the reply path built
  from the work completion (``WCPath`` ... ``reverse()``), as in 7.2.2.

Every wait has a timeout, so a broken test never leaves this process behind.
"""

import json
import os
import pickle
import select
import struct
import sys

WAIT_SECONDS = 10.0


def send_msg(stream, data):
    if isinstance(data, str):
        data = data.encode()
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _read_exact(fd, n, timeout):
    chunks = []
    while n:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError("no message from the peer within %.1f s" % timeout)
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the peer closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_msg(stream, timeout=WAIT_SECONDS):
    fd = stream.fileno()
    (length,) = struct.unpack(">I", _read_exact(fd, 4, timeout))
    if length > 1 << 20:
        raise ValueError("message too long")
    return _read_exact(fd, length, timeout)


def _poll_one(cq, timeout=WAIT_SECONDS):
    import ferry.vtools
    wcs = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=timeout))
    if not wcs:
        raise TimeoutError("no completion within %.1f s" % timeout)
    return wcs[0]


def rc_side_b(encoding, inp, out):
    import ferry
    import ferry.path
    import ferry.verbs as ibv

    def decode(data):
        if encoding == "json":
            return ferry.path.IBPath.from_json(data)
        # The specification's example pickles paths; the data comes from this test's own parent.
        return pickle.loads(data)

    def encode(path):
        return path.to_json() if encoding == "json" else pickle.dumps(path)

    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()
        cq = ctx.cq(64, ctx.comp_channel())
        qp = pd.qp(ibv.IBV_QPT_RC, 16, cq, 16, cq)
        mem = bytearray(64)
        mr = pd.mr(mem, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        scratch = bytearray(64)
        smr = pd.mr(scratch, ibv.IBV_ACCESS_LOCAL_WRITE)
        qp_post_recv_buf = bytearray(64)
        rmr = pd.mr(qp_post_recv_buf, ibv.IBV_ACCESS_LOCAL_WRITE)

        # --- the specification's side B ---
        path = decode(recv_msg(inp))
        path.end_port = end_port
        ferry.path.fill_path(qp, path)
        with ferry.get_gmp_mad(path.end_port) as umad:
            ferry.path.resolve_path(umad, path)
        send_msg(out, encode(path))

        qp.establish(path, ibv.IBV_ACCESS_REMOTE_WRITE)
        qp.post_recv(ibv.recv_wr(wr_id=1, sg_list=rmr.sge()))

        # Synchronize transition to RTS
        recv_msg(inp)
        send_msg(out, b"True")

        # --- the transfer ---
        send_msg(out, json.dumps({"addr": mr.addr, "rkey": mr.rkey, "len": mr.length}))
        peer = json.loads(recv_msg(inp))
        wc = _poll_one(cq)  # side A's SEND, after its RDMA WRITE into `mem`
        if wc.status != ibv.IBV_WC_SUCCESS:
            raise ibv.WCError(wc, cq)
        message = bytes(qp_post_recv_buf[:wc.byte_len])
        written = bytes(mem[:peer["len"]])
        answer = written[::-1]
        scratch[:len(answer)] = answer
        qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                                 sg_list=smr.sge(len(answer)), remote_addr=peer["addr"], rkey=peer["rkey"]))
        wc = _poll_one(cq)
        if wc.status != ibv.IBV_WC_SUCCESS:
            raise ibv.WCError(wc, cq)
        send_msg(out, json.dumps({"message": message.decode(), "written": written.hex(),
                                  "state": qp.state}))
        recv_msg(inp)


def ud_echo(count, inp, out):
    import ferry
    import ferry.IBA as IBA
    import ferry.path
    import ferry.verbs as ibv
    import ferry.vtools

    end_port = ferry.get_end_port()
    sides = []
    for _ in range(count):
        ctx = ferry.get_verbs(end_port)
        pd = ctx.pd()
        cq = ctx.cq(64, ctx.comp_channel())
        qp = pd.qp(ibv.IBV_QPT_UD, 16, cq, 16, cq)
        path = ferry.path.IBPath(end_port, qkey=IBA.IB_DEFAULT_QP1_QKEY)
        path.sqpn = qp.qp_num
        pool = ferry.vtools.BufferPool(pd, 32, 256)
        qp.establish(path)
        pool.post_recvs(qp, 8)
        sides.append((ctx, pd, cq, qp, pool))
    send_msg(out, json.dumps([{"gid": str(ferry.IBA.GID(s[0].query_gid(1, 0), raw=True)), "qpn": s[3].qp_num}
                              for s in sides]))
    for ctx, pd, cq, qp, pool in sides:
        poller = ferry.vtools.CQPoller(cq)
        answered = False
        for wc in poller.iterwc(timeout=WAIT_SECONDS):
            if wc.opcode & ibv.IBV_WC_RECV:
                buf_idx = wc.wr_id & pool.BUF_ID_MASK
                off = buf_idx * pool.size
                # The UD response path (7.2.2): from the WC and the GRH at the head of the buffer.
                path = ibv.WCPath(end_port, wc, pool.mr.buf, off, pkey=IBA.DEFAULT_PKEY,
                                  qkey=IBA.IB_DEFAULT_QP1_QKEY)
                path.reverse()
                payload = bytes(pool.copy_from(buf_idx, ibv.GRH_BYTES, wc.byte_len - ibv.GRH_BYTES))
                reply = pool.pop()
                text = b"echo:%d:" % qp.qp_num + payload
                pool.copy_to(text, reply)
                qp.post_send(pool.make_send_wr(reply, len(text), path))
                pool.finish_wcs(qp, wc)
            else:
                pool.finish_wcs(qp, wc)
                answered = True
                break
        if not answered:
            raise TimeoutError("no datagram for QP %d" % qp.qp_num)
    recv_msg(inp)
    for ctx, pd, cq, qp, pool in sides:
        pool.close()
        ctx.close()


def main(argv):
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    mode = argv[1]
    if mode == "rc-json":
        rc_side_b("json", inp, out)
    elif mode == "rc-pickle":
        rc_side_b("pickle", inp, out)
    elif mode == "ud-echo":
        ud_echo(int(argv[2]), inp, out)
    else:
        raise SystemExit("unknown mode %r" % mode)


if __name__ == "__main__":
    main(sys.argv)
