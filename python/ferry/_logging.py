"""ferry's log lines, forwarded to Python's ``logging`` (logger ``"ferry"``).

The C++ core writes each line it logs (filtered by ``FERRY_LOG_LEVEL``, default warn) to a pipe;
one daemon thread, blocked in ``read`` (it never polls), turns each into a record of the ``ferry``
logger at the matching level. Without a handler configured, Python's last-resort handler prints
warnings and errors to stderr, as ferry itself would. ``forward_to_logging(False)`` sends the lines
straight to stderr again (with a timestamp, the process id and the level). A child made by
``fork`` gets its own pipe and thread."""

import logging
import os
import threading

from . import _core

_LEVELS = {"ERROR": logging.ERROR, "WARN": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG}
logger = logging.getLogger("ferry")

_lock = threading.Lock()
_state = {"read": -1, "write": -1, "enabled": False}


def _pump(read_fd):
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


def _start():
    read_fd, write_fd = os.pipe()
    _state.update(read=read_fd, write=write_fd, enabled=True)
    _core.forward_log(write_fd)
    threading.Thread(target=_pump, args=(read_fd,), name="ferry-log", daemon=True).start()


def forward_to_logging(enabled=True):
    """Forward ferry's log lines to the ``ferry`` logger (the default once ferry is imported), or
    (``enabled=False``) write them to stderr."""
    with _lock:
        if enabled == _state["enabled"]:
            return
        if enabled:
            _start()
        else:
            _core.forward_log(-1)
            os.close(_state["write"])  # the reader sees end of file and ends
            _state.update(read=-1, write=-1, enabled=False)


def _after_fork_in_child():
    # The parent's reader thread does not exist here; the inherited pipe would feed the parent.
    global _lock
    _lock = threading.Lock()
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
