"""Stopping a test's peer process for certain: SIGSTOP is delivered asynchronously, so a test that
needs the peer to do nothing from a given point on waits until every thread of it is stopped."""

import glob
import os
import signal
import time


def stop_process(pid, timeout=5.0):
    """Sends SIGSTOP to pid and returns once each of its threads is in the stopped state (Linux's
    /proc/PID/task/*/stat says T); raises TimeoutError when that does not happen within timeout."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for stat in glob.glob("/proc/%d/task/*/stat" % pid):
            try:
                with open(stat) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended meanwhile
        if states and all(s in ("T", "t") for s in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("process %d did not stop within %s s (thread states %s)" % (pid, timeout, states))
        time.sleep(0.001)


def resume_process(pid):
    os.kill(pid, signal.SIGCONT)
