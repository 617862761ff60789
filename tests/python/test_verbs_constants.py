"""ferry.verbs' IBV_* constants carry libibverbs' numbers, and each is defined once: the C++
layer's through ferry._core.verbs_constants, the rest in ferry.verbs itself. The ibv_qp_attr
members are listed once too, by the extension (ferry._core.verbs.qp_attr_fields)."""

import ast
import os
import shutil
import subprocess

import pytest

import ferry
import ferry.verbs as ibv
from ferry._core import verbs as core_verbs
from ferry._core import verbs_constants

# Numbers from rdma-core's <infiniband/verbs.h> (the verbs ABI), written out here so that a wrong
# binding cannot agree with itself.
RDMA_CORE_VALUES = {
    "IBV_WR_RDMA_WRITE": 0, "IBV_WR_RDMA_WRITE_WITH_IMM": 1, "IBV_WR_SEND": 2, "IBV_WR_SEND_WITH_IMM": 3,
    "IBV_WR_RDMA_READ": 4, "IBV_WR_ATOMIC_CMP_AND_SWP": 5, "IBV_WR_ATOMIC_FETCH_AND_ADD": 6,
    "IBV_ACCESS_LOCAL_WRITE": 1, "IBV_ACCESS_REMOTE_WRITE": 2, "IBV_ACCESS_REMOTE_READ": 4,
    "IBV_ACCESS_REMOTE_ATOMIC": 8, "IBV_ACCESS_MW_BIND": 16,
    "IBV_SEND_FENCE": 1, "IBV_SEND_SIGNALED": 2, "IBV_SEND_SOLICITED": 4, "IBV_SEND_INLINE": 8,
    "IBV_QPS_RESET": 0, "IBV_QPS_INIT": 1, "IBV_QPS_RTR": 2, "IBV_QPS_RTS": 3, "IBV_QPS_SQD": 4,
    "IBV_QPS_SQE": 5, "IBV_QPS_ERR": 6,
    "IBV_QPT_RC": 2, "IBV_QPT_UC": 3, "IBV_QPT_UD": 4,
    "IBV_QP_STATE": 1, "IBV_QP_CUR_STATE": 2, "IBV_QP_ACCESS_FLAGS": 8, "IBV_QP_PKEY_INDEX": 16,
    "IBV_QP_PORT": 32, "IBV_QP_QKEY": 64, "IBV_QP_AV": 128, "IBV_QP_PATH_MTU": 256, "IBV_QP_TIMEOUT": 512,
    "IBV_QP_RETRY_CNT": 1024, "IBV_QP_RNR_RETRY": 2048, "IBV_QP_RQ_PSN": 4096, "IBV_QP_MAX_QP_RD_ATOMIC": 8192,
    "IBV_QP_ALT_PATH": 16384, "IBV_QP_MIN_RNR_TIMER": 32768, "IBV_QP_SQ_PSN": 65536,
    "IBV_QP_MAX_DEST_RD_ATOMIC": 131072, "IBV_QP_PATH_MIG_STATE": 262144, "IBV_QP_CAP": 524288,
    "IBV_QP_DEST_QPN": 1048576,
    "IBV_WC_SEND": 0, "IBV_WC_RDMA_WRITE": 1, "IBV_WC_RDMA_READ": 2, "IBV_WC_COMP_SWAP": 3,
    "IBV_WC_FETCH_ADD": 4, "IBV_WC_BIND_MW": 5, "IBV_WC_RECV": 128, "IBV_WC_RECV_RDMA_WITH_IMM": 129,
    "IBV_WC_SUCCESS": 0, "IBV_WC_LOC_LEN_ERR": 1, "IBV_WC_LOC_PROT_ERR": 4, "IBV_WC_WR_FLUSH_ERR": 5,
    "IBV_WC_REM_ACCESS_ERR": 10, "IBV_WC_RETRY_EXC_ERR": 12, "IBV_WC_RNR_RETRY_EXC_ERR": 13,
    "IBV_WC_GENERAL_ERR": 21, "IBV_WC_GRH": 1, "IBV_WC_WITH_IMM": 2,
    "IBV_MTU_256": 1, "IBV_MTU_1024": 3, "IBV_MTU_4096": 5,
    "IBV_PORT_DOWN": 1, "IBV_PORT_ACTIVE": 4, "IBV_PORT_ACTIVE_DEFER": 5,
    "IBV_LINK_LAYER_UNSPECIFIED": 0, "IBV_LINK_LAYER_INFINIBAND": 1, "IBV_LINK_LAYER_ETHERNET": 2,
    "IBV_EVENT_CQ_ERR": 0, "IBV_EVENT_QP_FATAL": 1, "IBV_EVENT_COMM_EST": 4, "IBV_EVENT_DEVICE_FATAL": 8,
    "IBV_EVENT_PORT_ACTIVE": 9, "IBV_EVENT_LID_CHANGE": 11, "IBV_EVENT_SRQ_LIMIT_REACHED": 15,
    "IBV_EVENT_CLIENT_REREGISTER": 17, "IBV_EVENT_GID_CHANGE": 18,
    "IBV_REREG_MR_CHANGE_TRANSLATION": 1, "IBV_REREG_MR_CHANGE_PD": 2, "IBV_REREG_MR_CHANGE_ACCESS": 4,
    "IBV_RATE_MAX": 0, "IBV_RATE_2_5_GBPS": 2, "IBV_RATE_10_GBPS": 3, "IBV_RATE_120_GBPS": 10,
    "IBV_NODE_CA": 1, "IBV_TRANSPORT_IB": 0, "IBV_ATOMIC_HCA": 1, "IBV_DEVICE_N_NOTIFY_CQ": 1 << 14,
    "IBV_SRQ_LIMIT": 2, "IBV_MIG_ARMED": 2,
}


