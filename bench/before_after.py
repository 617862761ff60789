"""Before and after: ferry's figures from two builds measured in one invocation, compared row by row.

`bench/compare --baseline DIR` runs every ferry measurement with the build in DIR (before) and with
this tree's build (after), one right after the other, the order swapped every round, so drift of the
machine over the run (another program, the CPU's clock, the page cache) falls on both alike. Each
figure of each build is then the median of its rounds, and its spread the range of its rounds
(max - min). A row is

    "within spread"  when the medians differ by at most the larger of the two spreads,
    "better"/"worse" when they differ by more, by the row's direction (GB/s and Mmsg/s: higher is
                     better; us: lower is better).

That is the test a change of structure has to pass ("no row worse by more than its spread"). With
three rounds, two builds that are the same code still show a row "worse" about 3 times in 100 by
chance alone (six draws from one distribution), so a row that is worse once is measured again,
alone and with more rounds, before it is called a regression.

    import before_after
    rows = before_after.compare_rounds(before_rounds, after_rounds)
    print(before_after.table(rows))
"""

import statistics

from bench_cli import format_size

# The figures a row is judged by: its unit, and whether a higher value is better.
METRICS = {"bw_gbps": ("GB/s", True), "msg_rate_mpps": ("Mmsg/s", True), "lat_us": ("us", False),
           "call_us": ("call us", False)}


def metrics_of(name, fig):
    """What a `ferry bench` document is measured by: a latency run by its latency (and the post call's
    time when it took one), a message-rate run by its rate, a bandwidth run by its bandwidth. The
    other columns of its rows are the same measurement in other units."""
    if fig.get("mode") == "lat":
        return ("lat_us", "call_us")
    return ("msg_rate_mpps",) if name.endswith("_rate") else ("bw_gbps",)


def metric_value(row, key):
    v = row.get(key)
    if isinstance(v, dict):  # latency rows: {"median": ..., "p99": ...}
        v = v.get("median")
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def round_values(rounds, name):
    """{(size, metric key): [one value per round]} of one figure over the rounds."""
    values = {}
    for figs in rounds:
        fig = figs.get(name)
        if not isinstance(fig, dict):
            continue
        for row in fig.get("results", []):
            for key in metrics_of(name, fig):
                v = metric_value(row, key)
                if v is not None:
                    values.setdefault((row["size"], key), []).append(v)
    return values


def verdict(before, after, higher_is_better):
    """before, after: the rounds' values of one row. Returns (verdict, before median, after median,
    before spread, after spread)."""
    bm, am = statistics.median(before), statistics.median(after)
    bs, as_ = max(before) - min(before), max(after) - min(after)
    change = am - bm
    if abs(change) <= max(bs, as_):
        word = "within spread"
    else:
        word = "better" if (change > 0) == higher_is_better else "worse"
    return word, bm, am, bs, as_


def compare_rounds(before_rounds, after_rounds):
    """Every row both builds measured: dicts with figure, size, metric, unit, verdict, medians,
    spreads and the rounds' values, in the figures' order."""
    names = [n for n in dict.fromkeys(n for figs in after_rounds for n in figs)
             if any(n in figs for figs in before_rounds)]
    rows = []
    for name in names:
        before, after = round_values(before_rounds, name), round_values(after_rounds, name)
        for size, key in sorted(set(before) & set(after), key=lambda k: (k[1], k[0])):  # by metric, then size
            unit, higher = METRICS[key]
            word, bm, am, bs, as_ = verdict(before[(size, key)], after[(size, key)], higher)
            rows.append({"figure": name, "size": size, "metric": key, "unit": unit, "verdict": word,
                         "before": bm, "after": am, "before_spread": bs, "after_spread": as_,
                         "before_rounds": before[(size, key)], "after_rounds": after[(size, key)]})
    return rows


def _num(v):
    return ("%.0f" % v) if abs(v) >= 100 else ("%.3g" % v)


def table(rows, before_label="before", after_label="after"):
    """The rows as text: one line each, then the count of each verdict and the rows worse."""
    lines = ["Before (%s) and after (%s): medians of the rounds, spread = max - min of a build's rounds"
             % (before_label, after_label),
             "  %-34s %6s %9s %9s %8s %9s %9s  %s" % ("figure", "size", "before", "after", "after/b",
                                                       "spread b", "spread a", "verdict")]
    for r in rows:
        ratio = r["after"] / r["before"] if r["before"] else float("nan")
        lines.append("  %-34s %6s %9s %9s %8.3f %9s %9s  %s" % (
            "%s %s" % (r["figure"], r["unit"]), format_size(r["size"]), _num(r["before"]), _num(r["after"]), ratio,
            _num(r["before_spread"]), _num(r["after_spread"]), r["verdict"]))
    counts = {w: sum(1 for r in rows if r["verdict"] == w) for w in ("within spread", "better", "worse")}
    lines.append("  %d rows: %d within spread, %d better, %d worse" % (
        len(rows), counts["within spread"], counts["better"], counts["worse"]))
    for r in rows:
        if r["verdict"] == "worse":
            lines.append("  worse: %s %s at %s: %s -> %s (rounds %s -> %s)" % (
                r["figure"], r["unit"], format_size(r["size"]), _num(r["before"]), _num(r["after"]),
                ", ".join(_num(v) for v in r["before_rounds"]), ", ".join(_num(v) for v in r["after_rounds"])))
    return "\n".join(lines)
