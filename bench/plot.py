#!/usr/bin/env python3
"""bench/plot.py: draw bandwidth or latency against message size from the JSON the benchmarks write,
every series of every file on one chart.

    bench/plot.py bw.json -o bw.png                              # ferry bench --local --json > bw.json
    bench/plot.py lat.json tcp-lat.json -o lat.png --metric latency
    bench/plot.py bench/results/compare-*.json -o cmp.png --series memcpy "cma write" ferry_default_write_bw

It reads:
  ferry bench --json                one series ("ferry write", "ferry endpoint read python", ...)
  bench/compare                     its references and ferry's runs: "memcpy", "cma write", "iperf3",
                                    "sockperf", "ucx_tcp put", "mooncake read", "nixl_shm write",
                                    "ferry_tcp_write_bw", ... (not the 64 B message-rate points)
  bench/rxe-compare                 "ferry write", "dlslime read", ...
  bench/endpoint-overhead           each run: "c++ write lat batch 16", "python tuple read bw batch 1", ...
  bench/connect_bench.py --json     "connector", "endpoint"
  ferry_memcpy_bench --json         "memcpy", or "cma write" and "cma read"
  a peer driver's output            the FERRY_PEER lines of bench/peers/*_peer.py: "NAME write", "NAME read"

Bandwidth is in GB/s (10^9 B/s); latency in microseconds, the median with a band from the minimum to
the 99th percentile where the file has them (ferry bench: one way, half the round trip, for
ping-pongs; see docs/benchmarks.md). The x axis is the message size on a log2 scale. A name that
two files both give is followed by its file's name. --series draws only the named series, in that
order. matplotlib is needed (pip install matplotlib); bad input ends with one line and exit code 2.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cli import ArgumentParser, format_size  # noqa: E402

PROG = "bench/plot.py"
METRICS = ("bandwidth", "latency")
PEER_PREFIX = "FERRY_PEER "  # bench/peers/peer_common.py
LINE_STYLES = ("-", "--", ":", "-.")


class InputError(Exception):
    """Input that cannot be drawn; the message says which and why (exit code 2)."""


class Series:
    """One line of the chart: {size: value} for a metric, with an optional {size: (low, high)} band."""

    def __init__(self, name, metric, points, band=None):
        self.name = name
        self.metric = metric
        self.points = points
        self.band = band or {}


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def rows_series(name, rows, key, metric):
    """A series of rows[i][key] by rows[i]["size"]; key may be a function of the row."""
    points = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not _number(row.get("size")):
            continue
        value = key(row) if callable(key) else row.get(key)
        if _number(value):
            points[int(row["size"])] = float(value)
    return [Series(name, metric, points)] if points else []


def latency_series(name, rows, field="lat_us"):
    """The median of each row's latency figures, with the band from min to p99 where given."""
    points, band = {}, {}
    for row in rows if isinstance(rows, list) else []:
        lat = row.get(field) if isinstance(row, dict) else None
        if not isinstance(lat, dict) or not _number(row.get("size")) or not _number(lat.get("median")):
            continue
        size = int(row["size"])
        points[size] = float(lat["median"])
        if _number(lat.get("min")) and _number(lat.get("p99")):
            band[size] = (float(lat["min"]), float(lat["p99"]))
    return [Series(name, "latency", points, band)] if points else []


def ferry_bench_name(doc):
    words = ["ferry"] + (["endpoint"] if doc.get("api") == "endpoint" else []) + [str(doc.get("op", "?"))]
    if doc.get("language") == "python":
        words += ["python", str(doc.get("form", ""))]
    if doc.get("threads", 1) != 1:
        words.append("%s threads" % doc["threads"])
    return " ".join(w for w in words if w)


def from_ferry_bench(doc, name=None):
    """ferry bench --json (and bench/endpoint_client.py --json): bandwidth of a bw run, latency of a lat run."""
    name = name or ferry_bench_name(doc)
    rows = doc.get("results")
    series = latency_series(name, rows)
    if doc.get("mode") != "lat":
        series += rows_series(name, rows, "bw_gbps", "bandwidth")
    return series


def from_peer(name, outcome):
    """A peer driver's outcome (bench/peers, as bench/compare and bench/rxe-compare keep them)."""
    if not isinstance(outcome, dict):
        return []
    series = []
    for op in ("write", "read"):
        series += rows_series("%s %s" % (name, op), outcome.get("results"), op + "_gbps", "bandwidth")
        rows = [r for r in outcome.get("latency") or [] if isinstance(r, dict) and r.get("op") == op]
        series += latency_series("%s %s" % (name, op), rows, field="us")
    return series


def from_compare(doc):
    """bench/compare's figures; the 64 B message-rate points (*_rate) are not a size sweep."""
    series = []
    for name, fig in (doc.get("figures") or {}).items():
        if name.endswith("_rate"):
            continue
        if isinstance(fig, dict) and "ferry_bench" in fig:
            series += from_ferry_bench(fig, name)
        elif isinstance(fig, dict):
            series += from_peer(name, fig)
        elif name.startswith("ucx_"):
            series += rows_series(name + " put", fig, "put_gbps", "bandwidth")
            series += rows_series(name + " get", fig, "get_gbps", "bandwidth")
            series += rows_series(name + " put", fig, "put_lat_us", "latency")
        elif name == "sockperf":
            series += rows_series(name, fig, "median_us", "latency")
        else:  # memcpy, cma, iperf3
            series += rows_series(name, fig, "gbps", "bandwidth")
            series += rows_series(name + " write", fig, "write_gbps", "bandwidth")
            series += rows_series(name + " read", fig, "read_gbps", "bandwidth")
    return series