def _assigned_in_verbs_py():
    """The IBV_* names ferry/verbs.py assigns itself (module level)."""
    path = os.path.join(os.path.dirname(ibv.__file__), "verbs.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name) and t.id.startswith("IBV_")}


def test_constants_have_the_verbs_abi_numbers():
    wrong = {name: getattr(ibv, name, None) for name, value in RDMA_CORE_VALUES.items()
             if getattr(ibv, name, None) != value}
    assert wrong == {}
    # The part that comes from the C++ layer is most of the sample.
    assert len(set(RDMA_CORE_VALUES) & set(verbs_constants.__all__)) >= 60


def test_each_constant_is_defined_once():
    from_cpp = set(verbs_constants.__all__)
    in_python = _assigned_in_verbs_py()
    assert from_cpp and in_python
    assert from_cpp & in_python == set(), "defined in C++ and again in ferry/verbs.py"
    exported = {n for n in ibv.__all__ if n.startswith("IBV_")}
    assert exported == from_cpp | in_python
    assert all(getattr(ibv, n) == getattr(verbs_constants, n) for n in from_cpp)
    assert all(isinstance(getattr(ibv, n), int) for n in exported)
    assert {n for n in dir(verbs_constants) if n.startswith("IBV_")} == from_cpp


@pytest.mark.skipif(shutil.which("cc") is None or not os.path.exists("/usr/include/infiniband/verbs.h"),
                    reason="needs a C compiler and rdma-core's <infiniband/verbs.h> to compare every constant")
def test_every_constant_matches_rdma_cores_header(tmp_path):
    """Where rdma-core's header is installed, every IBV_* name it has gives the number ferry.verbs
    gives (IBV_REREG_MR_KEEP_VALID is not in it)."""
    names = sorted(n for n in ibv.__all__ if n.startswith("IBV_") and n != "IBV_REREG_MR_KEEP_VALID")
    lines = ["#include <stdio.h>", "#include <infiniband/verbs.h>", "int main(void) {"]
    lines += ['  printf("%s %%lld\\n", (long long)(%s));' % (n, n) for n in names]
    lines += ["  return 0;", "}"]
    (tmp_path / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run(["cc", "-o", str(tmp_path / "abi"), str(tmp_path / "abi.c")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "abi")], check=True, capture_output=True, text=True).stdout
    header = {name: int(value) for name, value in (line.split() for line in out.splitlines())}
    assert {n: getattr(ibv, n) for n in names if getattr(ibv, n) != header[n]} == {}


def test_qp_attr_fields_come_from_the_extensions_list():
    names = tuple(name for name, _ in core_verbs.qp_attr_fields)
    assert ibv.qp_attr._names == names
    assert len(names) == 25  # every member of ibv_qp_attr
    masks = dict(core_verbs.qp_attr_fields)
    assert masks["qp_state"] == ibv.IBV_QP_STATE and masks["ah_attr"] == ibv.IBV_QP_AV
    assert masks["dest_qp_num"] == ibv.IBV_QP_DEST_QPN and masks["alt_timeout"] == ibv.IBV_QP_ALT_PATH
    # Assigning a member sets its bit; sq_draining, which only a query reports, has none.
    assert ibv.qp_attr(qp_state=ibv.IBV_QPS_INIT, port_num=1).MASK == ibv.IBV_QP_STATE | ibv.IBV_QP_PORT
    assert ibv.qp_attr(sq_draining=1).MASK == 0
    # Together the bits are every IBV_QP_* attribute bit.
    every = 0
    for bit in masks.values():
        every |= bit
    assert every == sum(getattr(ibv, n) for n in verbs_constants.__all__ if n.startswith("IBV_QP_"))


def test_query_reports_what_modify_set():
    """QP.modify reads and QP.query reports the members by the extension's list."""
    with ferry.get_verbs() as ctx:
        pd = ctx.pd()
        cq = ctx.cq(8)
        qp = pd.qp(ibv.IBV_QPT_RC, 4, cq, 4, cq)
        attr = ibv.qp_attr(qp_state=ibv.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_READ)
        qp.modify(attr, attr.MASK)
        got, init = qp.query()
        assert got.qp_state == ibv.IBV_QPS_INIT and got.port_num == 1
        assert got.qp_access_flags == ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_READ
        assert got.cap.max_send_wr >= 4 and init.cap.max_recv_wr == qp.max_recv_wr
        assert isinstance(got.ah_attr.grh.dgid, ferry.IBA.GID)
        with pytest.raises(ValueError, match="qp_attr.qp_state"):
            bad = ibv.qp_attr(qp_state=7)
            qp.modify(bad, bad.MASK)
