"""Waits in ferry.verbs and ferry.vtools: they take timeouts, release the GIL, end on Ctrl-C
(any signal whose handler raises) and end when the object they wait on is closed."""

import signal
import threading
import time

import pytest

import ferry
import ferry.vtools


class Interrupted(Exception):
    pass


@pytest.fixture
def ctx():
    with ferry.get_verbs(ferry.get_end_port()) as c:
        yield c


@pytest.fixture
def alarm():
    """Raises Interrupted in the main thread after `delay` seconds (like Ctrl-C would)."""
    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, handler)

    def arm(delay):
        signal.setitimer(signal.ITIMER_REAL, delay)

    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_blocking_async_event_wait_is_interruptible(ctx, alarm):
    alarm(0.2)
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        ctx.get_async_event(timeout=None)
    assert time.monotonic() - t0 < 2.0


def test_blocking_iterwc_is_interruptible(ctx, alarm):
    cq = ctx.cq(8, ctx.comp_channel())
    poller = ferry.vtools.CQPoller(cq)
    alarm(0.2)
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        for _ in poller.iterwc():
            pass
    assert time.monotonic() - t0 < 2.0


def test_blocking_completion_channel_wait_is_interruptible(ctx, alarm):
    cc = ctx.comp_channel()
    ctx.cq(8, cc).req_notify()
    alarm(0.2)
    with pytest.raises(Interrupted):
        cc._get_event(-1)


def test_waits_release_the_gil(ctx):
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = counter[0]
        assert ctx.get_async_event(timeout=0.3) is None
        during_async = counter[0] - before
        cq = ctx.cq(8, ctx.comp_channel())
        before = counter[0]
        assert list(ferry.vtools.CQPoller(cq).iterwc(timeout=0.3)) == []
        during_poller = counter[0] - before
    finally:
        stop.set()
        t.join()
    # The other thread ran while this one waited.
    assert during_async > 1000 and during_poller > 1000


def test_closing_the_cq_ends_a_wait_in_another_thread(ctx):
    cc = ctx.comp_channel()
    cq = ctx.cq(8, cc)
    outcome = []

    def wait():
        try:
            outcome.append(list(ferry.vtools.CQPoller(cq).iterwc(timeout=10)))
        except ferry.Error as err:
            outcome.append(err)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    ctx.close()
    t.join(timeout=5)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ferry.Closed)


def test_closing_the_context_ends_an_async_event_wait(ctx):
    outcome = []

    def wait():
        try:
            outcome.append(ctx.get_async_event(timeout=10))
        except ferry.Error as err:
            outcome.append(err)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    ctx.close()
    t.join(timeout=5)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ferry.Closed)


def test_cq_poller_without_channel_spins_until_timeout(ctx):
    cq = ctx.cq(8)
    poller = ferry.vtools.CQPoller(cq)
    assert poller.sleep(ferry.tools.clock_monotonic() + 1) is True  # no channel: nothing to sleep on
    t0 = time.monotonic()
    assert list(poller.iterwc(count=1, timeout=0.1)) == []
    assert poller.timedout and time.monotonic() - t0 >= 0.09
