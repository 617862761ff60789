#!/usr/bin/env python3
"""A lossy link between two network namespaces, for kernels without tc netem.

Creates a TUN device in each namespace (ns_a: tun_a with addr_a, ns_b: tun_b with addr_b, a
point-to-point pair) and forwards every IP packet between them in this process, dropping a
fraction of them, delaying each by a random time and letting a fraction of them overtake the ones
queued before (reordering), as `tc qdisc add ... netem delay D J loss L reorder R` would. Prints
"ready" once both ends are up, forwards until SIGTERM or SIGINT, then prints what it did.

usage: impair.py NS_A TUN_A ADDR_A NS_B TUN_B ADDR_B [--loss 0.01] [--delay-ms 2] [--jitter-ms 1]
       [--reorder 0.05] [--seed N]

Written here rather than taken from a library: what is needed is only this packet pump, and
PyPI's network emulators need the very kernel queueing discipline this machine lacks.
"""

import argparse
import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000

_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(name):
    fd = os.open("/var/run/netns/" + name, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "setns into %s: %s" % (name, os.strerror(err)))
    finally:
        os.close(fd)


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for arg in ("ns_a", "tun_a", "addr_a", "ns_b", "tun_b", "addr_b"):
        ap.add_argument(arg)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--jitter-ms", type=float, default=1.0)
    ap.add_argument("--reorder", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    for p in (args.loss, args.reorder):
        if not 0.0 <= p < 1.0:
            ap.error("--loss and --reorder are fractions in [0, 1)")
    rng = random.Random(args.seed)

    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    enter_netns(args.ns_a)
    fd_a = open_tun(args.tun_a)
    enter_netns(args.ns_b)
    fd_b = open_tun(args.tun_b)
    _libc.setns(home, CLONE_NEWNET)
    os.close(home)
    for ns, dev, mine, peer in ((args.ns_a, args.tun_a, args.addr_a, args.addr_b),
                                (args.ns_b, args.tun_b, args.addr_b, args.addr_a)):
        subprocess.run(["ip", "-n", ns, "addr", "add", mine, "peer", peer, "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print("ready", flush=True)

    other = {fd_a: fd_b, fd_b: fd_a}
    queue = []  # (due time, order, destination fd, packet)
    order = 0
    counts = {"forwarded": 0, "dropped": 0, "reordered": 0, "bytes": 0}
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dest, packet = heapq.heappop(queue)
            try:
                os.write(dest, packet)
                counts["forwarded"] += 1
                counts["bytes"] += len(packet)
            except BlockingIOError:
                counts["dropped"] += 1  # the receiving device's queue is full: lost, as on a wire
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            ready, _, _ = select.select([fd_a, fd_b], [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:
            for _ in range(64):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if rng.random() < args.loss:
                    counts["dropped"] += 1
                    continue
                if rng.random() < args.reorder:
                    due = time.monotonic()  # overtakes the packets waiting out their delay
                    counts["reordered"] += 1
                else:
                    jitter = rng.uniform(-args.jitter_ms, args.jitter_ms)
                    due = time.monotonic() + max(0.0, args.delay_ms + jitter) / 1000.0
                order += 1
                heapq.heappush(queue, (due, order, other[fd], packet))
    print("impair: %(forwarded)d packets forwarded (%(bytes)d bytes), %(dropped)d dropped, "
          "%(reordered)d reordered" % counts, flush=True)


if __name__ == "__main__":
    sys.exit(main())
