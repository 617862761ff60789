"""bench/compare's rounds: every figure of several rounds merged into its median, and a --rounds
outside 1..100 refused before anything is measured; iperf3 pairs run at once summed; the NIXL-API
program's tables, and its driver on ferry.nixl run for real (with FERRY_BIN, the build's ferry).

    python -m pytest bench/tests/compare_test.py
"""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(BENCH, "compare")


def load_compare():
    loader = importlib.machinery.SourceFileLoader("bench_compare", COMPARE)
    spec = importlib.util.spec_from_loader("bench_compare", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


compare = load_compare()


def lat_row(size, median, iterations):
    return {"size": size, "lat_us": {"median": median, "p99": median * 3}, "iterations": iterations}


def test_numbers_are_the_median_of_their_rounds_and_sizes_stay_as_they_were():
    rounds = [
        {"ferry_default_send_lat": {"results": [lat_row(8, 1.2, 5000), lat_row(4096, 3.0, 4000)], "tool": "ferry"}},
        {"ferry_default_send_lat": {"results": [lat_row(8, 0.9, 5001), lat_row(4096, 9.0, 4002)], "tool": "ferry"}},
        {"ferry_default_send_lat": {"results": [lat_row(8, 1.0, 4999), lat_row(4096, 3.5, 4001)], "tool": "ferry"}},
    ]
    merged = compare.merge_rounds(rounds)["ferry_default_send_lat"]
    assert merged["tool"] == "ferry"
    rows = merged["results"]
    assert [r["size"] for r in rows] == [8, 4096]
    assert [r["lat_us"]["median"] for r in rows] == [1.0, 3.5]
    assert [r["lat_us"]["p99"] for r in rows] == [3.0, 10.5]
    assert [r["iterations"] for r in rows] == [5000, 4001]
    assert all(isinstance(r["iterations"], int) and isinstance(r["size"], int) for r in rows)


def test_a_figure_or_size_one_round_lacks_is_the_median_of_the_rounds_that_have_it():
    rounds = [
        {"iperf3": [{"size": 8, "gbps": 1.0}, {"size": 1024, "gbps": 4.0}], "sockperf": [{"size": 8, "median_us": 20.0}]},
        {"iperf3": [{"size": 8, "gbps": 3.0}]},
    ]
    merged = compare.merge_rounds(rounds)
    assert merged["iperf3"] == [{"size": 8, "gbps": 2.0}, {"size": 1024, "gbps": 4.0}]
    assert merged["sockperf"] == [{"size": 8, "median_us": 20.0}]
    # Two rounds of whole numbers: the lower median, still whole.
    assert compare.median_merge([3, 8]) == 3
    assert compare.median_merge([None, None]) is None
    assert compare.median_merge([True, False]) is True


def run(*args):
    return subprocess.run([sys.executable, COMPARE, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_rounds_are_in_the_settings_and_out_of_range_is_refused():
    r = run("--rounds", "3", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rounds"] == 3
    for bad in ("0", "101", "-2"):
        r = run("--rounds", bad, "--dry-run")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines()[-1] == "bench/compare: error: --rounds must be 1..100, not %s" % bad
        assert r.stdout == ""
    r = run("--rounds", "two", "--dry-run")
    assert r.returncode == 2 and "--rounds" in r.stderr and "Traceback" not in r.stderr, r.stderr


def iperf3_doc(bits_per_second, sender_cpu, receiver_cpu):
    return {"end": {"sum_received": {"bits_per_second": bits_per_second},
                    "cpu_utilization_percent": {"host_total": sender_cpu, "remote_total": receiver_cpu}}}


def test_iperf3_pairs_at_once_are_summed_and_one_stream_keeps_its_cpu_figures():
    one = compare.iperf3_row(1 << 20, 1 << 20, [iperf3_doc(24e9, 90.0, 70.0)])
    assert one == {"size": 1 << 20, "block": 1 << 20, "gbps": 3.0, "cpu_sender_percent": 90.0,
                   "cpu_receiver_percent": 70.0}
    two = compare.iperf3_row(16 << 20, 1 << 20, [iperf3_doc(24e9, 90.0, 70.0), iperf3_doc(16e9, 80.0, 60.0)])
    assert two == {"size": 16 << 20, "block": 1 << 20, "gbps": 5.0, "pairs": 2}


def test_the_machine_busy_share_and_what_a_whole_machine_would_move():
    assert compare.busy_percent((100, 400), (250, 600)) == 75.0
    assert compare.busy_percent(None, (250, 600)) is None
    assert compare.busy_percent((100, 400), (100, 400)) is None  # shorter than a clock tick
    busy, total = compare.machine_cpu()
    assert 0 <= busy <= total and total > 0
    # GB/s over the busy share; a size with no share is left out.
    assert compare.per_machine({1: 6.0, 2: 3.0}, {1: 75.0}) == {1: 8.0}
    row = compare.iperf3_row(1 << 20, 1 << 20, [iperf3_doc(48e9, 90.0, 70.0)], busy=80.0)
    assert row["machine_busy_percent"] == 80.0 and row["gbps"] == 6.0


def api_rows(write, read):
    return {"results": [{"size": 4096, "descs": 1, "write_gbps": write, "read_gbps": read},
                        {"size": 8, "descs": 1, "write_gbps": 9.0, "read_gbps": 9.0}]}


def test_the_nixl_api_tables_set_ferry_nixl_against_nixl_on_each_path():
    figs = {"ferry_nixl_tcp_1": api_rows(2.0, 3.0), "nixl_api_tcp_1": api_rows(0.5, 1.5),
            "ferry_nixl_shm_128": api_rows(8.0, 6.0)}  # no NIXL figure for shm: no ratio, no error
    tcp, shm = compare.nixl_api_tables(figs, [8, 4096])
    assert tcp.startswith("NIXL-API program") and "TCP path" in tcp and "same host" in shm
    row = [line.split() for line in tcp.splitlines() if line.strip().startswith("4K")][0]
    # size, wr1, /nixl, rd1, /nixl, wr128, /nixl, rd128, /nixl
    assert [float(v) for v in row[1:5]] == [2.0, 4.0, 3.0, 2.0], row
    assert not any(line.strip().startswith("8 ") for line in tcp.splitlines()), "8 B is below the program's sizes"
    shm_row = [line.split() for line in shm.splitlines() if line.strip().startswith("4K")][0]
    assert float(shm_row[5]) == 8.0 and shm_row[6] == "-", shm_row


def test_the_nixl_api_program_runs_unchanged_on_ferry_nixl():
    """bench/peers/nixl_peer.py through ferry_nixl_peer.py, as bench/compare runs it (a short run)."""
    ferry_bin = os.environ.get("FERRY_BIN")
    if not ferry_bin:
        import pytest
        pytest.skip("FERRY_BIN (the build's ferry program) is not set")
    for same_host in ("0", None):
        doc, why = compare.ferry_nixl_peer(ferry_bin, [4096, 1 << 20], 0.05, 128, same_host)
        assert why is None, why
        assert doc["peer"] == "ferry.nixl", doc
        assert ("tcp path" in doc["transport"]) == (same_host == "0"), doc["transport"]
        assert [r["size"] for r in doc["results"]] == [4096, 1 << 20], doc
        for r in doc["results"]:
            assert r["descs"] == 128 and r["write_gbps"] > 0 and r["read_gbps"] > 0, r
    doc, why = compare.ferry_nixl_peer("/nonexistent/ferry", [4096], 0.05, 1, None)
    assert doc is None and "no ferry Python package" in why, why


# ---- --baseline: before and after in one invocation ----

def bench_doc(mode, rows):
    return {"mode": mode, "results": rows}


def bw_row(size, gbps):
    return {"size": size, "bw_gbps": gbps, "msg_rate_mpps": gbps * 1e3 / size, "lat_us": {"median": 1.0}}


def test_a_row_is_judged_by_its_own_figure_against_the_larger_spread():
    before = [{"ferry_x_write_bw": bench_doc("bw", [bw_row(4096, g)]),
               "ferry_x_write_lat": bench_doc("lat", [lat_row(8, l, 100)])}
              for g, l in ((10.0, 1.00), (10.2, 1.01), (9.9, 1.02))]
    after = [{"ferry_x_write_bw": bench_doc("bw", [bw_row(4096, g)]),
              "ferry_x_write_lat": bench_doc("lat", [lat_row(8, l, 100)])}
             for g, l in ((9.0, 1.10), (9.1, 1.11), (8.9, 1.09))]
    rows = compare.before_after.compare_rounds(before, after)
    # A bandwidth run by its bandwidth only, a latency run by its median latency only.
    assert [(r["figure"], r["metric"]) for r in rows] == [("ferry_x_write_bw", "bw_gbps"),
                                                            ("ferry_x_write_lat", "lat_us")]
    bw, lat = rows
    assert (bw["before"], bw["after"]) == (10.0, 9.0)
    assert abs(bw["before_spread"] - 0.3) < 1e-9 and abs(bw["after_spread"] - 0.2) < 1e-9
    assert bw["verdict"] == "worse" and lat["verdict"] == "worse"  # lower bandwidth, higher latency
    # The same change inside a wide spread is within it; the other way is better.
    wide = [{"ferry_x_write_bw": bench_doc("bw", [bw_row(4096, g)])} for g in (8.0, 10.0, 12.0)]
    assert compare.before_after.compare_rounds(wide, after)[0]["verdict"] == "within spread"
    assert compare.before_after.compare_rounds(after, before)[0]["verdict"] == "better"
    text = compare.before_after.table(rows, "old", "new")
    assert "2 rows: 0 within spread, 0 better, 2 worse" in text
    assert "worse: ferry_x_write_bw GB/s at 4K: 10 -> 9 (rounds 10, 10.2, 9.9 -> 9, 9.1, 8.9)" in text


def test_a_message_rate_run_is_judged_by_its_rate_and_rows_one_side_lacks_are_left_out():
    before = [{"ferry_x_rate": bench_doc("bw", [bw_row(64, 0.1)]), "ferry_only_before": bench_doc("bw", [])}]
    after = [{"ferry_x_rate": bench_doc("bw", [bw_row(64, 0.1)]),
              "ferry_only_after": bench_doc("bw", [bw_row(8, 1.0)])}]
    rows = compare.before_after.compare_rounds(before, after)
    assert [(r["figure"], r["metric"], r["verdict"]) for r in rows] == [("ferry_x_rate", "msg_rate_mpps",
                                                                          "within spread")]


def test_a_baseline_that_is_no_configured_build_is_refused_before_anything_is_measured(tmp_path):
    r = run("--baseline", str(tmp_path), "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (
        "bench/compare: error: --baseline %s is not a configured build directory (cmake -S <its tree> -B %s)"
        % (tmp_path, tmp_path))
    (tmp_path / "build.ninja").write_text("")
    r = run("--baseline", str(tmp_path), "--skip", "ferry", "--dry-run")
    assert r.returncode == 2
    assert r.stderr.strip().endswith("--baseline compares ferry's rows, which --skip ferry leaves out")
    r = run("--baseline", str(tmp_path), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["baseline"] == str(tmp_path)