def from_endpoint_overhead(doc):
    series = []
    for run in doc.get("runs") or []:
        if isinstance(run, dict):
            language = run.get("language", "?") + (" " + run["form"] if run.get("form") else "")
            name = "%s %s %s batch %s" % (language, run.get("op"), run.get("mode"), run.get("batch"))
            series += from_ferry_bench(run, name)
    return series


def from_connect(doc):
    rows = doc.get("rows")
    return (rows_series("connector", rows, "connector_gbps", "bandwidth") +
            rows_series("endpoint", rows, "endpoint_gbps", "bandwidth") +
            rows_series("connector", rows, "connector_us", "latency") +
            rows_series("endpoint", rows, "endpoint_us", "latency"))


def from_memcpy(doc):
    name = doc.get("mode", "memcpy")
    rows = doc.get("results")
    return (rows_series(name, rows, "gbps", "bandwidth") + rows_series(name + " write", rows, "write_gbps", "bandwidth")
            + rows_series(name + " read", rows, "read_gbps", "bandwidth"))


def series_of(doc):
    """Every series of one document, or None when it is no format this program knows."""
    if not isinstance(doc, dict):
        return None
    if "ferry_bench" in doc:
        return from_ferry_bench(doc)
    if "compare" in doc:
        return from_compare(doc)
    if "rxe_compare" in doc:
        return [s for name, outcome in (doc.get("peers") or {}).items() for s in from_peer(name, outcome)]
    if "endpoint_overhead" in doc:
        return from_endpoint_overhead(doc)
    if doc.get("bench") == "connect":
        return from_connect(doc)
    if "ferry_memcpy_bench" in doc:
        return from_memcpy(doc)
    if "peer" in doc:
        return from_peer(doc["peer"], doc)
    return None


def load(path):
    """The series of one file: a JSON document, or the FERRY_PEER lines a peer driver prints."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("cannot read %s: %s" % (path, getattr(e, "strerror", None) or e))
    peer_lines = [line[len(PEER_PREFIX):] for line in text.splitlines() if line.startswith(PEER_PREFIX)]
    try:
        docs = [json.loads(line) for line in peer_lines] if peer_lines else [json.loads(text)]
    except ValueError as e:
        raise InputError("%s is not JSON (%s)" % (path, e))
    found = [series_of(doc) for doc in docs]
    if all(s is None for s in found):
        raise InputError("%s holds no benchmark results this program knows (see bench/plot.py --help)" % path)
    return [s for group in found if group for s in group]


def gather(paths, metric):
    """The series of every file for the metric, each name unique."""
    per_file = [(path, [s for s in load(path) if s.metric == metric]) for path in paths]
    counts = {}
    for _, series in per_file:
        for s in series:
            counts[s.name] = counts.get(s.name, 0) + 1
    out = []
    for path, series in per_file:
        for s in series:
            if counts[s.name] > 1:
                s.name = "%s (%s)" % (s.name, os.path.basename(path))
            out.append(s)
    if not out:
        raise InputError("no %s results in %s" % (metric, ", ".join(paths)))
    return out


def select(series, names):
    if not names:
        return series
    by_name = {s.name: s for s in series}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise InputError("no series named %s; there are: %s" % (", ".join(repr(n) for n in missing),
                                                                ", ".join(sorted(by_name))))
    return [by_name[n] for n in names]


def draw(series, metric, title, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    for i, s in enumerate(series):
        sizes = sorted(s.points)
        # Ten colours, then the same colours dashed, dotted, ...: no two series look alike.
        line, = ax.plot(sizes, [s.points[x] for x in sizes], marker="o", markersize=4, label=s.name,
                        color="C%d" % (i % 10), linestyle=LINE_STYLES[i // 10 % len(LINE_STYLES)])
        banded = [x for x in sizes if x in s.band]
        if banded:
            ax.fill_between(banded, [s.band[x][0] for x in banded], [s.band[x][1] for x in banded],
                            color=line.get_color(), alpha=0.15, linewidth=0)
    sizes = sorted({x for s in series for x in s.points})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([format_size(x) for x in sizes])
    ax.set_xlabel("message size (bytes; K, M, G = 2^10, 2^20, 2^30)")
    if metric == "latency":
        ax.set_yscale("log")
        ax.set_ylabel("latency, us (median; band: min to p99)")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel("bandwidth, GB/s (10^9 B/s)")
    ax.set_title(title or ("Bandwidth" if metric == "bandwidth" else "Latency") + " against message size")
    ax.grid(True, which="major", alpha=0.3)
    if len(series) > 6:  # beside the axes, where it hides no line
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small", loc="best")
    try:
        fig.savefig(out, format="png", bbox_inches="tight")
    except OSError as e:
        raise InputError("cannot write %s: %s" % (out, e.strerror or e))
    finally:
        plt.close(fig)


def parse_args(argv):
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE.json", help="results of the benchmarks")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="the PNG to write")
    p.add_argument("--metric", choices=METRICS, default="bandwidth", help="what the y axis shows (default bandwidth)")
    p.add_argument("--title", help="the chart's title")
    p.add_argument("--series", nargs="+", metavar="NAME", help="draw only these series, in this order")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("%s: matplotlib is not installed (pip install matplotlib)" % PROG, file=sys.stderr)
        return 2
    try:
        series = select(gather(args.files, args.metric), args.series)
        draw(series, args.metric, args.title, args.output)
    except InputError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    print("%s: %d series -> %s" % (PROG, len(series), args.output), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
