"""ferry's log lines, forwarded to Python's ``logging`` (logger ``"ferry"``).

The C++ core writes each line it logs to a pipe; one daemon thread, blocked in ``read`` (it never
polls), turns each into a record of the ``ferry`` logger at the matching level. Without a handler
configured, Python's last-resort handler prints warnings and errors to stderr, as ferry itself
would. ``forward_to_logging(False)`` sends the lines straight to stderr again (with a timestamp,
the process id and the level). A child made by ``fork`` gets its own pipe and thread.

The core's threshold follows the ``ferry`` logger: whenever the logger's effective level changes
(its own ``setLevel``, a parent's or the root's, ``logging.disable``, ``dictConfig``), the core
logs from the most verbose of error, warn, info and debug that the logger lets through, so a line
the logger would drop is never made. ``FERRY_LOG_LEVEL``, when set, is the ``ferry`` logger's
level at import (unless the program gave the logger a level before), and the program's
``setLevel`` on it changes it afterwards. Without it, the logger has no level of its own and
follows its parents: warn under Python's default WARNING."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, Tuple

from . import _core

_LEVELS = {"ERROR": logging.ERROR, "WARN": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG}
logger = logging.getLogger("ferry")

_lock = threading.Lock()
_state: Dict[str, Any] = {"read": -1, "write": -1, "enabled": False}


_level_lock = threading.Lock()
_level_state: Dict[str, Any] = {"seen": None}


def _logger_state() -> Tuple[int, int, bool]:
    # Read without logging's lock: this runs inside logging's own calls, which may hold it.
    return (logger.getEffectiveLevel(), logger.manager.disable, logger.disabled)


def _core_level(state: Tuple[int, int, bool]) -> str:
    """The core's threshold for a logger state: the most verbose level the logger lets through."""
    effective, disabled_up_to, disabled = state
    lowest = max(effective, disabled_up_to + 1)
    if disabled or lowest > logging.WARNING:
        return "error"
    if lowest > logging.INFO:
        return "warn"
    return "info" if lowest > logging.DEBUG else "debug"


def _follow_level(force: bool = False) -> None:
    """Sets the core's threshold from the ``ferry`` logger when its effective level changed since
    the last look (or always, with ``force``)."""
    with _level_lock:
        state = _logger_state()
        if force or state != _level_state["seen"]:
            _level_state["seen"] = state
            _core.set_log_level(_core_level(state))


def _watch_level_changes() -> None:
    # Every level change in ``logging`` (setLevel on any logger, logging.disable) clears the
    # manager's cache of enabled levels: following there sees a parent's change as well as the
    # ferry logger's own, at no cost to logging calls. Without that method, the ferry logger's own
    # setLevel is watched.
    manager = logging.Logger.manager
    clear = getattr(manager, "_clear_cache", None)
    if callable(clear):
        def clear_and_follow() -> None:
            clear()
            _follow_level()

        manager._clear_cache = clear_and_follow  # type: ignore[attr-defined]
        return
    set_level = logger.setLevel

    def set_level_and_follow(level: int | str) -> None:
        set_level(level)
        _follow_level()

    logger.setLevel = set_level_and_follow  # type: ignore[method-assign]


def _pump(read_fd: int) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            try:
                chunk = pipe.read(65536)
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                level, _, message = text.partition(" ")
                logger.log(_LEVELS.get(level, logging.WARNING), "%s", message)


def _start() -> None:
    read_fd, write_fd = os.pipe()
    _state.update(read=read_fd, write=write_fd, enabled=True)
    _core.forward_log(write_fd)
    threading.Thread(target=_pump, args=(read_fd,), name="ferry-log", daemon=True).start()


def forward_to_logging(enabled: bool = True) -> None:
    """Forward ferry's log lines to the ``ferry`` logger (the default once ferry is imported), or
    (``enabled=False``) write them to stderr. Idempotent; a child made by ``fork`` keeps the
    setting with its own pipe and thread."""
    with _lock:
        if enabled == _state["enabled"]:
            return
        if enabled:
            _start()
        else:
            _core.forward_log(-1)
            os.close(_state["write"])  # the reader sees end of file and ends
            _state.update(read=-1, write=-1, enabled=False)


def _after_fork_in_child() -> None:
    # The parent's reader thread does not exist here; the inherited pipe would feed the parent.
    global _lock, _level_lock
    _lock = threading.Lock()
    _level_lock = threading.Lock()
    if _state["enabled"]:
        _core.forward_log(-1)
        for key in ("read", "write"):
            try:
                os.close(_state[key])
            except OSError:
                pass
        _start()


os.register_at_fork(after_in_child=_after_fork_in_child)
forward_to_logging(True)
_FROM_ENVIRONMENT = {"error": logging.ERROR, "warn": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
_LOG_LEVEL_SETTING: Dict[str, Any] = next((r for r in _core.config() if r["name"] == "FERRY_LOG_LEVEL"), {})
if logger.level == logging.NOTSET and _LOG_LEVEL_SETTING.get("set") and \
        _LOG_LEVEL_SETTING.get("effective") in _FROM_ENVIRONMENT:
    # The logger takes FERRY_LOG_LEVEL (as ferry's config reads it), so that its lines pass the
    # logger too; a level the program gave the logger before importing ferry wins.
    logger.setLevel(_FROM_ENVIRONMENT[_LOG_LEVEL_SETTING["effective"]])
_follow_level(force=True)
_watch_level_changes()
