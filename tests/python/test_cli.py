"""The `ferry` program's surface a script relies on: --version, `info --json`, `info --config`
(text and JSON), and FERRY_* variables: one table, read in one place, a bad value refused with
exit code 2 and a line naming the variable. ferry.config() / ferry.check_config() from Python.
`info --peer` answers first and checks its store before printing; `ferry objects` says which of
bucket and object is missing and when no server answers, and puts FILE under its own name; every
command's help has the same shape, and every bad command line is one line and exit code 2.
Servers (`ferry store`, `ferry objects serve`) run here on loopback."""

import json
import os
import re
import socket
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
    assert soft_lo[0]["cuda_memory"] == "staged"  # how the software devices move CUDA memory
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


# ---- servers on loopback ----

def free_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`ferry ARGS` serving on loopback port 0 until stopped; `url` from its first line."""

    def __init__(self, *args, pattern):
        self.proc = subprocess.Popen([FERRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, FERRY_LOG_LEVEL="error"))
        line = self.proc.stdout.readline()
        m = re.search(pattern, line)
        assert m, line + self.proc.stderr.read()
        self.url = m.group(1)

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def discovery_store():
    d = Daemon("store", "--host", "127.0.0.1", "--port", "0", pattern=r"listening on (127\.0\.0\.1:\d+)")
    d.url = "ferry://" + d.url
    yield d
    d.stop()


@pytest.fixture
def object_store():
    d = Daemon("objects", "serve", "--host", "127.0.0.1", "--port", "0", pattern=r"serving (http://\S+)")
    yield d
    d.stop()


def one_line_error(r, code):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "", r.stdout
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("ferry"), r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr.strip()


# ---- ferry info --peer ----

LANE = re.compile(r"  lane (messages|rma|atomics) ")


def test_info_peer_answers_first_and_lists_devices_only_with_devices(discovery_store):
    env = {"FERRY_DEVICES": "soft_lo"}
    with ferry.start_peer_agent(store=discovery_store.url, alias="seen", device="soft_lo"):
        r = run("info", "--peer", "seen", "--store", discovery_store.url, env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "peer 'seen' in %s:" % discovery_store.url, r.stdout
        lanes = [i for i, l in enumerate(lines) if LANE.match(l)]
        assert len(lanes) == 3 and lanes == list(range(2, 5)), r.stdout
        assert "providers:" not in lines and not any(l.startswith("hca_id:") for l in lines), r.stdout
        assert lines.index("agent:") > lanes[-1]

        r = run("info", "--peer", "seen", "--store", discovery_store.url, "--devices", env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("peer 'seen' in ")
        last_lane = max(i for i, l in enumerate(lines) if LANE.match(l))
        assert lines.index("providers:") > last_lane and lines.index("hca_id: soft_lo") > last_lane, r.stdout


def test_info_checks_every_argument_before_printing(discovery_store):
    down = "ferry://127.0.0.1:%d" % free_port()
    assert "no agent 'nobody'" in one_line_error(run("info", "--peer", "nobody", "--store", discovery_store.url), 1)
    assert "127.0.0.1" in one_line_error(run("info", "--peer", "x", "--store", down), 1)
    assert "--store" in one_line_error(run("info", "--peer", "x", "--store", "bogus://127.0.0.1:1"), 2)
    assert "--store" in one_line_error(run("info", "--peer", "x", "--store", "ferry://127.0.0.1"), 2)
    assert "--peer needs --store" in one_line_error(run("info", "--peer", "x"), 2)
    assert "go with --peer" in one_line_error(run("info", "--store", discovery_store.url), 2)
    assert "go with --peer" in one_line_error(run("info", "--devices"), 2)
    assert "--json" in one_line_error(run("info", "--json", "--peer", "x", "--store", discovery_store.url), 2)
    assert "--config" in one_line_error(run("info", "--config", "--device", "soft_lo"), 2)
    for args in (("info", "--device", "nosuch"), ("info", "--json", "--device", "nosuch")):
        assert "no device named 'nosuch'" in one_line_error(run(*args), 1)


# ---- ferry objects: errors, default keys ----

def objects(*args):
    return run("objects", *[str(a) for a in args], env={"FERRY_LOG_LEVEL": "error"})


def test_objects_with_no_server_says_so(tmp_path):
    base = "http://127.0.0.1:%d" % free_port()
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    out = tmp_path / "out.bin"
    for args in (("ls", base), ("ls", base + "/bkt"), ("mb", base + "/bkt"), ("rm", base + "/bkt/k"),
                 ("get", base + "/bkt/k", out), ("get", base + "/bkt/k", out, "--http"),
                 ("put", src, base + "/bkt/k"), ("put", src, base + "/bkt/k", "--http")):
        line = one_line_error(objects(*args), 1)
        assert line == "ferry objects %s: Unavailable: no server answers at %s (connection refused)" % (
            args[0], base), line
    assert not out.exists()


def test_objects_say_which_of_bucket_and_object_is_missing(object_store, tmp_path):
    base = object_store.url
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    out = tmp_path / "out.bin"
    for how in ((), ("--http",)):
        assert one_line_error(objects("get", base + "/nobucket/k", out, *how), 1) == \
            "ferry objects get: NotFound: no bucket 'nobucket'"
        assert one_line_error(objects("put", src, base + "/nobucket/k", *how), 1) == \
            "ferry objects put: NotFound: no bucket 'nobucket'"
    assert one_line_error(objects("ls", base + "/nobucket"), 1) == "ferry objects ls: NotFound: no bucket 'nobucket'"
    assert one_line_error(objects("rb", base + "/nobucket"), 1) == "ferry objects rb: NotFound: no bucket 'nobucket'"
    assert objects("mb", base + "/models").returncode == 0
    for how in ((), ("--http",)):
        assert one_line_error(objects("get", base + "/models/missing.bin", out, *how), 1) == \
            "ferry objects get: NotFound: no object 'missing.bin' in bucket 'models'"
    assert not out.exists()
    # Any other refusal: the HTTP status with the store's Code and Message.
    line = one_line_error(objects("mb", base + "/models"), 1)
    assert "HTTP 409 BucketAlreadyOwnedByYou: " in line, line


def test_objects_put_without_a_key_uses_the_file_name(object_store, tmp_path):
    base = object_store.url
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights " * 1000)
    assert objects("mb", base + "/models").returncode == 0
    for url, key in ((base + "/models", "w.bin"), (base + "/models/", "w.bin"),
                     (base + "/models/v1/", "v1/w.bin")):
        r = objects("put", src, url)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("stored %s %s/models/%s: 8000 bytes" % (src, base, key)), r.stdout
    r = objects("ls", base + "/models")
    assert [l.split() for l in r.stdout.splitlines()] == [["8000", "v1/w.bin"], ["8000", "w.bin"]], r.stdout
    # get into a directory: DIR/(the key's last part).
    into = tmp_path / "into"
    into.mkdir()
    r = objects("get", base + "/models/v1/w.bin", into)
    assert r.returncode == 0, r.stderr
    assert (into / "w.bin").read_bytes() == src.read_bytes()
    # Bad inputs change nothing.
    assert "no file" in one_line_error(objects("put", tmp_path / "absent.bin", base + "/models/"), 2)
    assert "directory" in one_line_error(objects("put", into, base + "/models/"), 2)
    assert "no bucket" in one_line_error(objects("put", src, base), 2)
    assert "no directory" in one_line_error(objects("get", base + "/models/w.bin", tmp_path / "no" / "f"), 2)
    r = objects("ls", base + "/models")
    assert [l.split() for l in r.stdout.splitlines()] == [["8000", "v1/w.bin"], ["8000", "w.bin"]], r.stdout


# ---- help and bad command lines ----

HELPS = [("help",), ("info", "--help"), ("demo", "--help"), ("store", "--help"), ("objects", "--help"),
         ("objects", "serve", "--help"), ("objects", "put", "--help"), ("objects", "get", "--help"),
         ("objects", "ls", "-h"), ("objects", "mb", "--help"), ("objects", "rb", "--help"),
         ("objects", "rm", "--help")]
HEADINGS = ["arguments:", "commands:", "options:", "exit codes:"]
BAD_USAGE = ("  2  a bad command line or FERRY_* variable (an unknown option, a missing or malformed value):\n"
             "     nothing was done\n")


def sections(text):
    """{heading: [lines]} of a help text, in order; the usage lines under "usage"."""
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("usage: "):
            current = out.setdefault("usage", [])
            current.append(line[len("usage: "):])
        elif line in HEADINGS:
            current = out.setdefault(line, [])
        elif line and not line.startswith(" "):
            current = out.setdefault("summary", [])
            current.append(line)
        elif line and current is not None:
            current.append(line)
    return out


@pytest.mark.parametrize("args", HELPS, ids=" ".join)
def test_every_help_has_the_same_shape(args):
    r = run(*args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout
    assert text.startswith("usage: ferry"), text
    parts = sections(text)
    names = list(parts)
    assert names[:2] == ["usage", "summary"], names
    assert [n for n in names if n in HEADINGS] == [h for h in HEADINGS if h in names], names
    assert names[-1] == "exit codes:" and text.endswith(BAD_USAGE), text
    assert parts["exit codes:"][0].startswith("  0  ")
    assert ("commands:" in parts) != ("options:" in parts), names
    if "options:" in parts:
        assert "  -h, --help            print this help and exit" in parts["options:"]
        rows = [l for l in parts["options:"] if re.match(r"  (-\w, |    )--", l)]
        assert rows, parts["options:"]
        for row in rows:
            m = re.match(r"  (?:-\w, |    )--[\w-]+(?: \S+)?\s{2,}(\S)", row)
            assert m is None or m.group(1).islower(), row  # descriptions start in lower case
    for word in ("TEXT", "INT:", "REQUIRED", "Positionals", "Usage:", "Options:"):
        assert word not in text, (word, text)


@pytest.mark.parametrize("command", [("info",), ("demo",), ("store",), ("objects",), ("objects", "put")],
                         ids=" ".join)
def test_help_command_is_the_commands_help(command):
    if len(command) == 1:
        assert run("help", *command).stdout == run(*command, "--help").stdout
    else:
        assert run(command[0], "help", command[1]).stdout == run(*command, "--help").stdout


@pytest.mark.parametrize("args", [
    (), ("bogus",), ("info", "--bogus"), ("info", "--device"), ("store", "--port", "x"), ("store", "--nope"),
    ("demo", "--size", "7"), ("demo", "extra"), ("demo", "--device", "nosuch"), ("demo", "--store", "bogus://x"),
    ("objects",), ("objects", "bogus"), ("objects", "put"),
    ("objects", "put", "--bogus"), ("objects", "get", "http://127.0.0.1:1/b/k"),
    ("objects", "serve", "--port", "70000"), ("objects", "serve", "--max-body", "5X"),
    ("objects", "ls", "ftp://127.0.0.1:1/b"), ("objects", "rm", "http://127.0.0.1:1/bkt"),
], ids=lambda a: " ".join(a) or "nothing")
def test_a_bad_command_line_is_one_line_and_exit_2(args):
    line = one_line_error(run(*args), 2)
    assert "The following" not in line and "TEXT" not in line, line
