"""bench/plot.py draws every format the benchmarks write (fixtures from real runs in data/) into a
PNG of the expected size, several series on one chart; bad input ends with one line on stderr and
exit code 2, never a traceback.

    python -m pytest bench/tests/plot_test.py      # needs matplotlib (requirements-dev.txt)
"""

import os
import re
import struct
import subprocess
import sys
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.join(os.path.dirname(HERE), "plot.py")
DATA = os.path.join(HERE, "data")

pytest.importorskip("matplotlib", reason="bench/plot.py draws with matplotlib (pip install matplotlib)")
sys.path.insert(0, os.path.dirname(HERE))
import plot  # noqa: E402


def run(*args, python=sys.executable, prelude=None):
    cmd = [python, PLOT, *args] if prelude is None else [
        python, "-c", prelude + "; import runpy, sys; sys.argv = %r; runpy.run_path(%r, run_name='__main__')"
        % ([PLOT, *args], PLOT)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def data(name):
    return os.path.join(DATA, name)


def png_size(path):
    """(width, height) of a PNG, after checking its signature, its IHDR and every chunk's CRC."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature: %r" % blob[:8]
    at, chunks = 8, []
    while at < len(blob):
        length, kind = struct.unpack(">I4s", blob[at:at + 8])
        body = blob[at + 8:at + 8 + length]
        crc, = struct.unpack(">I", blob[at + 8 + length:at + 12 + length])
        assert zlib.crc32(kind + body) == crc, "bad CRC in chunk %r" % kind
        chunks.append((kind, body))
        at += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND", [k for k, _ in chunks]
    width, height = struct.unpack(">II", chunks[0][1][:8])
    try:
        from PIL import Image
    except ImportError:
        return width, height
    with Image.open(path) as img:
        img.load()  # decodes every row
        assert img.size == (width, height)
    return width, height


def colours(path):
    """Distinct colours of the image (PIL), or None without PIL."""
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(path) as img:
        return len(img.convert("RGB").getcolors(maxcolors=1 << 24))


def assert_drawn(r, out, series):
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "%d series" % series in r.stderr, r.stderr
    width, height = png_size(out)
    assert 600 <= width <= 2000 and 400 <= height <= 1200, (width, height)
    n = colours(out)
    assert n is None or n > 10 + series, "%s colours: an empty chart?" % n


# Every format, with the series it must hold (the names are what --series takes).
FORMATS = [
    ("ferry-bench-write-bw.json", "bandwidth", {"ferry write"}),
    ("ferry-bench-write-lat.json", "latency", {"ferry write"}),
    ("ferry-bench-endpoint-lat.json", "latency", {"ferry endpoint write"}),
    ("compare.json", "bandwidth", {"memcpy", "cma write", "cma read", "iperf3", "ucx_tcp put", "ucx_tcp get",
                                   "ucx_shm put", "ucx_shm get", "ferry_tcp_write_bw", "ferry_tcp_read_bw",
                                   "ferry_default_write_bw", "ferry_default_read_bw", "ferry_ring_write_bw",
                                   "ferry_ring_read_bw", "ferry_default_write_bw2", "ferry_default_read_bw2"}),
    ("compare.json", "latency", {"sockperf", "ucx_tcp put", "ucx_shm put", "ferry_tcp_write_lat",
                                 "ferry_tcp_send_lat", "ferry_default_write_lat", "ferry_default_send_lat"}),
    ("endpoint-overhead.json", "latency", {"c++ write lat batch 1", "python tuple write lat batch 1",
                                           "c++ read lat batch 16", "python tuple read lat batch 16"}),
    ("connect-bench.json", "bandwidth", {"connector", "endpoint"}),
    ("memcpy-bench.json", "bandwidth", {"memcpy"}),
    ("ferry-endpoint-peer.out", "bandwidth", {"ferry write", "ferry read"}),
    ("rxe-compare.json", "latency", {"ferry write", "ferry read"}),
]


@pytest.mark.parametrize("name, metric, expected", FORMATS, ids=["%s-%s" % (f[0], f[1]) for f in FORMATS])
def test_each_format_is_read_and_drawn(tmp_path, name, metric, expected):
    series = plot.gather([data(name)], metric)
    names = {s.name for s in series}
    assert expected <= names, sorted(names)
    for s in series:
        assert s.points and all(size >= 1 and value > 0 for size, value in s.points.items()), (s.name, s.points)
    out = tmp_path / "chart.png"
    assert_drawn(run(data(name), "-o", str(out), "--metric", metric), out, len(series))


def test_figures_come_from_the_right_fields():
    """A wrong key would still draw a line; these values are the fixtures' own."""
    bw = {s.name: s for s in plot.gather([data("ferry-bench-write-bw.json")], "bandwidth")}["ferry write"]
    assert bw.points[1 << 20] == pytest.approx(11.058413297566501)
    lat = {s.name: s for s in plot.gather([data("ferry-bench-write-lat.json")], "latency")}["ferry write"]
    assert lat.points[8] == pytest.approx(5.04225) and lat.band[8] == pytest.approx((4.517, 9.704))
    cmp = {s.name: s for s in plot.gather([data("compare.json")], "bandwidth")}
    assert cmp["memcpy"].points[4096] == pytest.approx(35.24141)
    assert cmp["cma read"].points[4096] == pytest.approx(1.76139)
    assert sorted(cmp["ferry_tcp_write_bw"].points) == [4096, 65536, 1 << 20]
    assert not any(name.endswith("_rate") for name in cmp), "a message-rate point is not a size sweep"


def test_several_files_one_chart_with_chosen_series(tmp_path):
    out = tmp_path / "both.png"
    r = run(data("ferry-bench-write-bw.json"), data("ferry-bench-read-bw.json"), data("compare.json"),
            "-o", str(out), "--title", "WRITE and READ", "--series", "ferry write", "ferry read", "memcpy")
    assert_drawn(r, out, 3)


def test_a_name_two_files_give_is_told_apart():
    series = plot.gather([data("ferry-bench-write-bw.json"), data("ferry-bench-write-bw.json")], "bandwidth")
    assert [s.name for s in series] == ["ferry write (ferry-bench-write-bw.json)"] * 2


def test_latency_axis_and_sizes(tmp_path):
    out = tmp_path / "lat.png"
    assert_drawn(run(data("ferry-bench-write-lat.json"), data("ferry-bench-endpoint-lat.json"), "-o", str(out),
                     "--metric", "latency"), out, 2)


def bad(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", ["missing", "directory", "not-json", "binary", "empty", "json-list",
                                  "unknown-json", "no-latency", "unknown-metric", "unknown-series",
                                  "unwritable", "no-output", "unknown-option", "no-files"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    ok = data("ferry-bench-write-bw.json")
    out = str(tmp_path / "x.png")
    args, expect = {
        "missing": ([str(tmp_path / "nope.json"), "-o", out], "cannot read .*nope.json: No such file"),
        "directory": ([str(tmp_path), "-o", out], "cannot read"),
        "not-json": ([bad(tmp_path, "t.json", "size,gbps\n8,1\n"), "-o", out], "is not JSON"),
        "binary": ([bad(tmp_path, "b.json", "\x89PNG"), "-o", out], "is not JSON|cannot read"),
        "empty": ([bad(tmp_path, "e.json", ""), "-o", out], "is not JSON"),
        "json-list": ([bad(tmp_path, "l.json", "[1, 2]"), "-o", out], "no benchmark results this program knows"),
        "unknown-json": ([bad(tmp_path, "u.json", '{"results": 3}'), "-o", out], "no benchmark results"),
        "no-latency": ([ok, "-o", out, "--metric", "latency"], "no latency results in"),
        "unknown-metric": ([ok, "-o", out, "--metric", "speed"], "invalid choice: 'speed'"),
        "unknown-series": ([ok, "-o", out, "--series", "nixl"], "no series named 'nixl'; there are: ferry write"),
        "unwritable": ([ok, "-o", str(tmp_path / "no" / "dir" / "x.png")], "cannot write"),
        "no-output": ([ok], "required: -o/--output"),
        "unknown-option": ([ok, "-o", out, "--colour"], "unrecognized arguments: --colour"),
        "no-files": (["-o", out], "required: FILE.json"),
    }[case]
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench/plot.py: "), r.stderr
    assert "Traceback" not in r.stderr
    assert re.search(expect, lines[0]), lines[0]
    assert not os.path.exists(out)


def test_without_matplotlib_one_line_and_exit_2(tmp_path):
    out = tmp_path / "x.png"
    r = run(data("ferry-bench-write-bw.json"), "-o", str(out), prelude="import sys; sys.modules['matplotlib'] = None")
    assert r.returncode == 2, r.stderr
    assert r.stderr == "bench/plot.py: matplotlib is not installed (pip install matplotlib)\n"
    assert not out.exists()


def test_help_needs_no_input():
    r = run("--help")
    assert r.returncode == 0 and "--metric" in r.stdout and "bench/compare" in r.stdout, r.stderr
