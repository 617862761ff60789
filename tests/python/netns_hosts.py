"""Two network namespaces joined by a veth pair stand for two hosts (as tests/netns/netns_lib.sh
makes them), for tests of what a client of another host may reach."""
import contextlib
import os
import shutil
import subprocess

import pytest


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@contextlib.contextmanager
def two_hosts(tag, net):
    """Namespaces ferry_<tag>_a (net.1) and ferry_<tag>_b (net.2), joined by veth ends <tag>a and
    <tag>b; removed on exit. Skips the test where namespaces cannot be made (not root, no iproute2)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    a, b = "ferry_%s_a" % tag, "ferry_%s_b" % tag
    for ns in (a, b):
        ip("netns", "del", ns)
        if ip("netns", "add", ns).returncode != 0:
            pytest.skip("cannot create network namespaces here")
    try:
        assert ip("link", "add", tag + "a", "netns", a, "type", "veth", "peer", "name", tag + "b",
                  "netns", b).returncode == 0
        for ns, dev, addr in ((a, tag + "a", net + ".1/30"), (b, tag + "b", net + ".2/30")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
        yield a, b
    finally:
        ip("netns", "del", a)
        ip("netns", "del", b)
