"""``nixl._bindings``: NIXL's low-level layer, served by ferry.

Constants and enums, one exception class per status, the descriptor lists (``_descs``), the
telemetry and configuration types and the low-level agent (``_engine``).
"""

import enum

from ._descs import (BLK_SEG, DRAM_SEG, FILE_SEG, OBJ_SEG, VRAM_SEG, nixl_mem_t, nixlRegDList,  # noqa: F401
                     nixlRemoteDList, nixlXferDList)
from ._engine import NIXL_INIT_AGENT, nixlAgent, nixlAgentConfig, nixlXferTelemetry  # noqa: F401
from ._errors import (NIXL_ERR_BACKEND, NIXL_ERR_INVALID_PARAM, NIXL_ERR_MISMATCH,  # noqa: F401
                      NIXL_ERR_NOT_ALLOWED, NIXL_ERR_NOT_FOUND, NIXL_ERR_NOT_POSTED, NIXL_ERR_NOT_SUPPORTED,
                      NIXL_ERR_REMOTE_DISCONNECT, NIXL_ERR_REPOST_ACTIVE, NIXL_ERR_UNKNOWN, NIXL_IN_PROG,
                      NIXL_SUCCESS, nixlBackendError, nixlCancelledError, nixlInvalidParamError,
                      nixlMismatchError, nixlNoTelemetryError, nixlNotAllowedError, nixlNotFoundError,
                      nixlNotPostedError, nixlNotSupportedError, nixlRemoteDisconnectError,
                      nixlRepostActiveError, nixlUnknownError)

DEFAULT_COMM_PORT = 8888
HAVE_UCX_GPU_DEVICE_API = False


# nixl_status_t is _errors.py's: the codes and the exception classes come from one table.
from ._errors import nixl_status_t  # noqa: E402,F401


class nixl_xfer_op_t(enum.IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


NIXL_READ = nixl_xfer_op_t.NIXL_READ
NIXL_WRITE = nixl_xfer_op_t.NIXL_WRITE


class nixl_thread_sync_t(enum.IntEnum):
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0  # an alias of NONE, as NIXL's


NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT


class nixl_cost_t(enum.IntEnum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


NIXL_COST_ANALYTICAL_BACKEND = nixl_cost_t.NIXL_COST_ANALYTICAL_BACKEND
