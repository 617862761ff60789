"""What ferry did in this process: operations, bytes, errors and latency, per device context and
per kind of operation, and (optionally) the same as Prometheus metrics.

``ferry.stats()`` returns ``{"contexts": [...], "totals": {...}}``. Each context (one per device
port in use) is ``{"device", "ib_port", "operations"}``; ``operations`` and ``totals`` map each
kind (``read``, ``write``, ``write_with_imm``, ``send``, ``recv``, ``imm_recv``) to::

    {"operations": completed (successfully or not), "bytes": moved by the successful ones,
     "errors": completed with an error, "errors_by_status": {"PeerGone": 2, ...},
     "latency_sum_us": ..., "latency_buckets": [(upper_bound_us, count), ...]}

Latency runs from the call to the completion of its future; bucket ``i`` counts the operations
that took at most ``2**i`` microseconds (and more than the bucket before), the last one (``inf``)
everything slower. An endpoint's ``stats()["operations"]`` has the same shape for that endpoint
alone. Recording costs a few atomic additions per operation; nothing is sampled.

``register_prometheus(registry=None)`` exposes them through the ``prometheus_client`` package
(``pip install prometheus-client``), collected when scraped:

- ``ferry_operations_total{device,port,kind}``, ``ferry_bytes_total``, ``ferry_errors_total{...,status}``
- ``ferry_operation_latency_seconds{device,port,kind}``: a histogram (``_bucket``, ``_sum``, ``_count``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _core

if TYPE_CHECKING:
    from prometheus_client.registry import Collector as _CollectorBase
    from prometheus_client.registry import CollectorRegistry
    from prometheus_client.metrics_core import Metric
else:
    _CollectorBase = object


def _merge(into: Dict[str, Dict[str, Any]], ops: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    for kind, m in ops.items():
        t = into.setdefault(kind, {"operations": 0, "bytes": 0, "errors": 0, "errors_by_status": {},
                                   "latency_sum_us": 0.0,
                                   "latency_buckets": [(upper, 0) for upper, _ in m["latency_buckets"]]})
        t["operations"] += m["operations"]
        t["bytes"] += m["bytes"]
        t["errors"] += m["errors"]
        for status, n in m["errors_by_status"].items():
            t["errors_by_status"][status] = t["errors_by_status"].get(status, 0) + n
        t["latency_sum_us"] += m["latency_sum_us"]
        t["latency_buckets"] = [(upper, a + b) for (upper, a), (_, b) in zip(t["latency_buckets"],
                                                                            m["latency_buckets"])]
    return into


def stats() -> Dict[str, Any]:
    """Every open context's operations, and their totals: ``{"contexts": [...], "totals": {...}}``
    (see the module's documentation; bytes, counts, latencies in microseconds)."""
    contexts = _core.endpoint.process_stats()
    totals: Dict[str, Dict[str, Any]] = {}
    for ctx in contexts:
        _merge(totals, ctx["operations"])
    return {"contexts": contexts, "totals": totals}


class _Collector(_CollectorBase):
    """A prometheus_client collector of ``ferry.stats()``, read when scraped."""

    def collect(self) -> List[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        labels = ["device", "port", "kind"]
        ops = CounterMetricFamily("ferry_operations", "Operations completed, successfully or not", labels=labels)
        moved = CounterMetricFamily("ferry_bytes", "Bytes moved by successful operations", labels=labels)
        errors = CounterMetricFamily("ferry_errors", "Operations completed with an error",
                                     labels=labels + ["status"])
        latency = HistogramMetricFamily("ferry_operation_latency_seconds",
                                        "Time from the call to the completion of its future", labels=labels)
        for ctx in _core.endpoint.process_stats():
            for kind, m in ctx["operations"].items():
                values = [ctx["device"], str(ctx["ib_port"]), kind]
                ops.add_metric(values, m["operations"])
                moved.add_metric(values, m["bytes"])
                for status, n in m["errors_by_status"].items():
                    errors.add_metric(values + [status], n)
                cumulative, buckets = 0, []
                for upper_us, count in m["latency_buckets"]:
                    cumulative += count
                    bound = "+Inf" if upper_us == float("inf") else repr(upper_us / 1e6)
                    buckets.append((bound, cumulative))
                latency.add_metric(values, buckets, m["latency_sum_us"] / 1e6)
        return [ops, moved, errors, latency]


def register_prometheus(registry: Optional[CollectorRegistry] = None) -> _CollectorBase:
    """Registers a collector of ``ferry.stats()`` with ``registry`` (prometheus_client's default
    REGISTRY when None) and returns it. Raises ImportError naming the package when
    prometheus_client is not installed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError as e:
        raise ImportError("ferry.metrics.register_prometheus needs prometheus_client "
                          "(pip install prometheus-client)") from e
    collector = _Collector()
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
