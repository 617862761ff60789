"""Protected mode from another host (docs/security.md): two network namespaces joined by a veth
pair stand for two hosts. Without a secret an agent, and `ferry store` without --allow-remote, serve
their own host and refuse a client of the other one, saying why; the opt-outs open them. Skipped
where namespaces cannot be made (not root, no iproute2)."""
import os
import subprocess
import sys
import time

import pytest

from netns_hosts import two_hosts

FERRY = os.path.join(os.environ.get("FERRY_TEST_BIN_DIR", ""), "..", "ferry")
NET = "10.231.9"


@pytest.fixture(scope="module")
def hosts():
    """Namespaces a (NET.1) and b (NET.2), joined by a veth pair."""
    with two_hosts("pm", NET) as pair:
        yield pair


# A client that sends one line and prints what it gets back until the server closes (or 5 s pass).
CLIENT = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
if sys.argv[3]:
    s.sendall(sys.argv[3].encode() + b"\n")
out = b""
try:
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
        if sys.argv[3] and b"\n" in out:
            break
except socket.timeout:
    out += b"<open>"
sys.stdout.write(out.decode("latin-1"))
"""


def line_to(ns, host, port, line):
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, host, str(port), line],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def serve_store(ns, *extra):
    proc = subprocess.Popen(["ip", "netns", "exec", ns, FERRY, "store", "--host", NET + ".1", "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    first = proc.stdout.readline()
    assert "listening on" in first, first + proc.stderr.read()
    return proc, int(first.rsplit(":", 1)[1])


GET = '{"ferry_store":1,"type":"get","id":1,"key":"/ferry/pm/k"}'


def test_ferry_store_refuses_another_host_and_says_why_unless_allowed(hosts):
    a, b = hosts
    proc, port = serve_store(a)
    try:
        mine = line_to(a, NET + ".1", port, GET)  # this host (its own veth address): served
        assert '"id":1' in mine and "this host only" not in mine, mine
        theirs = line_to(b, NET + ".1", port, GET)
        assert '"type":"error"' in theirs and "this host only" in theirs, theirs
        assert '"id":1' not in theirs, "the request of another host was answered"
    finally:
        proc.terminate()
        err = proc.communicate(timeout=10)[1]
    assert "refused a connection from " + NET + ".2" in err, err
    proc, port = serve_store(a, "--allow-remote")
    try:
        theirs = line_to(b, NET + ".1", port, GET)
        assert '"id":1' in theirs and "this host only" not in theirs, theirs
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


AGENT = r"""
import sys, time
import ferry
from ferry import start_peer_agent
agent = start_peer_agent(alias="pm", listen_host=sys.argv[1], device="soft_lo")
# describe(): "'pm' 1a2b3c4d wireup HOST:PORT devices ..."
print(agent._agent.describe().split(" wireup ")[1].split()[0].rsplit(":", 1)[1], flush=True)
sys.stdin.readline()
print(agent.stats()["connections_refused"], flush=True)
agent.shutdown()
"""


def test_an_agent_without_a_secret_refuses_another_host_and_says_why(hosts):
    a, b = hosts
    env = dict(os.environ, FERRY_LOG_LEVEL="warn")
    env.pop("FERRY_AGENT_SECRET", None)
    proc = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", AGENT, NET + ".1"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), line + proc.stderr.read()
        port = int(line)
        mine = line_to(a, NET + ".1", port, "")  # this host: kept open, waiting for a wireup
        assert mine.endswith("<open>"), mine
        theirs = line_to(b, NET + ".1", port, "")  # another host: closed at once
        assert theirs == "", theirs
        proc.stdin.write("\n")
        proc.stdin.flush()
        refused = int(proc.stdout.readline())
        assert refused >= 1
    finally:
        err = proc.communicate(timeout=20)[1]
    assert "refused a connection from " + NET + ".2" in err and "this host only" in err, err
