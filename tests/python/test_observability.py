"""Observability: per endpoint and per context counters (operations, bytes, errors by status) and
latency histograms, ferry.stats() over the process, the Prometheus collector, and ferry's log
lines (timestamped on stderr; forwarded to Python's logging from Python)."""

import json
import os
import re
import subprocess
import sys

import pytest

import ferry

N = 64 << 10
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def pair(src, dst):
    """Two connected endpoints; a registered src, b registered dst."""
    a = ferry.RDMAEndpoint(device_name="soft_lo", ib_port=1, link_type="tcp")
    b = ferry.RDMAEndpoint(device_name="soft_lo", ib_port=1, link_type="tcp")
    a.register_memory_region("src", src)
    b.register_memory_region("dst", dst)
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    return a, b


def ops(stats, kind):
    return stats["operations"][kind]


def test_endpoint_and_context_count_operations_bytes_errors_and_latency():
    before = ferry.stats()["totals"].get("write", {"operations": 0, "bytes": 0})
    src, dst = bytearray(os.urandom(N)), bytearray(N)
    a, b = pair(src, dst)
    for _ in range(5):
        a.write([("src", "dst", 0, 0, N)]).wait()
    assert dst == src
    w = ops(a.stats(), "write")
    assert w["operations"] == 5 and w["bytes"] == 5 * N and w["errors"] == 0
    assert sum(n for _, n in w["latency_buckets"]) == 5
    assert w["latency_sum_us"] > 0
    bounds = [u for u, _ in w["latency_buckets"]]
    assert bounds[0] == 1.0 and bounds[-1] == float("inf") and bounds == sorted(bounds)
    assert ops(b.stats(), "write")["operations"] == 0, "the target posted nothing"

    # A failure is counted under its status, on the endpoint and in the process totals.
    b.shutdown()
    fut = a.write([("src", "dst", 0, 0, N)])
    with pytest.raises(ferry.Error):
        fut.wait(20)
    w = ops(a.stats(), "write")
    assert w["operations"] == 6 and w["errors"] == 1 and w["bytes"] == 5 * N
    assert sum(w["errors_by_status"].values()) == 1, w["errors_by_status"]

    totals = ferry.stats()["totals"]["write"]
    assert totals["operations"] - before["operations"] >= 6
    assert totals["bytes"] - before["bytes"] >= 5 * N
    ctx = [c for c in ferry.stats()["contexts"] if c["device"] == "soft_lo"]
    assert ctx and ctx[0]["operations"]["write"]["operations"] >= 6
    assert a.context.stats()["write"]["operations"] >= 6
    a.shutdown()


def test_prometheus_collector_exposes_counters_and_histograms():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    ferry.metrics.register_prometheus(registry)
    a, b = pair(bytearray(N), bytearray(N))
    a.write([("src", "dst", 0, 0, N)]).wait()
    text = prometheus_client.generate_latest(registry).decode()
    labels = r'device="soft_lo",kind="write",port="1"'
    m = re.search(r"^ferry_operations_total\{%s\} (\S+)$" % labels, text, re.M)
    assert m and float(m.group(1)) >= 1, text[:2000]
    assert re.search(r"^ferry_bytes_total\{%s\} (\S+)$" % labels, text, re.M)
    inf = re.search(r'^ferry_operation_latency_seconds_bucket\{device="soft_lo",kind="write",le="\+Inf",port="1"\} '
                    r'(\S+)$', text, re.M)
    count = re.search(r"^ferry_operation_latency_seconds_count\{%s\} (\S+)$" % labels, text, re.M)
    assert inf and count and float(inf.group(1)) == float(count.group(1)) >= 1
    a.shutdown()
    b.shutdown()


def test_register_prometheus_without_the_package_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match="prometheus-client"):
        ferry.metrics.register_prometheus()


