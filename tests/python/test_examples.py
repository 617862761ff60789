"""The programs in examples/ run as a user would run them, and say they verified their bytes."""

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(HERE, "..", "..", "build", "tests"))
FERRY = os.path.abspath(os.path.join(BIN_DIR, "..", "ferry"))

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not importable")


@pytest.mark.parametrize("name, expect", [
    ("agent_prefill_decode.py", "block 7 arrived, verified"),
    ("agent_asyncio.py", "verified"),
    ("connect_http.py", "the peer's answer arrived, verified"),
    ("objects_store.py", "bytes moved by RDMA, verified"),
    ("nixl/two_peers.py", "two peers: 1 MiB written and read back over ferry, verified"),
    # The Endpoint API document's four examples.
    pytest.param("python/p2p_rdma_rc_read.py", "read: 8 bytes from remote offset 8, then 1048576 bytes, verified",
                 marks=needs_torch),
    pytest.param("python/p2p_rdma_rc_write.py", "write: 8 zero bytes to remote offset 0, then 1048576 bytes, "
                 "verified", marks=needs_torch),
    pytest.param("python/p2p_rdma_rc_write_with_imm_data.py", "write_with_imm: 1048576 bytes, immediate 7, verified",
                 marks=needs_torch),
    pytest.param("python/p2p_rdma_rc_send_recv_torch.py", "send/recv: a 4096-byte message, then a 1048576-byte "
                 "tensor, verified", marks=needs_torch),
    # The verbs specification's usage examples (section 7).
    ("verbs/context_pd_memory.py", "SGEs: 7 checks, verified"),
    ("verbs/rc_no_cm.py", "RC without a CM: 1048576 bytes written and a 14-byte message sent to the other "
     "process, verified"),
    ("verbs/cq_poller.py", "CQPoller: 8 completions from the completion channel within 1 s, verified"),
    # Written in the specification's order, which posts receives while the QP is still in RESET.
    ("verbs/ud.py", "the other process answered 'echo:Hello over UD' through the reply path, verified"),
])
def test_example_runs_and_verifies(name, expect):
    env = dict(os.environ, FERRY=FERRY, FERRY_DEVICES="soft_lo")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert expect in r.stdout, r.stdout
    assert "CORRUPT" not in r.stdout


def test_every_example_is_run_and_listed():
    """A program added to examples/ is run above and has a row in examples/README.md."""
    run = {p.values[0] if hasattr(p, "values") else p[0]
           for p in test_example_runs_and_verifies.pytestmark[0].args[1]}
    found = set()
    for root, _, files in os.walk(EXAMPLES):
        for f in files:
            if f.endswith(".py"):
                found.add(os.path.relpath(os.path.join(root, f), EXAMPLES))
    assert found == run
    with open(os.path.join(EXAMPLES, "README.md")) as readme:
        text = readme.read()
    assert [n for n in sorted(found) if "`%s`" % n not in text] == []
