#!/usr/bin/env python3
"""ferry bench refuses bad input clearly and never hangs: bad options, a server that sends malformed
control messages or nothing at all, and a client that sends garbage to a ferry server. Each case
must end with a non-zero exit, a message naming the problem, and within a deadline.

    bench_bad_input_test.py FERRY_BINARY
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAILURES = []


def check(name, cond, detail):
    if not cond:
        FAILURES.append("%s: %s" % (name, detail))


def run(cmd, timeout):
    start = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, timeout
    return r, time.monotonic() - start


def bad_option(ferry, args, pattern, command=None):
    """`ferry bench ARGS` (or `command ARGS`) must exit with 2 and a message matching pattern."""
    command = command or [ferry, "bench"]
    name = " ".join([os.path.basename(command[-1])] + args)
    r, _ = run(command + args, 20)
    if r is None:
        return check(name, False, "hung")
    check(name, r.returncode == 2, "exit code %d, expected 2" % r.returncode)
    check(name, re.search(pattern, r.stderr), "stderr %r does not match %r" % (r.stderr[:200], pattern))
    check(name, len(r.stderr.strip().splitlines()) == 1, "not one line: %r" % r.stderr[:300])


def fake_server(reply, hold_seconds):
    """A TCP server that reads the client's hello, answers `reply` (bytes or None) and then holds the
    connection open for hold_seconds. Returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.settimeout(10)
        try:
            conn.recv(1 << 20)
            if reply is not None:
                conn.sendall(reply)
            time.sleep(hold_seconds)
        except OSError:
            pass
        conn.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def against_fake(ferry, reply, pattern, hold=8, args=()):
    name = "server replying %r" % (reply[:40] if reply else reply)
    port = fake_server(reply, hold)
    r, took = run([ferry, "bench", "127.0.0.1:%d" % port, "--size", "8", "--iters", "5", "--timeout", "2"] + list(args),
                  30)
    if r is None:
        return check(name, False, "the client hung")
    check(name, r.returncode == 1, "exit code %d, expected 1" % r.returncode)
    check(name, re.search(pattern, r.stderr), "stderr %r does not match %r" % (r.stderr[-300:], pattern))
    check(name, took < 6, "took %.1f s with --timeout 2" % took)


