"""Devices, end ports and the entry points of the verbs interface (the top-level `rdma` names of
the verbs specification: ``get_end_port``, ``get_verbs``, ``get_gmp_mad``).

::

    import ferry
    end_port = ferry.get_end_port()          # the first device's port 1
    with ferry.get_verbs(end_port) as ctx:   # a ferry.verbs.Context
        pd = ctx.pd()

:class:`RDMADevice`, :class:`EndPort` and the lookups are defined in :mod:`ferry.path` (a path and
its end port name each other) and exported from here. Importing :mod:`ferry` also makes
:mod:`ferry.verbs`, :mod:`ferry.path`, :mod:`ferry.vtools`, :mod:`ferry.IBA` and :mod:`ferry.tools`
available as attributes.
"""

from __future__ import annotations

from typing import Optional, Union

from . import IBA, tools  # noqa: F401  (imported so that ferry.IBA, ferry.tools exist)
from . import path
from . import verbs
from . import vtools  # noqa: F401
from .path import DeviceNotFoundError as DeviceNotFoundError  # importable from here, as before
from .path import EndPort, RDMADevice, get_device, get_devices, get_end_port

__all__ = ["RDMADevice", "EndPort", "get_devices", "get_device", "get_end_port", "get_verbs", "get_gmp_mad"]


def get_verbs(end_port: Union[EndPort, RDMADevice, str, None] = None) -> verbs.Context:
    """Open a :class:`ferry.verbs.Context` for *end_port* (an :class:`EndPort`, an
    :class:`RDMADevice`, a name, or None for the default end port). Raises
    :class:`ferry.NotFound` for an unknown name, and the device's error when it cannot be
    opened."""
    if end_port is None or isinstance(end_port, str):
        end_port = get_end_port(end_port)
    return verbs.Context(end_port)


def get_gmp_mad(end_port: Union[EndPort, str, None] = None,
                verbs: Optional[verbs.Context] = None) -> path.LocalPathResolver:
    """The path resolver for *end_port*, a context manager standing in for the specification's
    GMP MAD object: pass it to :func:`ferry.path.resolve_path`. With *verbs* (a :class:`ferry.verbs.Context`)
    resolved paths start at that context's GID. ferry's devices have no subnet administrator:
    paths are completed locally (see :func:`ferry.path.resolve_path`)."""
    if end_port is None or isinstance(end_port, str):
        end_port = get_end_port(end_port)
    return path.LocalPathResolver(end_port, verbs)
