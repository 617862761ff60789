"""The programs in examples/ run as a user would run them, and say they verified their bytes."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(HERE, "..", "..", "build", "tests"))
FERRY = os.path.abspath(os.path.join(BIN_DIR, "..", "ferry"))


@pytest.mark.parametrize("name, expect", [
    ("agent_prefill_decode.py", "block 7 arrived, verified"),
    ("agent_asyncio.py", "verified"),
    ("connect_http.py", "the peer's answer arrived, verified"),
])
def test_example_runs_and_verifies(name, expect):
    env = dict(os.environ, FERRY=FERRY, FERRY_DEVICES="soft_lo")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert expect in r.stdout, r.stdout
    assert "CORRUPT" not in r.stdout
