"""ferry: RDMA-semantics data transfer between processes and hosts.

Registered memory, one-sided READ/WRITE, WRITE with immediate data, SEND/RECV and atomics over
RDMA NICs and over ferry's own software devices (TCP between hosts, loopback within one).

Layers, each its own module:

- ``ferry.verbs`` (with ``ferry.path`` and ``ferry.vtools``): an object-oriented verbs interface;
  ``ferry.get_end_port()`` and ``ferry.get_verbs()`` open a device.
- the Endpoint API: ``ferry.RDMAEndpoint``, ``ferry.available_nic()`` and friends.
- the agent: ``ferry.start_peer_agent()`` / ``ferry.PeerAgent`` name a peer and write to it
  (wireup, lanes, discovery through a store, reconnection; ``ferry.agent``).
- ``ferry.objects``: the object store (``ObjectStore``, S3-style HTTP with payloads by RDMA) and its
  client (``ObjectClient``), as ``ferry objects`` serves and uses them.
- ``ferry.Error`` and one exception class per status code (``ferry.errors``).
- every future is awaitable from asyncio (``await future``; ``ferry.aio``).
- ``ferry.stats()``: operations, bytes, errors and latency histograms per device context
  (``ferry.metrics``, with an optional Prometheus collector); ``ferry.config()``: every
  ``FERRY_*`` variable; ferry's log lines go to the ``logging`` logger ``"ferry"``.
"""

from typing import Any, Dict, List

from ._core import __version__
from ._core import check_config
from ._logging import forward_to_logging
from . import metrics
from .metrics import stats
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .rdma import *  # noqa: F401,F403
from .rdma import __all__ as _rdma_all
from .endpoint import *  # noqa: F401,F403
from .endpoint import __all__ as _endpoint_all
from .agent import PeerAgent, PeerConnection, start_peer_agent
from . import aio  # noqa: F401  (makes every future awaitable)
from . import objects



def config() -> List[Dict[str, Any]]:
    """Every ``FERRY_*`` variable ferry reads, as a list of dicts: ``name``, ``meaning``,
    ``default``, ``valid`` (the values it takes), ``set`` (whether this process has it),
    ``value`` (as set), ``effective`` (the value in effect) and ``error`` (why a set value is
    refused; empty when valid). ``check_config()`` raises ``ferry.InvalidArgument`` for the first
    refused one; opening a device or starting an agent does the same. docs/configuration.md holds
    the same table."""
    from . import _core

    return _core.config()


def unknown_config() -> List[Dict[str, str]]:
    """The ``FERRY_*`` variables set in this process that ferry does not read (most likely
    misspelt), as a list of dicts: ``name``, ``suggestion`` (the nearest variable ferry reads, at
    most two edits away; empty when none is) and ``warning`` (the line ferry logs once at WARN when
    it first checks its configuration). Variables that ferry's own tests and tools read are not
    listed. ``ferry info --config`` shows the same."""
    from . import _core

    return _core.unknown_config()


__all__ = (["__version__", "config", "unknown_config", "check_config", "forward_to_logging", "metrics", "objects", "stats"] + list(_errors_all) + list(_rdma_all) + list(_endpoint_all) +
           ["PeerAgent", "PeerConnection", "start_peer_agent"])
