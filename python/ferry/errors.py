"""ferry's exceptions: one class per status code, all under :class:`ferry.Error`.

The C++ core reports a stable status code, a message and a cause (an errno, or a work-completion
status). Each code has its own class here; verbs calls that fail raise a class that is also a
:class:`SysError` (with ``func`` and ``errno``), as the verbs interface specifies.
"""

import errno as _errno

__all__ = [
    "Error", "RDMAError", "SysError", "InvalidArgument", "NotSupported", "NotFound",
    "ResourceExhausted", "PermissionDenied", "TimedOut", "Closed", "IoError", "ProtocolError",
    "WorkCompletionError", "Cancelled", "Unavailable", "Internal", "Busy", "PeerGone", "make_error",
]


class Error(Exception):
    """Base of every ferry exception. ``code`` is the status code's number, ``message`` the
    text, ``cause`` the errno (or work-completion status) behind it, 0 when none."""

    code = -1

    def __new__(cls, message="", cause=0, *args, **kwargs):
        # OSError-derived classes would read (message, cause) as (errno, strerror): pass only text.
        return super().__new__(cls, message)

    def __init__(self, message="", cause=0):
        super().__init__(message)
        self.message = message
        self.cause = cause
        if isinstance(self, OSError):
            self.errno = cause or None
            self.strerror = message

    def __str__(self):
        text = self.message
        if self.cause and self.code != WorkCompletionError.code:
            text += " (errno %d: %s)" % (self.cause, _errno.errorcode.get(self.cause, "?"))
        return text


class RDMAError(Error):
    """Errors of the verbs interface (the `rdma.RDMAError` of the verbs specification)."""


class SysError(RDMAError):
    """A verbs call failed: ``func`` names it, ``errno`` is the error number it returned."""

    def __init__(self, message="", cause=0, func=None):
        super().__init__(message, cause)
        self.func = func
        self.errno = cause

    def __str__(self):
        prefix = "%s failed: " % self.func if self.func else ""
        return prefix + super().__str__()


class InvalidArgument(Error, ValueError):
    code = 1


class NotSupported(Error, NotImplementedError):
    code = 2


class NotFound(Error, LookupError):
    code = 3


class ResourceExhausted(Error):
    code = 4


class PermissionDenied(Error, PermissionError):
    code = 5


class TimedOut(Error, TimeoutError):
    code = 6


class Closed(Error):
    code = 7


class IoError(Error, OSError):
    code = 8


class ProtocolError(Error):
    code = 9


class WorkCompletionError(Error):
    code = 10


class Cancelled(Error):
    code = 11


class Unavailable(Error, ConnectionError):
    code = 12


class Internal(Error):
    code = 13


class Busy(Error):
    code = 14


class PeerGone(Error, ConnectionError):
    """The peer died, restarted or stopped answering (the agent layer's peer-gone error)."""
    code = 15


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotSupported, NotFound, ResourceExhausted, PermissionDenied, TimedOut,
    Closed, IoError, ProtocolError, WorkCompletionError, Cancelled, Unavailable, Internal, Busy,
    PeerGone)}
_SYS_BY_CODE = {}


def _sys_class(code):
    cls = _SYS_BY_CODE.get(code)
    if cls is None:
        base = _BY_CODE.get(code, Internal)
        cls = type("SysError" + base.__name__, (SysError, base), {"code": base.code})
        cls.__module__ = __name__
        _SYS_BY_CODE[code] = cls
    return cls


def make_error(code, message, cause=0, func=None):
    """The exception for a status (used by the extension module)."""
    if func is not None:
        return _sys_class(code)(message, cause, func)
    return _BY_CODE.get(code, Internal)(message, cause)
