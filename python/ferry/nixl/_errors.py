"""NIXL's status codes and its exception classes, and the mapping from ferry's errors onto them.

Every exception derives from ``RuntimeError`` (as NIXL's do) and carries its status in
``.status``. Messages say what and why (the agent, the range, the memory type); the type is NIXL's.
"""

from .. import errors as _ferry_errors

import enum


class nixl_status_t(enum.IntEnum):
    """NIXL's status codes (NIXL's own names and values)."""

    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


# Each code as a module-level name too, as NIXL's bindings have them.
(NIXL_IN_PROG, NIXL_SUCCESS, NIXL_ERR_NOT_POSTED, NIXL_ERR_INVALID_PARAM,
 NIXL_ERR_BACKEND, NIXL_ERR_NOT_FOUND, NIXL_ERR_MISMATCH, NIXL_ERR_NOT_ALLOWED,
 NIXL_ERR_REPOST_ACTIVE, NIXL_ERR_UNKNOWN, NIXL_ERR_NOT_SUPPORTED, NIXL_ERR_REMOTE_DISCONNECT,
 NIXL_ERR_CANCELED, NIXL_ERR_NO_TELEMETRY) = nixl_status_t


class nixlError(RuntimeError):
    """Base of the NIXL exceptions (not a NIXL name; each status has its own class below)."""

    status = NIXL_ERR_UNKNOWN


def _status_class(name, code, doc):
    return type(name, (nixlError,), {"status": code, "__doc__": doc, "__module__": "ferry.nixl._bindings"})


nixlNotPostedError = _status_class("nixlNotPostedError", NIXL_ERR_NOT_POSTED, "NIXL_ERR_NOT_POSTED")
nixlInvalidParamError = _status_class("nixlInvalidParamError", NIXL_ERR_INVALID_PARAM,
                                      "NIXL_ERR_INVALID_PARAM: bad arguments")
nixlBackendError = _status_class("nixlBackendError", NIXL_ERR_BACKEND, "NIXL_ERR_BACKEND: the engine failed")
nixlNotFoundError = _status_class("nixlNotFoundError", NIXL_ERR_NOT_FOUND,
                                  "NIXL_ERR_NOT_FOUND: unknown backend, agent, region or memory type")
nixlMismatchError = _status_class("nixlMismatchError", NIXL_ERR_MISMATCH, "NIXL_ERR_MISMATCH")
nixlNotAllowedError = _status_class("nixlNotAllowedError", NIXL_ERR_NOT_ALLOWED, "NIXL_ERR_NOT_ALLOWED")
nixlRepostActiveError = _status_class("nixlRepostActiveError", NIXL_ERR_REPOST_ACTIVE,
                                      "NIXL_ERR_REPOST_ACTIVE: the request is still running")
nixlUnknownError = _status_class("nixlUnknownError", NIXL_ERR_UNKNOWN, "NIXL_ERR_UNKNOWN")
nixlNotSupportedError = _status_class("nixlNotSupportedError", NIXL_ERR_NOT_SUPPORTED, "NIXL_ERR_NOT_SUPPORTED")
nixlRemoteDisconnectError = _status_class("nixlRemoteDisconnectError", NIXL_ERR_REMOTE_DISCONNECT,
                                          "NIXL_ERR_REMOTE_DISCONNECT: the peer went away")
nixlCancelledError = _status_class("nixlCancelledError", NIXL_ERR_CANCELED, "NIXL_ERR_CANCELED")
nixlNoTelemetryError = _status_class("nixlNoTelemetryError", NIXL_ERR_NO_TELEMETRY,
                                     "NIXL_ERR_NO_TELEMETRY: telemetry is off for this agent")

EXCEPTIONS = (nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError, nixlMismatchError,
              nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError, nixlNotSupportedError,
              nixlRemoteDisconnectError, nixlCancelledError, nixlNoTelemetryError)

# ferry's status classes onto NIXL's. Order matters: the first matching class wins.
_FROM_FERRY = (
    (_ferry_errors.PeerGone, nixlRemoteDisconnectError),
    (_ferry_errors.Cancelled, nixlCancelledError),
    (_ferry_errors.NotFound, nixlNotFoundError),
    (_ferry_errors.InvalidArgument, nixlInvalidParamError),
    (_ferry_errors.NotSupported, nixlNotSupportedError),
    (_ferry_errors.PermissionDenied, nixlNotAllowedError),
    (_ferry_errors.Error, nixlBackendError),
)


def from_ferry(exc, what):
    """The NIXL exception for ferry's ``exc``, its message prefixed with ``what``."""
    for ferry_class, nixl_class in _FROM_FERRY:
        if isinstance(exc, ferry_class):
            return nixl_class("%s: %s" % (what, exc))
    return nixlBackendError("%s: %s" % (what, exc))
