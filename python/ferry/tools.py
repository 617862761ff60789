"""Small functions shared by the verbs modules (the `rdma.tools` names of the verbs specification)."""

from __future__ import annotations

import time as _time

__all__ = ["clock_monotonic"]


def clock_monotonic() -> float:
    """Seconds of a clock that never goes backwards (:func:`time.monotonic`). Deadlines such as
    :attr:`ferry.vtools.CQPoller.wakeat` are values of this clock."""
    return _time.monotonic()
