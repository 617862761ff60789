"""Observability: per endpoint and per context counters (operations, bytes, errors by status) and
latency histograms, ferry.stats() over the process, the Prometheus collector, and ferry's log
lines (timestamped on stderr; forwarded to Python's logging from Python)."""

import os
import re
import subprocess
import sys

import pytest

import ferry

N = 64 << 10


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
            "ferry._core.log('debug', 'filtered by FERRY_LOG_LEVEL')\n"
            "deadline = time.monotonic() + 10\n"
            "while len(got) < 2 and time.monotonic() < deadline: time.sleep(0.01)\n"
            "print(got)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FERRY_LOG_LEVEL="warn"))
    assert r.returncode == 0, r.stderr
    assert "[('WARNING', 'first'), ('ERROR', 'second')]" in r.stdout, (r.stdout, r.stderr)
    assert "first" not in r.stderr, "a forwarded line is not also written to stderr"
