"""bench/rxe-compare on the host, without the VM: bad options are refused before anything is
installed or built; a DLSlime that cannot be installed or imported is reported with the reason and
the run goes on with ferry alone; saved results print with the right ratios; and the verification
the VM run relies on passes on a software device and catches bytes placed wrongly.

    python -m pytest bench/tests/rxe_compare_test.py     # PYTHONPATH=<build>/python for the last tests
"""

import json
import os
import re
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO, "bench", "rxe-compare")
PEERS = os.path.join(REPO, "bench", "peers")


def run(args, timeout=120, env=None, cwd=None):
    return subprocess.run([sys.executable, DRIVER] + args, capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, message", [
    (["--sizes", "8,abc"], r"bad size 'abc': expected a number of bytes"),
    (["--sizes", "0"], r"bad size '0': sizes start at 1 byte"),
    (["--sizes", "128M"], r"bad size '128M': larger than 64M"),
    (["--sizes", "16MiB,4T"], r"bad size '4T': expected a number with an optional K, M or G suffix"),
    (["--lat-sizes", "4K,"], r"bad size '': expected a number of bytes"),
    (["--seconds", "0"], r"must be above 0"),
    (["--lat-iters", "ten"], r"'ten' is not a number"),
    (["--timeout", "-5"], r"must be above 0"),
    (["--no-such-option"], r"unrecognized arguments: --no-such-option"),
])
def test_bad_options_exit_2_before_doing_anything(tmp_path, args, message):
    build = tmp_path / "build"
    r = run(["--build-dir", str(build)] + args, timeout=30)
    assert r.returncode == 2, r.stderr
    assert re.search(message, r.stderr), r.stderr
    assert not build.exists(), "a bad option must not configure, build or install anything"


def fake_wheel(directory, body):
    """A wheel named dlslime whose __init__ is `body`: installs offline, then fails on import."""
    path = directory / "dlslime-0.0.1-py3-none-any.whl"
    files = {
        "dlslime/__init__.py": body,
        "dlslime-0.0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: dlslime\nVersion: 0.0.1\n",
        "dlslime-0.0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n",
    }
    record = "".join("%s,,\n" % name for name in files) + "dlslime-0.0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("dlslime-0.0.1.dist-info/RECORD", record)
    return path


def offline_env():
    return dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_DISABLE_PIP_VERSION_CHECK="1")


def check_went_on_with_ferry_alone(r, build, reason):
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if "DLSlime not measured: " in line]
    assert said, r.stderr
    assert re.search(reason, lines[said[0]]), lines[said[0]]
    went_on = [i for i, line in enumerate(lines) if "going on with ferry alone" in line]
    # The next step ran after the report: here it finds no VM scripts and stops, before building.
    vm = [i for i, line in enumerate(lines) if "FAILED: no rxe VM scripts in" in line]
    assert went_on and vm and said[0] < went_on[0] < vm[0], r.stderr
    assert not (build / "CMakeCache.txt").exists()


def test_dlslime_that_cannot_be_installed_is_reported_and_ferry_goes_on(tmp_path):
    missing = tmp_path / "nowhere" / "dlslime-0.1.23-cp311-cp311-manylinux_2_28_x86_64.whl"
    build = tmp_path / "build"
    r = run(["--build-dir", str(build), "--peer-venv", str(tmp_path / "pv"), "--dlslime", str(missing),
             "--rxevm-tools", str(tmp_path / "no-vm")], env=offline_env())
    check_went_on_with_ferry_alone(r, build, r"pip install .*nowhere.*failed: .*(does not exist|No such file)")


def test_dlslime_that_installs_but_does_not_import_is_reported(tmp_path):
    wheel = fake_wheel(tmp_path, "raise ImportError('libibverbs.so.1: cannot open shared object file')\n")
    build = tmp_path / "build"
    r = run(["--build-dir", str(build), "--peer-venv", str(tmp_path / "pv"), "--dlslime", str(wheel),
             "--rxevm-tools", str(tmp_path / "no-vm")], env=offline_env())
    check_went_on_with_ferry_alone(r, build, r"dlslime installed but does not import: .*libibverbs\.so\.1")
    # Installed into the venv it was given, not into the interpreter running the driver.
    assert list((tmp_path / "pv").glob("lib/python*/site-packages/dlslime/__init__.py"))


def saved_run(ferry, dlslime):
    return {"rxe_compare": 1, "peers": {"ferry": ferry, "dlslime": dlslime}}


