"""One size syntax for every command-line program under bench/: bench_cli.parse_size answers as
`ferry bench --size` does (with FERRY_BIN set, the two are asked the same questions), each program
takes "16M" where it takes sizes, and bad input ends with one line naming the program and exit
code 2, never a traceback. Programs run with --dry-run (their settings, nothing measured).

    FERRY_BIN=build/ferry python -m pytest bench/tests/sizes_test.py
"""

import json
import os
import re
import subprocess
import sys

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)
import bench_cli  # noqa: E402
from bench_cli import SizeError, parse_size, parse_sizes  # noqa: E402

K, M, G = 1 << 10, 1 << 20, 1 << 30

ACCEPTED = [("8", 8), ("4096", 4096), ("4K", 4 * K), ("4k", 4 * K), ("4KB", 4 * K), ("4KiB", 4 * K),
            ("4Kb", 4 * K), ("16M", 16 * M), ("16m", 16 * M), ("16MiB", 16 * M), ("1G", G), ("1GB", G),
            ("1gib", None), ("8B", 8), ("0004K", 4 * K), ("1024M", G), ("1073741824", G)]
REFUSED = [("", "expected a number of bytes such as 4096, 4K or 1M"),
           ("K", "expected a number of bytes such as 4096, 4K or 1M"),
           (" 4K", "expected a number of bytes such as 4096, 4K or 1M"),
           ("-4", "expected a number of bytes such as 4096, 4K or 1M"),
           ("+4", "expected a number of bytes such as 4096, 4K or 1M"),
           ("4K ", "expected a number with an optional K, M or G suffix"),
           ("4b", "expected a number with an optional K, M or G suffix"),
           ("4iB", "expected a number with an optional K, M or G suffix"),
           ("4.5K", "expected a number with an optional K, M or G suffix"),
           ("4T", "expected a number with an optional K, M or G suffix"),
           ("4KK", "expected a number with an optional K, M or G suffix"),
           ("4kib", "expected a number with an optional K, M or G suffix"),
           ("0x10", "expected a number with an optional K, M or G suffix"),
           ("0", "sizes start at 1 byte"), ("0K", "sizes start at 1 byte"),
           ("2G", "larger than 1G, the largest message ferry bench moves"),
           ("1025M", "larger than 1G, the largest message ferry bench moves"),
           ("1073741825", "larger than 1G, the largest message ferry bench moves"),
           ("99999999999999999999", "too large")]


