"""ferry.path: IBPath attributes, reverse(), the AH cache, fill_path, resolve_path, and the safe
JSON encoding (with the pickle support the specification's example relies on)."""

import json
import pickle

import pytest

import ferry
import ferry.IBA as IBA
import ferry.path
import ferry.verbs as ibv
from ferry.path import IBPath


@pytest.fixture
def ctx():
    with ferry.get_verbs(ferry.get_end_port()) as c:
        yield c


def peer_gid(ctx_peer):
    return IBA.GID(ctx_peer.query_gid(1, 0), raw=True)


def test_attributes_and_defaults(ctx):
    end_port = ctx.end_port
    p = IBPath(end_port, dpqn=5, qkey=IBA.IB_DEFAULT_QP1_QKEY, DGID="::1:ffff:7f00:1", SL=2)
    assert p.dqpn == 5 and p.dpqn == 5
    p.dpqn = 6
    assert p.dqpn == 6
    assert isinstance(p.DGID, str)  # stored as given; converted where used
    for name in ("end_port", "pkey", "qkey", "MTU", "retries", "min_rnr_timer", "packet_life_time", "dack_resp_time",
                 "sack_resp_time", "dqpn", "sqpn", "dqpsn", "sqpsn", "drdatomic", "srdatomic", "has_grh", "DGID",
                 "SGID", "flow_label", "hop_limit", "traffic_class", "DLID", "SLID", "SL", "rate"):
        getattr(p, name)
    assert p.pkey == IBA.DEFAULT_PKEY and p.pkey_index == 0
    assert p.packet_life_time == end_port.subnet_timeout
    assert p.qp_timeout > 0
    with pytest.raises(TypeError):
        IBPath(end_port, no_such_attribute=1)
    assert IBPath("soft_lo").end_port == ferry.get_end_port("soft_lo")


def test_reverse():
    p = IBPath(None, SGID=IBA.GID("::1"), DGID=IBA.GID("::2"), SLID=1, DLID=2, sqpn=10, dqpn=20, sqpsn=100,
               dqpsn=200, srdatomic=3, drdatomic=4, sack_resp_time=5, dack_resp_time=6, has_grh=True, hop_limit=9)
    assert p.reverse(for_reply=False) is p
    assert (p.SGID, p.DGID, p.SLID, p.DLID) == (IBA.GID("::2"), IBA.GID("::1"), 2, 1)
    assert (p.sqpn, p.dqpn, p.sqpsn, p.dqpsn) == (20, 10, 200, 100)
    assert (p.srdatomic, p.drdatomic, p.sack_resp_time, p.dack_resp_time) == (4, 3, 6, 5)
    assert p.hop_limit == 9
    p.reverse()
    assert p.hop_limit == 255  # a reply path


def test_json_round_trip(ctx):
    end_port = ctx.end_port
    p = IBPath(end_port, SGID=end_port.default_gid, DGID=IBA.GID("::1234:ffff:7f00:1"), sqpn=0x123, dqpn=0xABCDEF,
               sqpsn=77, dqpsn=0xFFFFFF, qkey=IBA.IB_DEFAULT_QP1_QKEY, MTU=IBA.MTU_4096, retries=3, min_rnr_timer=5,
               packet_life_time=16, srdatomic=4, drdatomic=8, SL=1, has_grh=True, hop_limit=64, traffic_class=3,
               flow_label=0x12345, dack_resp_time=11, sack_resp_time=12, pkey=IBA.DEFAULT_PKEY)
    text = p.to_json()
    doc = json.loads(text)
    assert doc["ferry_path"] == 1 and doc["dqpn"] == 0xABCDEF
    q = IBPath.from_json(text, end_port)
    assert q.end_port is end_port
    for name in ("SGID", "DGID", "sqpn", "dqpn", "sqpsn", "dqpsn", "qkey", "MTU", "retries", "min_rnr_timer",
                 "packet_life_time", "srdatomic", "drdatomic", "SL", "has_grh", "hop_limit", "traffic_class",
                 "flow_label", "dack_resp_time", "sack_resp_time", "pkey"):
        assert getattr(q, name) == getattr(p, name), name
    assert IBPath.from_json(text.encode()).dqpn == 0xABCDEF
    assert IBPath.from_json(text).end_port is None


@pytest.mark.parametrize("text", [
    "", "null", "[]", "{}", "not json", '{"ferry_path": 2}', '{"ferry_path": "1"}',
    '{"ferry_path": 1, "dqpn": 16777216}', '{"ferry_path": 1, "dqpn": -1}', '{"ferry_path": 1, "dqpn": "5"}',
    '{"ferry_path": 1, "mtu": 9}', '{"ferry_path": 1, "retries": 8}', '{"ferry_path": 1, "dgid": "nope"}',
    '{"ferry_path": 1, "has_grh": 1}', '{"ferry_path": 1, "pkey": 65536}', '{"ferry_path": 1, "pkey": true}',
    '{"ferry_path": 1, "dack_resp_time": 32}', '{"ferry_path": 1, "dqpn": 1e99}',
    "cos\nsystem\n(S'echo hostile'\ntR.",
    '{"ferry_path": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}",
    b"\xff\xfe{}",
])
def test_from_json_refuses_malformed_or_hostile_text(text):
    with pytest.raises(ferry.InvalidArgument):
        IBPath.from_json(text)


def test_to_json_refuses_out_of_range_fields(ctx):
    with pytest.raises(ferry.InvalidArgument):
        IBPath(ctx.end_port, dqpn=1 << 24).to_json()
    with pytest.raises(ferry.InvalidArgument):
        IBPath(ctx.end_port, SL="high").to_json()
    with pytest.raises(ferry.InvalidArgument):
        IBPath(ctx.end_port, sack_resp_time=40).to_json()


