"""``nixl.logging``: NIXL's logger factory.

``get_logger(name)`` configures the ``nixl`` logger once (INFO, one console handler on stdout, not
propagating; ``NIXL_LOG_LEVEL`` = TRACE, DEBUG, INFO, WARN, ERROR or FATAL overrides the level) and
returns ``nixl.<name>`` (a leading underscore dropped). The examples' success lines are INFO
messages their runners read from stdout. ``NIXL_DEBUG_LOGGING`` makes logging errors raise.
"""

import logging as _logging
import os
import sys

LOGGING_CONFIG = {
    "level": _logging.INFO,
    "format": "%(asctime)s %(name)s %(levelname)s: %(message)s",
    "stream": sys.stdout,
}

_LEVELS = {"TRACE": _logging.DEBUG, "DEBUG": _logging.DEBUG, "INFO": _logging.INFO, "WARN": _logging.WARNING,
           "WARNING": _logging.WARNING, "ERROR": _logging.ERROR, "FATAL": _logging.CRITICAL}
_configured = []


def set_log_level_by_env(logger):
    level = os.environ.get("NIXL_LOG_LEVEL")
    if level:
        logger.setLevel(_LEVELS.get(level.strip().upper(), _logging.INFO))


def setup_logging():
    if _configured:
        return
    _configured.append(True)
    root = _logging.getLogger("nixl")
    root.setLevel(LOGGING_CONFIG["level"])
    handler = _logging.StreamHandler(LOGGING_CONFIG["stream"])
    handler.setFormatter(_logging.Formatter(LOGGING_CONFIG["format"]))
    root.addHandler(handler)
    root.propagate = False
    set_log_level_by_env(root)
    if os.environ.get("NIXL_DEBUG_LOGGING"):
        _logging.raiseExceptions = True


def get_logger(name):
    setup_logging()
    return _logging.getLogger("nixl." + str(name).lstrip("_"))