@pytest.mark.parametrize("text, value", [a for a in ACCEPTED if a[1] is not None])
def test_accepted(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text, why", REFUSED + [("1gib", "expected a number with an optional K, M or G suffix")])
def test_refused_with_ferry_bench_message(text, why):
    with pytest.raises(SizeError) as e:
        parse_size(text)
    assert str(e.value) == "bad size '%s': %s" % (text, why)


def test_a_count_of_units_past_64_bits_is_too_large():
    with pytest.raises(SizeError, match=r"^bad size '20000000000G': too large$"):
        parse_size("20000000000G")


def test_lists_and_a_smaller_limit():
    assert parse_sizes("16M,4K,8,4k") == [8, 4 * K, 16 * M]  # sorted, each once, as ferry bench runs them
    with pytest.raises(SizeError, match=r"^bad size '': expected a number of bytes"):
        parse_sizes("4K,,8")
    with pytest.raises(SizeError, match=r"^bad size '128M': larger than 64M, the largest message here$"):
        parse_sizes("8,128M", largest=64 * M)
    assert parse_sizes("64M", largest=64 * M) == [64 * M]
    assert [bench_cli.format_size(n) for n in (8, 1536, 4 * K, 16 * M, G)] == ["8", "1536", "4K", "16M", "1G"]


def ferry_answer(ferry, text):
    """What `ferry bench` says of one size: None when it takes it, else the reason after the quote."""
    r = subprocess.run([ferry, "bench", "--server", "--server-device", "x", "--size", text], capture_output=True,
                       text=True, timeout=20, stdin=subprocess.DEVNULL)
    first = r.stderr.splitlines()[0] if r.stderr else ""
    m = re.match(r"ferry bench: bad size '.*': (.*?)(?: \(ferry bench --help lists every option\))?$", first)
    if m:
        return m.group(1)
    assert "--server-device is for --local" in first, "ferry bench said %r of %r" % (first, text)
    return None


@pytest.mark.skipif(not os.access(os.environ.get("FERRY_BIN", ""), os.X_OK),
                    reason="FERRY_BIN (the ferry binary) is not set: the C++ parser cannot be asked")
def test_same_answers_as_ferry_bench():
    ferry = os.environ["FERRY_BIN"]
    differ = []
    for text in [t for t, _ in ACCEPTED] + [t for t, _ in REFUSED]:
        try:
            ours = parse_size(text) and None
        except SizeError as e:
            ours = str(e).split("': ", 1)[1]
        theirs = ferry_answer(ferry, text)
        if ours != theirs:
            differ.append((text, ours, theirs))
    assert not differ, "(size, bench_cli, ferry bench): %s" % differ


def run(program, *args):
    path = os.path.join(BENCH, program)
    r = subprocess.run([sys.executable, path, *args], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert "Traceback" not in r.stderr, r.stderr
    return r


# (program, the option that takes a list of sizes, the largest size it takes)
PROGRAMS = [("compare", "--sizes", G), ("rxe-compare", "--sizes", 64 * M), ("rxe-compare", "--lat-sizes", 64 * M),
            ("endpoint-overhead", "--sizes", G), ("connect_bench.py", "--sizes", G),
            ("peers/mooncake_peer.py", "--sizes", G), ("peers/nixl_peer.py", "--sizes", G),
            ("peers/ferry_endpoint_peer.py", "--sizes", G), ("peers/ferry_endpoint_peer.py", "--lat-sizes", G),
            ("peers/dlslime_peer.py", "--sizes", G)]
IDS = ["%s %s" % (p, o) for p, o, _ in PROGRAMS]


@pytest.mark.parametrize("program, option, largest", PROGRAMS, ids=IDS)
def test_takes_ferry_bench_sizes(program, option, largest):
    r = run(program, option, "16M,4K,8,16MiB", "--dry-run")
    assert r.returncode == 0, r.stderr
    settings = json.loads(r.stdout)
    assert settings[option[2:].replace("-", "_")] == [8, 4 * K, 16 * M], settings
    r = run(program, option, bench_cli.format_size(largest), "--dry-run")
    assert r.returncode == 0 and largest in json.loads(r.stdout)[option[2:].replace("-", "_")], r.stderr


def one_line_exit_2(r, program, pattern):
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bench/%s: error: " % program), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("program, option, largest", PROGRAMS, ids=IDS)
@pytest.mark.parametrize("text, pattern", [
    ("16X", r"argument --[a-z-]+: bad size '16X': expected a number with an optional K, M or G suffix$"),
    ("4K,0", r"bad size '0': sizes start at 1 byte$"),
    ("4K,,8", r"bad size '': expected a number of bytes"),
    ("1.5M", r"bad size '1.5M'"),
    ("BIG", r"bad size 'BIG'"),
])
def test_bad_sizes(program, option, largest, text, pattern):
    one_line_exit_2(run(program, option, text, "--dry-run"), program, pattern)


@pytest.mark.parametrize("program, option, largest", PROGRAMS, ids=IDS)
def test_too_large(program, option, largest):
    text = bench_cli.format_size(2 * largest)
    one_line_exit_2(run(program, option, text, "--dry-run"), program,
                    r"bad size '%s': larger than %s" % (text, bench_cli.format_size(largest)))


@pytest.mark.parametrize("program", sorted({p for p, _, _ in PROGRAMS}))
@pytest.mark.parametrize("args, pattern", [
    (["--no-such-option"], r"unrecognized arguments: --no-such-option"),
    (["--seconds", "fast"], r"argument --seconds: .*'fast'"),
    (["--seconds", "0"], r"--seconds:? must be above 0, not 0"),
])
def test_bad_options(program, args, pattern):
    if program == "connect_bench.py" and args[0] == "--seconds":
        args, pattern = ["--rounds", "0" if args[1] == "0" else "fast"], r"--rounds"
    one_line_exit_2(run(program, *args, "--dry-run"), program, pattern)


def test_endpoint_client_takes_the_same_sizes():
    """endpoint_client.py has no dry run: 16M x 128 is refused as more than 1G, so 16M was 16 MiB."""
    r = run("endpoint_client.py", "--local", "--size", "8,16M", "--batch", "128")
    assert r.returncode == 2 and "16777216 x 128 is more" in r.stderr, r.stderr
    for text, why in (("16X", "expected a number with an optional K, M or G suffix"), ("0", "sizes start at 1")):
        r = run("endpoint_client.py", "--local", "--size", text)
        assert r.returncode == 2 and r.stderr == "endpoint_client: bad size '%s': %s" % (text, why) + \
            ("\n" if text == "16X" else " byte\n"), r.stderr
    r = run("endpoint_client.py", "--local", "--no-such-option")
    assert r.returncode == 2 and r.stderr == "endpoint_client: unrecognized arguments: --no-such-option\n", r.stderr