def garbage_client(ferry, payload, pattern):
    name = "client sending %r" % (payload[:40] if payload else payload)
    proc = subprocess.Popen([ferry, "bench", "--server", "--bind", "127.0.0.1", "--port", "0", "--timeout", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r":(\d+),", proc.stdout.readline())
        if not m:
            return check(name, False, "the server printed no port")
        conn = socket.create_connection(("127.0.0.1", int(m.group(1))))
        if payload:
            conn.sendall(payload)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            return check(name, False, "the server hung")
        reply = b""
        conn.settimeout(2)
        try:
            reply = conn.recv(4096)
        except OSError:
            pass
        conn.close()
        err = proc.stderr.read()
        check(name, proc.returncode == 1, "server exit code %d, expected 1" % proc.returncode)
        check(name, re.search(pattern, err), "stderr %r does not match %r" % (err[-300:], pattern))
        if payload:
            check(name, b'"type":"error"' in reply, "the client was not told why: %r" % reply[:200])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    ferry = sys.argv[1]
    bad_option(ferry, ["127.0.0.1", "--port", "0"], r"--port 0 picks a free port for --server only")
    bad_option(ferry, ["127.0.0.1:0"], r"the server port takes a whole number in \[1, 65535\]")
    bad_option(ferry, ["--local", "--op", "bogus"], r"unknown --op 'bogus'")
    bad_option(ferry, ["--local", "--soft-path", "shm"], r"unknown --soft-path 'shm'")
    bad_option(ferry, ["--local", "--soft-path"], r"--soft-path: 1 required TEXT missing")
    bad_option(ferry, ["--local", "--memory", "huge"], r"unknown --memory 'huge': use heap or shared")
    bad_option(ferry, ["--local", "--mode", "fast"], r"unknown --mode 'fast'")
    bad_option(ferry, ["--local", "--wait", "nap"], r"unknown --wait 'nap': use poll or event")
    bad_option(ferry, ["--local", "--mode", "lat", "--wait", "event"], r"--wait event is for verbs latency runs")
    bad_option(ferry, ["--local", "--op", "send", "--wait", "event"], r"--wait event is for verbs latency runs")
    bad_option(ferry, ["--local", "--call-time"], r"--call-time is for verbs latency runs")
    bad_option(ferry, ["--local", "--api", "endpoint", "--mode", "lat", "--call-time"],
               r"--call-time is for verbs latency runs .*always time their calls")
    bad_option(ferry, ["--local", "--poll-yield", "-1"], r"--poll-yield takes a whole number")
    bad_option(ferry, ["--local", "--poll-yield", "many"], r"--poll-yield takes a whole number")
    bad_option(ferry, ["--local", "--poll-yield", "2000000"], r"--poll-yield")
    bad_option(ferry, ["--local", "--size", "0"], r"bad size '0'")
    bad_option(ferry, ["--local", "--size", "12Q"], r"bad size '12Q'")
    bad_option(ferry, ["--local", "--size", "4K,,8"], r"bad size ''")
    bad_option(ferry, ["--local", "--size", "99999999999999999999"], r"too large")
    bad_option(ferry, ["--local", "--iters", "-3"], r"--iters takes a whole number")
    bad_option(ferry, ["--local", "--op", "atomic", "--size", "64"], r"atomics move 8 bytes")
    bad_option(ferry, ["--local", "--batch", "8", "--depth", "4"], r"cannot exceed --depth")
    bad_option(ferry, ["--local", "--iters", "5", "--duration", "1"], r"not both")
    bad_option(ferry, [], r"exactly one of --server, --local")
    bad_option(ferry, ["--local", "--frobnicate"], r"unknown option '--frobnicate'")
    # The Endpoint API's mode: what it does not offer, and batches it cannot take.
    endpoint = ["--local", "--api", "endpoint"]
    bad_option(ferry, ["--local", "--api", "bogus"], r"unknown --api 'bogus': use verbs or endpoint")
    bad_option(ferry, endpoint + ["--op", "atomic"], r"--api endpoint offers write, read, send and write_imm")
    bad_option(ferry, endpoint + ["--op", "bogus"], r"unknown --op 'bogus'")
    bad_option(ferry, endpoint + ["--batch", "0"], r"--batch takes a whole number in \[1, 1048576\], not '0'")
    bad_option(ferry, endpoint + ["--batch", "2000000"], r"--batch takes a whole number in \[1, 1048576\]")
    bad_option(ferry, endpoint + ["--batch", "1024", "--size", "4M"],
               r"one call moves --size x --batch bytes, at most 1G")
    bad_option(ferry, endpoint + ["--threads", "2"], r"--threads must be 1")
    bad_option(ferry, endpoint + ["--qps", "65"], r"num_qp\) must be in \[1, 64\]")
    # Its Python client refuses the same before it imports ferry.
    client = [sys.executable, os.path.join(os.path.dirname(HERE), "endpoint_client.py")]
    bad_option(ferry, ["--local", "--op", "atomic"], r"unknown --op 'atomic'", client)
    bad_option(ferry, ["--local", "--batch", "0"], r"--batch takes a whole number in \[1, 1048576\], not 0", client)
    bad_option(ferry, ["--local", "--batch", "1024", "--size", "4M"], r"at most 1G", client)
    bad_option(ferry, ["--local", "--form", "numpy", "--op", "send"], r"send takes chunks", client)
    bad_option(ferry, ["--local", "--form", "list"], r"unknown --form 'list'", client)
    bad_option(ferry, ["--local", "--size", "0"], r"bad size '0'", client)

    against_fake(ferry, b"{not json\n", r"malformed control message")
    against_fake(ferry, b"[1, 2]\n", r"not a JSON object")
    against_fake(ferry, b'{"type": "hello"}\n', r"no \"ferry_bench\" version")
    against_fake(ferry, b'{"ferry_bench": 2, "type": "hello"}\n', r"protocol version 2")
    against_fake(ferry, b'{"ferry_bench": 1, "type": "ready"}\n', r"unexpected control message 'ready'")
    against_fake(ferry, b'{"ferry_bench": 1, "type": "hello", "device": "x", "paths": 7, "buffers": []}\n',
                 r"field 'paths' must be an array")
    against_fake(ferry, b'{"ferry_bench": 1, "type": "error", "message": "out of memory"}\n',
                 r"the peer gave up: out of memory")
    against_fake(ferry, None, r"no control message from the peer within 2 s")
    against_fake(ferry, b'{"ferry_bench": 1, "type": "hel', r"no control message from the peer within 2 s")
    against_fake(ferry, b"\n", r"malformed control message", hold=0)
    against_fake(ferry, b'{"ferry_bench": 1, "type": "hello", "device": "x"}\n', r"field 'endpoint' is missing",
                 args=["--api", "endpoint"])

    garbage_client(ferry, b"GET / HTTP/1.0\r\n\r\n", r"malformed control message")
    garbage_client(ferry, b'{"ferry_bench": 1, "type": "hello", "op": "write", "mode": "bw", "threads": 1, '
                          b'"qps": 1, "depth": 1, "batch": 1, "max_size": 0, "device": "x", "paths": [], '
                          b'"buffers": []}\n', r"field 'max_size' must be an integer")
    garbage_client(ferry, b'{"ferry_bench": 1, "type": "hello", "op": "write", "mode": "bw", "threads": 64, '
                          b'"qps": 1, "depth": 1, "batch": 1, "max_size": 1073741824, "device": "x", '
                          b'"paths": [], "buffers": []}\n', r"exceed 8 GiB of registered memory")
    garbage_client(ferry, None, r"no control message from the peer within 2 s")
    for fields, pattern in (('"memory": "gpu"', r"unknown memory 'gpu'"),
                            ('"wait": "nap"', r"unknown wait 'nap'"),
                            ('"wait": "event"', r"--wait event is for verbs latency runs"),
                            ('"poll_yield": -1', r"field 'poll_yield'"),
                            ('"poll_yield": "often"', r"field 'poll_yield'"),
                            ('"api": "bogus"', r"unknown api 'bogus'"),
                            ('"api": "endpoint"', r"field 'endpoint' is missing"),
                            ('"api": "endpoint", "endpoint": {"ferry_endpoint": 99}', r"the peer's endpoint metadata"),
                            ('"api": "endpoint", "op": "atomic"', r"no atomics"),
                            ('"api": "endpoint", "batch": 4096, "max_size": 1048576', r"at most 1G")):
        hello = json.loads('{"ferry_bench": 1, "type": "hello", "op": "write", "mode": "bw", "threads": 1, "qps": 1, '
                           '"depth": 4, "batch": 1, "max_size": 8, "device": "x"}')
        hello.update(json.loads("{%s}" % fields))
        garbage_client(ferry, (json.dumps(hello) + "\n").encode(), pattern)

    for f in FAILURES:
        print("FAIL: " + f)
    print("bench bad input: %d checks failed" % len(FAILURES) if FAILURES else "bench bad input: all cases refused cleanly")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
