"""The `ferry` program's surface a script relies on: --version, `info --json`, `info --config`
(text and JSON), and FERRY_* variables: one table, read in one place, a bad value refused with
exit code 2 and a line naming the variable. ferry.config() / ferry.check_config() from Python."""

import json
import os
import re
import subprocess
import sys

import pytest

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN_DIR = os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests"))
FERRY = os.path.join(BIN_DIR, "..", "ferry")


def run(*args, env=None):
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)


def project_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(ferry VERSION ([0-9.]+)", text).group(1)


def test_version_is_the_one_number_in_cmakelists():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == "ferry " + project_version()
    assert ferry.__version__ == project_version()
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert not re.search(r'^version\s*=', pyproject, re.M), "pyproject.toml must not repeat the version"


def test_info_json_lists_providers_and_devices():
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == project_version()
    assert doc["config_error"] is None
    names = {p["name"] for p in doc["providers"]}
    assert "soft" in names
    soft_lo = [d for d in doc["devices"] if d["name"] == "soft_lo"]
    assert soft_lo, doc["devices"]
    assert soft_lo[0]["ports"][0]["state"] == "PORT_ACTIVE"
    assert re.fullmatch(r"[0-9a-f]{16}", soft_lo[0]["node_guid"])
    only = json.loads(run("info", "--json", "--device", "soft_lo").stdout)
    assert [d["name"] for d in only["devices"]] == ["soft_lo"]


def test_info_config_lists_every_variable_of_the_table():
    table = ferry.config()
    r = run("info", "--config", "--json", env={"FERRY_SOFT_SPIN_US": "5"})
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["config"]
    assert [row["name"] for row in rows] == [row["name"] for row in table]
    spin = next(row for row in rows if row["name"] == "FERRY_SOFT_SPIN_US")
    assert spin["set"] and spin["value"] == "5" and spin["effective"] == "5" and spin["error"] is None
    text = run("info", "--config").stdout
    for row in table:
        assert row["name"] in text


@pytest.mark.parametrize("name,value", [
    ("FERRY_SOFT_SPIN_US", "fast"),
    ("FERRY_SOFT_SAME_HOST", "maybe"),
    ("FERRY_LOG_LEVEL", "loud"),
    ("FERRY_DEVICES", ",,"),
    ("FERRY_SOFT_RING_BYTES", "1T"),
    ("FERRY_WAIT_SPIN_US", "10001"),
    ("FERRY_WAIT_LEASE_US", "-1"),
])
def test_a_bad_value_is_exit_2_naming_the_variable(name, value):
    for args in (("info",), ("info", "--json"), ("info", "--config")):
        r = run(*args, env={name: value})
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr
        assert "%s=%s" % (name, value) in (r.stderr + r.stdout), (args, r.stderr, r.stdout)


def test_python_refuses_a_bad_value_when_opening_a_device():
    code = ("import ferry\n"
            "try:\n"
            "    ferry.check_config()\n"
            "except ferry.InvalidArgument as e:\n"
            "    print('refused:', e)\n"
            "try:\n"
            "    ferry.RDMAEndpoint(device_name='soft_lo')\n"
            "except ferry.InvalidArgument as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FERRY_SOFT_SPIN_US="x"))
    lines = [l for l in r.stdout.splitlines() if l.startswith("refused:")]
    assert len(lines) == 2, (r.stdout, r.stderr)
    assert all("FERRY_SOFT_SPIN_US=x" in l for l in lines)


def test_every_variable_is_read_in_one_place():
    """No FERRY_* variable is read with getenv outside src/common/config.cc."""
    offenders = []
    for top in ("src", "tools", "bench/engine", "python/src", "include"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                if path.endswith(os.path.join("src", "common", "config.cc")):
                    continue
                for n, line in enumerate(open(path), 1):
                    if re.search(r'getenv\("FERRY_', line):
                        offenders.append("%s:%d" % (os.path.relpath(path, ROOT), n))
    for dirpath, _, files in os.walk(os.path.join(ROOT, "python", "ferry")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                for n, line in enumerate(open(path), 1):
                    if re.search(r'environ(\.get\(|\[)"FERRY_|getenv\("FERRY_', line):
                        offenders.append("%s:%d" % (os.path.relpath(path, ROOT), n))
    assert not offenders, offenders


def test_a_bad_store_variable_is_refused_by_the_agent():
    code = ("import ferry\n"
            "try:\n"
            "    ferry.start_peer_agent(alias='x', device='soft_lo')\n"
            "except ferry.InvalidArgument as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FERRY_STORE="localhost:6379"))
    assert "refused:" in r.stdout and "FERRY_STORE=localhost:6379" in r.stdout, (r.stdout, r.stderr)