def test_pickle_keeps_fields_and_drops_end_port_and_caches(ctx):
    # The specification's no-CM example pickles paths (between processes of one's own).
    end_port = ctx.end_port
    pd = ctx.pd()
    p = IBPath(end_port, DGID=end_port.default_gid, SGID=end_port.default_gid, has_grh=True, dqpn=99, qkey=5,
               hop_limit=3)
    pd.ah(p)
    assert any(k.startswith("_cached") for k in p.__dict__)
    q = pickle.loads(pickle.dumps(p))
    assert q.end_port is None
    assert (q.DGID, q.dqpn, q.qkey, q.hop_limit, q.has_grh) == (p.DGID, 99, 5, 3, True)
    assert not any(k.startswith("_") for k in q.__dict__)
    c = p.copy(dqpn=100)
    assert c.dqpn == 100 and c.end_port is end_port and c.DGID == p.DGID


def test_ah_cache_on_path(ctx):
    end_port = ctx.end_port
    pd = ctx.pd()
    other = ferry.get_verbs(end_port)
    try:
        path = IBPath(end_port, DGID=peer_gid(other), has_grh=True, hop_limit=64)
        ah = pd.ah(path)
        assert isinstance(ah, ibv.AH)
        assert pd.ah(path) is ah  # cached
        pd2 = ctx.pd()
        assert pd2.ah(path) is not ah  # one AH per PD
        path.drop_cache()
        assert pd.ah(path) is not ah
        ah.close()
        # An ah_attr works too.
        attr = ibv.ah_attr(is_global=1, port_num=1)
        attr.grh.dgid = peer_gid(other)
        assert isinstance(pd.ah(attr), ibv.AH)
        with pytest.raises(TypeError):
            pd.ah("not an attr")
    finally:
        other.close()


def test_fill_path_sets_local_fields(ctx):
    pd = ctx.pd()
    cq = ctx.cq(4)
    qp = pd.qp(ibv.IBV_QPT_RC, 2, cq, 2, cq)
    path = IBPath(ctx.end_port)
    ferry.path.fill_path(qp, path)
    dev = ctx.query_device()
    assert path.sqpn == qp.qp_num
    assert path.SGID == ctx.end_port.default_gid
    assert path.srdatomic == min(255, dev.max_qp_init_rd_atom)
    assert path.drdatomic == min(255, dev.max_qp_rd_atom)
    assert 0 < path.sqpsn < 1 << 24 and 0 < path.dqpsn < 1 << 24
    assert path.sack_resp_time == dev.local_ca_ack_delay
    ferry.path.fill_path(qp, path, max_rd_atomic=0)
    assert path.srdatomic == 0 and path.drdatomic == 0


def test_resolve_path_completes_locally(ctx):
    end_port = ctx.end_port
    other = ferry.get_verbs(end_port)
    try:
        path = IBPath(end_port, DGID=peer_gid(other), qkey=IBA.IB_DEFAULT_QP1_QKEY)
        with ferry.get_gmp_mad(path.end_port, verbs=ctx) as umad:
            assert ferry.path.resolve_path(umad, path, reversible=True) is path
        assert path.SGID == IBA.GID(ctx.query_gid(1, 0), raw=True)
        assert path.has_grh and path.hop_limit == 64
        assert path.MTU == end_port.mtu
        assert path.DLID == 0
        # Properties constrain the result.
        p2 = ferry.path.resolve_path(ferry.get_gmp_mad(end_port), IBPath(end_port, DGID=peer_gid(other)),
                                     properties={"PKey": IBA.DEFAULT_PKEY, "MTU": IBA.MTU_1024, "SL": 3})
        assert (p2.pkey, p2.MTU, p2.SL) == (IBA.DEFAULT_PKEY, IBA.MTU_1024, 3)
        umad = ferry.get_gmp_mad(end_port)
        with pytest.raises(ValueError):
            ferry.path.resolve_path(umad, IBPath(end_port))
        with pytest.raises(ValueError):
            ferry.path.resolve_path(umad, IBPath(end_port, DGID=peer_gid(other)), properties={"Bogus": 1})
        with pytest.raises(ferry.path.SAPathNotFoundError):
            ferry.path.resolve_path(umad, IBPath(end_port, DGID="fe80::2:c903:0:1491"))
        with pytest.raises(ferry.path.SAPathNotFoundError):
            ferry.path.resolve_path(umad, IBPath(end_port, DGID=peer_gid(other)), properties={"PKey": 0x8001})
    finally:
        other.close()


def test_default_gid_needs_an_open_context():
    dev = ferry.get_device("soft_lo")
    for c in list(dev._contexts):
        ctx = c()
        if ctx is not None:
            ctx.close()
    with pytest.raises(ferry.RDMAError):
        ferry.get_end_port("soft_lo").default_gid


def test_end_port_sa_path_names_qp1_of_the_subnet_manager():
    """EndPort.sa_path: QP1 at the SM's LID with the GSI Q_Key; a fresh path on each access, usable
    where python-rdma's users pass it (a MAD channel on its end port)."""
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port):
        sa = end_port.sa_path
        assert isinstance(sa, ferry.path.IBPath) and sa.end_port is end_port
        assert (sa.sqpn, sa.dqpn, sa.qkey) == (1, 1, IBA.IB_DEFAULT_QP1_QKEY)
        assert (sa.DLID, sa.SLID, sa.SL, sa.pkey) == (end_port.sm_lid, end_port.lid, end_port.sm_sl,
                                                     IBA.PKEY_DEFAULT)
        sa.qkey = 5
        assert end_port.sa_path.qkey == IBA.IB_DEFAULT_QP1_QKEY  # changing one changes no other
        with ferry.get_gmp_mad(sa.end_port) as umad:
            assert umad is not None