def measured(name, write, read, lat_write):
    return {"peer": name, "library": name + " 1.0", "device": "rxe0",
            "verified": [{"op": op, "size": s, "transfers": 1} for s in (8, 4096) for op in ("write", "read")],
            "results": [{"size": 4096, "per_call": 256, "write_gbps": write, "read_gbps": read}],
            "latency": [{"op": "write", "size": 8, "iterations": 10,
                         "us": {"min": 1, "median": lat_write, "p99": 2 * lat_write, "avg": lat_write}}]}


def report(tmp_path, doc):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    return run(["--report", str(path)], timeout=30)


def test_report_divides_ferry_by_dlslime(tmp_path):
    r = report(tmp_path, saved_run(measured("ferry", 0.02, 0.01, 50.0), measured("dlslime", 0.01, 0.04, 200.0)))
    assert r.returncode == 0, r.stderr
    assert "ferry (ferry 1.0): WRITE and READ verified byte for byte at 8, 4K bytes" in r.stdout
    row = next(line.split() for line in r.stdout.splitlines() if line.strip().startswith("4K"))
    assert row == ["4K", "0.02", "0.01", "2.00", "0.01", "0.04", "0.25"], r.stdout
    lat = next(line.split() for line in r.stdout.splitlines() if line.strip().startswith("WRITE"))
    assert lat == ["WRITE", "8", "50", "/", "100", "200", "/", "400", "0.25"], r.stdout


def test_report_without_dlslime_gives_its_reason_and_no_ratio(tmp_path):
    reason = "pip install dlslime==0.1.23 failed: No matching distribution found for dlslime==0.1.23"
    r = report(tmp_path, saved_run(measured("ferry", 0.02, 0.01, 50.0), {"peer": "dlslime", "error": reason}))
    assert r.returncode == 0, r.stderr
    assert "DLSlime: not measured: " + reason in r.stdout
    row = next(line.split() for line in r.stdout.splitlines() if line.strip().startswith("4K"))
    assert row == ["4K", "0.02", "-", "-", "0.01", "-", "-"], r.stdout


def test_report_of_a_broken_file_fails_with_the_reason(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    r = run(["--report", str(path)], timeout=30)
    assert r.returncode == 1
    assert "cannot report" in r.stderr and "JSONDecodeError" in r.stderr


# ---- the peers' verification, on ferry's software device (needs PYTHONPATH=<build>/python) ----

def ferry_importable():
    r = subprocess.run([sys.executable, "-c", "import ferry; ferry.RDMAEndpoint"], capture_output=True)
    return r.returncode == 0


needs_ferry = pytest.mark.skipif(not ferry_importable(),
                                 reason="ferry is not importable (set PYTHONPATH=<build>/python)")


def run_peer(script):
    env = dict(os.environ, FERRY_DEVICES="soft_lo")
    r = subprocess.run([sys.executable, script, "--device", "soft_lo", "--link-type", "tcp",
                        "--sizes", "8,4096,1048576", "--lat-sizes", "8", "--seconds", "0.05", "--lat-iters", "5"],
                       capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    lines = [line for line in r.stdout.splitlines() if line.startswith("FERRY_PEER ")]
    assert len(lines) == 1, r.stdout + r.stderr
    return r.returncode, json.loads(lines[0][len("FERRY_PEER "):])


@needs_ferry
def test_ferry_peer_verifies_and_times_on_soft_lo():
    code, out = run_peer(os.path.join(PEERS, "ferry_endpoint_peer.py"))
    assert code == 0 and "error" not in out, out
    assert [(v["op"], v["size"], v["transfers"]) for v in out["verified"]] == [
        ("write", 8, 1024), ("read", 8, 1024), ("write", 4096, 256), ("read", 4096, 256),
        ("write", 1048576, 1), ("read", 1048576, 1)]
    assert [row["size"] for row in out["results"]] == [8, 4096, 1048576]
    assert all(row["write_gbps"] > 0 and row["read_gbps"] > 0 and row["write_calls"] >= 3 for row in out["results"])
    assert [(x["op"], x["size"]) for x in out["latency"]] == [("write", 8), ("read", 8)]


@needs_ferry
def test_verification_catches_offsets_taken_the_wrong_way_round(tmp_path):
    # ferry with DLSlime's tuple order: its READs land at the remote offset, so the check must fail.
    script = tmp_path / "swapped_peer.py"
    script.write_text(
        "import sys\n"
        "sys.path.insert(0, %r)\n"
        "import endpoint_peer, ferry_endpoint_peer as f, dlslime_peer as d\n"
        "lib = endpoint_peer.Library('ferry', 'ferry', f.make_endpoint, d.assignment, f.version)\n"
        "sys.exit(endpoint_peer.main(lib, __file__))\n" % PEERS)
    code, out = run_peer(str(script))
    assert code == 1
    assert out["error"].startswith("AssertionError: READ of 1024 x 8 bytes: local byte 64 is 0xa5"), out
