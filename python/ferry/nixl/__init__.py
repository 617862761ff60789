"""``ferry.nixl``: NIXL's Python API, name for name, served by ferry's engine.

Programs written for NIXL (``from nixl._api import nixl_agent``) run on ferry unchanged once
``install_as_nixl()`` was called, or under ``python -m ferry.nixl.run program.py``::

    import ferry.nixl
    ferry.nixl.install_as_nixl()
    from nixl._api import nixl_agent, nixl_agent_config

ferry never installs a top-level ``nixl`` package of its own: a real NIXL stays importable until a
program asks for ferry's. See docs/nixl.md for what is served.
"""

import importlib as _importlib
import sys as _sys

from . import _api, _bindings, _utils, logging

_SUBMODULES = {"_api": _api, "_bindings": _bindings, "_utils": _utils, "logging": logging}

# The public names of the four modules, as NIXL's package re-exports them (the modules those
# import, numpy and the like, are not names of the API).
for _module in (_api, _bindings, _utils, logging):
    for _name in dir(_module):
        if not _name.startswith("_") and not isinstance(getattr(_module, _name), type(_sys)):
            globals()[_name] = getattr(_module, _name)
del _module, _name


def install_as_nixl():
    """Makes ``import nixl`` (and ``nixl._api``, ``nixl._bindings``, ``nixl._utils``,
    ``nixl.logging``) give ferry.nixl in this process, as ``pymysql.install_as_MySQLdb()`` does.
    Idempotent. Returns the module now known as ``nixl``."""
    this = _sys.modules[__name__]
    _sys.modules["nixl"] = this
    for sub, module in _SUBMODULES.items():
        _sys.modules["nixl." + sub] = module
    _importlib.invalidate_caches()
    return this