def test_log_lines_have_timestamps_on_stderr():
    # With forwarding off, the core writes to stderr itself: UTC timestamp, pid, level.
    code = ("import ferry, sys\n"
            "ferry.forward_to_logging(False)\n"
            "ferry._core.log('warn', 'hello from the core')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z ferry\[\d+\] WARN: hello from the core$",
                     r.stderr, re.M), r.stderr


def test_log_lines_reach_python_logging_at_their_level():
    code = ("import logging, time, ferry\n"
            "got = []\n"
            "class Keep(logging.Handler):\n"
            "    def emit(self, record): got.append((record.levelname, record.getMessage()))\n"
            "log = logging.getLogger('ferry'); log.addHandler(Keep()); log.propagate = False\n"
            "log.setLevel(logging.DEBUG)\n"
            "ferry._core.log('warn', 'first')\n"
            "ferry._core.log('error', 'second')\n"
            "ferry._core.log('info', 'third')\n"
            "ferry._core.log('debug', 'fourth')\n"
            "deadline = time.monotonic() + 10\n"
            "while len(got) < 4 and time.monotonic() < deadline: time.sleep(0.01)\n"
            "print(got)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FERRY_LOG_LEVEL="warn"))
    assert r.returncode == 0, r.stderr
    assert "[('WARNING', 'first'), ('ERROR', 'second'), ('INFO', 'third'), ('DEBUG', 'fourth')]" in r.stdout, \
        (r.stdout, r.stderr)
    assert "first" not in r.stderr, "a forwarded line is not also written to stderr"


# Runs `steps` (Python source) in a fresh interpreter with a handler that keeps the ferry logger's
# records in `got`; `settle(tag)` logs a WARN line through the core and waits until it arrives, so
# every line logged before it has arrived too. Returns what the program printed.
KEEPER = """import json, logging, time, ferry
from ferry import _core
got = []
class Keep(logging.Handler):
    def emit(self, record): got.append((record.levelname, record.getMessage()))
log = logging.getLogger('ferry'); log.addHandler(Keep()); log.propagate = False
def settle(tag):
    _core.log('warn', tag)
    deadline = time.monotonic() + 10
    while ('WARNING', tag) not in got and time.monotonic() < deadline: time.sleep(0.01)
    assert ('WARNING', tag) in got, got
def open_device():  # opening a soft device logs 'soft_lo: context listening on ...' at INFO
    with ferry.get_verbs(ferry.get_end_port('soft_lo')):
        pass
"""


def run_with_keeper(steps, **env):
    environment = {k: v for k, v in os.environ.items() if k != "FERRY_LOG_LEVEL"}
    environment.update(env)
    r = subprocess.run([sys.executable, "-c", KEEPER + steps], capture_output=True, text=True, timeout=120,
                       env=environment)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_core_log_follows_the_ferry_loggers_level():
    out = run_with_keeper("""
print('import', _core.log_level())
log.setLevel(logging.DEBUG)
print('debug', _core.log_level())
open_device(); _core.log('debug', 'detail'); settle('at debug')
shown = list(got); got.clear()
log.setLevel(logging.WARNING)
print('warning', _core.log_level())
open_device(); _core.log('debug', 'detail'); _core.log('info', 'progress'); settle('at warning')
hidden = list(got); got.clear()
log.setLevel(logging.NOTSET); logging.getLogger().setLevel(logging.INFO)  # the root's level applies
print('root info', _core.log_level())
logging.disable(logging.INFO)
print('disabled info', _core.log_level())
logging.disable(logging.NOTSET)
print('enabled again', _core.log_level())
print(json.dumps({'shown': shown, 'hidden': hidden}))
""")
    lines = out.splitlines()
    assert lines[:6] == ["import warn", "debug debug", "warning warn", "root info info", "disabled info warn",
                         "enabled again info"], out
    records = json.loads(lines[6])
    shown = records["shown"]
    assert any(level == "INFO" and re.match(r"soft_lo: context listening on ", message) for level, message in shown), \
        shown
    assert ["DEBUG", "detail"] in shown, shown
    assert records["hidden"] == [["WARNING", "at warning"]], "a level under the logger's is not even made"


def test_ferry_log_level_sets_the_loggers_level_until_the_program_does():
    out = run_with_keeper("""
print(_core.log_level(), logging.getLevelName(log.level))
logging.getLogger().setLevel(logging.ERROR)  # the ferry logger has a level of its own now
print(_core.log_level())
open_device(); _core.log('debug', 'detail'); settle('still debug')
print(any(m.startswith('soft_lo: context listening') for _, m in got), ('DEBUG', 'detail') in got)
log.setLevel(logging.ERROR)
print(_core.log_level())
""", FERRY_LOG_LEVEL="debug")
    assert out.splitlines() == ["debug DEBUG", "debug", "True True", "error"], out


@pytest.mark.parametrize("before,env,expected", [
    ("logging.basicConfig(level=logging.INFO)", None, "info"),
    ("logging.getLogger('ferry').setLevel(logging.INFO)", "debug", "info"),  # the program's level wins
    ("logging.getLogger().setLevel(logging.ERROR)", "debug", "debug"),  # but not the root's
])
def test_a_logging_level_set_before_import(before, env, expected):
    code = "import logging\n%s\nimport ferry\nprint(ferry._core.log_level())\n" % before
    environment = {k: v for k, v in os.environ.items() if k != "FERRY_LOG_LEVEL"}
    if env:
        environment["FERRY_LOG_LEVEL"] = env
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environment)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected, (r.stdout, r.stderr)


