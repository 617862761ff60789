"""The specification's examples across two processes: the no-CM RC set-up of 7.2.3 (path sent as
ferry's JSON encoding, and pickled as the document shows), and UD to several destinations with the
reply path of 7.2.2. The other process is tests/python/verbs_peer.py, talking over a pipe."""

import contextlib
import json
import os
import pickle
import subprocess
import sys

import pytest

import ferry
import ferry.IBA as IBA
import ferry.path
import ferry.verbs as ibv
import ferry.vtools
from ferry.path import IBPath

from verbs_peer import WAIT_SECONDS, recv_msg, send_msg

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verbs_peer.py")


@contextlib.contextmanager
def peer_process(*args):
    proc = subprocess.Popen([sys.executable, PEER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def poll_one(cq):
    wcs = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=WAIT_SECONDS))
    assert wcs, "no completion within %s s" % WAIT_SECONDS
    wc = wcs[0]
    if wc.status != ibv.IBV_WC_SUCCESS:
        raise ibv.WCError(wc, cq)
    return wc


@pytest.mark.parametrize("encoding", ["json", "pickle"])
def test_spec_no_cm_rc_setup_between_processes(encoding):
    def send_to_side_b(obj):
        send_msg(proc.stdin, obj if isinstance(obj, bytes) else str(obj))

    def recv_from_side_b():
        return recv_msg(proc.stdout)

    def encode(path):
        return path.to_json().encode() if encoding == "json" else pickle.dumps(path)

    def decode(data):
        if encoding == "json":
            return IBPath.from_json(data)
        # The document's example pickles the path; the data comes from this test's own child.
        return pickle.loads(data)

    end_port = ferry.get_end_port()
    with peer_process("rc-" + encoding) as proc, ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()
        cq = ctx.cq(64, ctx.comp_channel())
        mem = bytearray(64)
        mr = pd.mr(mem, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)

        # --- side A, as in 7.2.3 ---
        qp = pd.qp(ibv.IBV_QPT_RC, 16, cq, 16, cq)
        path = ferry.path.IBPath(end_port, SGID=end_port.default_gid)
        ferry.path.fill_path(qp, path)
        path.reverse(for_reply=False)
        send_to_side_b(encode(path))
        path = decode(recv_from_side_b())
        path.reverse(for_reply=False)
        path.end_port = end_port

        qp.establish(path, ibv.IBV_ACCESS_REMOTE_WRITE)

        # Synchronize transition to RTS
        send_to_side_b(True)
        recv_from_side_b()

        assert qp.state == ibv.IBV_QPS_RTS
        attr, _ = qp.query()
        assert attr.dest_qp_num == path.dqpn and attr.sq_psn == path.sqpsn and attr.rq_psn == path.dqpsn

        # --- move data both ways ---
        remote = json.loads(recv_from_side_b())
        payload = bytearray(b"written by side A over RC")
        smr = pd.mr(payload, ibv.IBV_ACCESS_LOCAL_WRITE)
        send_to_side_b(json.dumps({"addr": mr.addr, "rkey": mr.rkey, "len": len(payload)}))
        qp.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                                 sg_list=smr.sge(), remote_addr=remote["addr"], rkey=remote["rkey"]))
        assert poll_one(cq).wr_id == 1
        note = bytearray(b"done")
        nmr = pd.mr(note, ibv.IBV_ACCESS_LOCAL_WRITE)
        qp.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_SEND, send_flags=ibv.IBV_SEND_SIGNALED,
                                 sg_list=nmr.sge()))
        assert poll_one(cq).wr_id == 2
        report = json.loads(recv_from_side_b())
        assert report["message"] == "done"
        assert bytes.fromhex(report["written"]) == bytes(payload)
        assert report["state"] == ibv.IBV_QPS_RTS
        # Side B wrote the reversed bytes into our memory (the QP was set up with REMOTE_WRITE).
        assert bytes(mem[:len(payload)]) == bytes(payload)[::-1]
        send_to_side_b(b"bye")
    assert proc.returncode == 0


def test_spec_ud_multiple_destinations_and_reply_paths():
    count = 2
    end_port = ferry.get_end_port()
    with peer_process("ud-echo", str(count)) as proc, ferry.get_verbs(end_port) as ctx:
        peers = json.loads(recv_msg(proc.stdout))
        destinations = [IBA.GID(p["gid"]) for p in peers]
        qpns = {IBA.GID(p["gid"]): p["qpn"] for p in peers}

        # --- 7.2.1, several destinations sharing P_Key and Q_Key ---
        with ferry.get_gmp_mad(end_port) as umad:
            paths = [ferry.path.resolve_path(umad, IBPath(end_port, DGID=I,
                                                          qkey=IBA.IB_DEFAULT_QP1_QKEY),
                                             reversible=True,
                                             properties={'PKey': IBA.DEFAULT_PKEY})
                     for I in destinations]
        for p in paths:
            p.dqpn = qpns[p.DGID]
        assert len({str(p.DGID) for p in paths}) == count

        with ctx.pd() as pd:
            depth = 64
            cq = pd.cq(2 * depth, ctx.comp_channel())
            qp = pd.qp(ibv.IBV_QPT_UD, depth, cq, depth, cq)
            pool = ferry.vtools.BufferPool(pd, count=100, size=1024)
            paths[-1].sqpn = qp.qp_num
            qp.modify_to_init(paths[-1])
            pool.post_recvs(qp, 50)
            qp.establish(paths[-1])

            for i, path in enumerate(paths):
                buf_idx = pool.pop()
                pool.copy_to("Hello message %d!" % i, buf_idx)
                qp.post_send(pool.make_send_wr(buf_idx, len("Hello message %d!" % i), path))

            replies = {}
            poller = ferry.vtools.CQPoller(cq)
            for wc in poller.iterwc(timeout=WAIT_SECONDS):
                if wc.status != ibv.IBV_WC_SUCCESS:
                    raise ibv.WCError(wc, cq)
                if wc.opcode == ibv.IBV_WC_RECV:
                    assert wc.wc_flags & ibv.IBV_WC_GRH
                    text = bytes(pool.copy_from(wc.wr_id, ibv.GRH_BYTES, wc.byte_len - ibv.GRH_BYTES))
                    rpath = ibv.WCPath(end_port, wc, pool.mr.buf, (wc.wr_id & pool.BUF_ID_MASK) * pool.size)
                    replies[rpath.SGID] = (wc.src_qp, text)
                pool.finish_wcs(qp, wc)
                if len(replies) == count:
                    break
            assert not poller.timedout
            assert set(replies) == set(destinations)
            for i, path in enumerate(paths):
                src_qp, text = replies[path.DGID]
                assert src_qp == path.dqpn
                assert text == b"echo:%d:Hello message %d!" % (path.dqpn, i)
            pool.close()
        send_msg(proc.stdin, b"done")
    assert proc.returncode == 0
