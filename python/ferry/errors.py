"""ferry's exceptions: one class per status code, all under :class:`ferry.Error`.

The C++ core reports a stable status code, a message and a cause (an errno, or a work-completion
status). Each code has its own class here; verbs calls that fail raise a class that is also a
:class:`SysError` (with ``func`` and ``errno``), as the verbs interface specifies.
"""

from __future__ import annotations

import errno as _errno
from typing import Any, Dict, Optional, Type

__all__ = [
    "Error", "RDMAError", "SysError", "InvalidArgument", "NotSupported", "NotFound",
    "ResourceExhausted", "PermissionDenied", "TimedOut", "Closed", "IoError", "ProtocolError",
    "WorkCompletionError", "Cancelled", "Unavailable", "Internal", "Busy", "PeerGone", "make_error",
]


class Error(Exception):
    """Base of every ferry exception. ``code`` is the status code's number, ``message`` the
    text, ``cause`` the errno (or work-completion status) behind it, 0 when none."""

    code: int = -1

    def __new__(cls, message: str = "", cause: int = 0, *args: Any, **kwargs: Any) -> Error:
        # OSError-derived classes would read (message, cause) as (errno, strerror): pass only text.
        return super().__new__(cls, message)

    def __init__(self, message: str = "", cause: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause
        if isinstance(self, OSError):
            os_error: OSError = self
            os_error.errno = cause or None
            os_error.strerror = message

    def __str__(self) -> str:
        text = self.message
        if self.cause and self.code != WorkCompletionError.code:
            text += " (errno %d: %s)" % (self.cause, _errno.errorcode.get(self.cause, "?"))
        return text


class RDMAError(Error):
    """Errors of the verbs interface (the `rdma.RDMAError` of the verbs specification)."""


class SysError(RDMAError):
    """A verbs call failed: ``func`` names it, ``errno`` is the error number it returned."""

    def __init__(self, message: str = "", cause: int = 0, func: Optional[str] = None) -> None:
        super().__init__(message, cause)
        self.func = func
        self.errno: Optional[int] = cause

    def __str__(self) -> str:
        prefix = "%s failed: " % self.func if self.func else ""
        return prefix + super().__str__()


class InvalidArgument(Error, ValueError):
    """A bad argument, attribute or handle, or a call the object's state refuses (EINVAL). Also a
    :class:`ValueError`."""

    code = 1


class NotSupported(Error, NotImplementedError):
    """The provider or device does not offer this (EOPNOTSUPP). Also a :class:`NotImplementedError`."""

    code = 2


class NotFound(Error, LookupError):
    """No such device, key, region, bucket or object (ENOENT, ENODEV). Also a :class:`LookupError`."""

    code = 3


class ResourceExhausted(Error):
    """A queue is full or a limit is reached (ENOMEM)."""

    code = 4


class PermissionDenied(Error, PermissionError):
    """Access refused: a region without the permission, a refused signature or metadata tag
    (EACCES, EPERM). Also a :class:`PermissionError`."""

    code = 5


class TimedOut(Error, TimeoutError):
    """A wait ran out of time (ETIMEDOUT). Also a :class:`TimeoutError`."""

    code = 6


class Closed(Error):
    """The object, or a parent of it, was closed (EBADF)."""

    code = 7


class IoError(Error, OSError):
    """A system call failed (``cause`` and ``errno`` hold its errno); a CQ that overflowed. Also an
    :class:`OSError`."""

    code = 8


class ProtocolError(Error):
    """A peer sent something malformed or hostile; the connection is closed."""

    code = 9


class WorkCompletionError(Error):
    """A work completion finished with an error status (``cause`` holds the IBV_WC_* status)."""

    code = 10


class Cancelled(Error):
    """The operation was cancelled: its endpoint, agent or operation was shut down before it
    completed."""

    code = 11


class Unavailable(Error, ConnectionError):
    """The peer or device cannot be reached right now (a refused or failed connection, a store that
    does not answer). Also a :class:`ConnectionError`."""

    code = 12


class Internal(Error):
    """A broken invariant inside ferry (a bug: please report it); also the class of an unknown
    status code."""

    code = 13


class Busy(Error):
    """The object is still in use (EBUSY): a region with operations in flight, a bucket that exists
    or still holds objects."""

    code = 14


class PeerGone(Error, ConnectionError):
    """The peer died, restarted or stopped answering (the agent layer's peer-gone error)."""
    code = 15


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotSupported, NotFound, ResourceExhausted, PermissionDenied, TimedOut,
    Closed, IoError, ProtocolError, WorkCompletionError, Cancelled, Unavailable, Internal, Busy,
    PeerGone)}
_SYS_BY_CODE: Dict[int, Type[SysError]] = {}


def _sys_class(code: int) -> Type[SysError]:
    cls = _SYS_BY_CODE.get(code)
    if cls is None:
        base = _BY_CODE.get(code, Internal)
        cls = type("SysError" + base.__name__, (SysError, base), {"code": base.code})
        cls.__module__ = __name__
        _SYS_BY_CODE[code] = cls
    return cls


def make_error(code: int, message: str, cause: int = 0, func: Optional[str] = None) -> Error:
    """The exception for a status: an instance of the class of status ``code`` (1 to 15;
    :class:`Internal` for an unknown one) with ``message`` and ``cause`` (an errno or IBV_WC_*
    status, 0 for none). With ``func`` (the name of the verbs call that failed) the instance is
    also a :class:`SysError`. The extension module raises what this returns."""
    if func is not None:
        return _sys_class(code)(message, cause, func)
    return _BY_CODE.get(code, Internal)(message, cause)