TYPO = "FERRY_DEVICE is not a ferry variable (did you mean FERRY_DEVICES?); ferry info --config lists them"


def test_a_misspelt_variable_is_warned_about_once():
    out = run_with_keeper("""
ferry.check_config(); ferry.check_config(); open_device(); open_device()
settle('checked')
print(json.dumps({'got': got, 'unknown': ferry.unknown_config()}))
""", FERRY_DEVICE="soft_lo", FERRY_TEST_BIN_DIR="reserved, never reported")
    result = json.loads(out)
    warnings = [m for level, m in result["got"] if "is not a ferry variable" in m]
    assert warnings == [TYPO], result["got"]
    assert ["WARNING", TYPO] in result["got"]
    assert result["unknown"] == [{"name": "FERRY_DEVICE", "suggestion": "FERRY_DEVICES", "warning": TYPO}], result


def test_ferry_info_config_lists_a_misspelt_variable():
    ferry_program = os.path.join(os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests")), "..",
                                 "ferry")
    if not os.access(ferry_program, os.X_OK):
        pytest.skip("the ferry program is not built at %s" % ferry_program)
    env = dict(os.environ, FERRY_DEVICE="soft_lo")
    text = subprocess.run([ferry_program, "info", "--config"], capture_output=True, text=True, timeout=60, env=env)
    assert text.returncode == 0, text.stderr
    unknown = text.stdout.split("not ferry variables")[1].split("read by ferry's own tests")[0]
    assert re.search(r"^FERRY_DEVICE +did you mean FERRY_DEVICES\?$", unknown, re.M), text.stdout
    assert "soft_lo" not in unknown, "the value of an unknown variable is never shown"
    assert re.search(r"^FERRY_TEST_BIN_DIR ", text.stdout.split("read by ferry's own tests")[1], re.M), text.stdout
    doc = json.loads(subprocess.run([ferry_program, "info", "--config", "--json"], capture_output=True, text=True,
                                    timeout=60, env=env).stdout)
    assert doc["unknown"] == [{"name": "FERRY_DEVICE", "suggestion": "FERRY_DEVICES", "warning": TYPO}], doc["unknown"]
    assert "FERRY_TEST_BIN_DIR" in [r["name"] for r in doc["reserved"]]
