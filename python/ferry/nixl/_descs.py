"""NIXL's memory types and descriptor lists.

A descriptor is ``(addr, len, devId)``; a registration descriptor adds an opaque meta string, a
remote one the agent's name. A list holds descriptors of one memory type. The rows live in one
N x 3 ``uint64`` NumPy array, so a list made from an N x 3 array (vLLM's and SGLang's 10^5-10^6
blocks) costs one copy and no Python object per row; lists of any memory type can be built,
compared and pickled (DRAM registers, and VRAM where CUDA's driver is usable: see _engine).

Pickling stores the rows and metas as plain NumPy/Python data. Unpickling runs whatever the bytes
say: unpickle descriptor lists only from peers you trust (as with NIXL).
"""

import enum

import numpy as np

from ._errors import nixlInvalidParamError, nixlNotFoundError


class nixl_mem_t(enum.IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG


def _mem_type(t):
    try:
        return nixl_mem_t(int(t))
    except (ValueError, TypeError):
        raise TypeError("not a nixl_mem_t: %r" % (t,)) from None


def rows_from_array(descs):
    """The N x 3 uint64 rows of ``descs`` (an N x 3 C-contiguous uint64/int64 array), one copy."""
    if descs.ndim != 2 or descs.shape[1] != 3:
        raise ValueError("descs must be a Nx3 numpy array, not of shape %s" % (descs.shape,))
    if descs.dtype not in (np.uint64, np.int64):
        raise ValueError("descs must be a Nx3 numpy array of uint64 or int64, not %s" % descs.dtype)
    if not descs.flags.c_contiguous:
        raise ValueError("descs must be a C-contiguous numpy array")
    return np.array(descs, dtype=np.uint64, copy=True)


class _DescList:
    """The shared body of the three list classes; ``_width`` is the tuple length they take."""

    _width = 3

    def __init__(self, type, descs=0, init_size=None):
        self._type = _mem_type(type)
        self._extra = []  # meta (RegDList) or agent name (RemoteDList) per row
        if init_size is not None:
            descs = init_size
        if isinstance(descs, (int, np.integer)) and not isinstance(descs, bool):
            self._rows = np.zeros((int(descs), 3), dtype=np.uint64)
            self._extra = [self._default_extra()] * int(descs)
        elif isinstance(descs, np.ndarray):
            self._rows = rows_from_array(descs)
            self._extra = [self._default_extra()] * len(self._rows)
        elif isinstance(descs, list):
            rows = np.empty((len(descs), 3), dtype=np.uint64)
            for i, d in enumerate(descs):
                rows[i], extra = self._split(d)
                self._extra.append(extra)
            self._rows = rows
        else:
            raise TypeError("descs must be a list of tuples or an Nx3 numpy array")

    # ---- one row ----
    def _default_extra(self):
        return None

    def _split(self, desc):
        if not isinstance(desc, tuple):
            raise TypeError("Each descriptor must be a tuple when provided as a list")
        if len(desc) != self._width:
            raise ValueError("Each descriptor tuple must have exactly %d elements" % self._width)
        try:
            row = (int(desc[0]), int(desc[1]), int(desc[2]))
        except (TypeError, ValueError):
            raise TypeError("descriptor %r: addr, len and devId must be integers" % (desc,)) from None
        if min(row) < 0 and row[2] != -1:
            raise ValueError("descriptor %r: addr and len must not be negative" % (desc,))
        row = (row[0], row[1], max(row[2], 0))  # CPU tensors report devId -1: DRAM's is 0
        return row, self._extra_of(desc)

    def _extra_of(self, desc):
        return None

    def _tuple(self, i):
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]))

    # ---- NIXL's methods ----
    def getType(self):
        return self._type

    def descCount(self):
        return len(self._rows)

    def isEmpty(self):
        return len(self._rows) == 0

    def __len__(self):
        return len(self._rows)

    def __bool__(self):
        # vLLM, SGLang and the examples test `if not descs` on a returned list: a list object is
        # truthy as NIXL's is (pybind objects without __len__), even when empty.
        return True

    def _index(self, i):
        n = len(self._rows)
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError("index must be an int")
        i = int(i)
        if i < 0 or i >= n:
            raise IndexError("descriptor index %d out of range (%d descriptors)" % (i, n))
        return i

    def __getitem__(self, i):
        return self._tuple(self._index(i))

    def __setitem__(self, i, desc):
        i = self._index(i)
        self._rows[i], self._extra[i] = self._split(desc)

    def addDesc(self, desc):
        row, extra = self._split(desc)
        self._rows = np.concatenate([self._rows, np.array([row], dtype=np.uint64)])
        self._extra.append(extra)

    append = addDesc

    def index(self, desc):
        row, extra = self._split(desc)
        hits = np.nonzero((self._rows == np.array(row, dtype=np.uint64)).all(axis=1))[0]
        for h in hits:
            if self._extra[h] == extra:
                return int(h)
        raise nixlNotFoundError("descriptor %r is not in the list" % (desc,))

    def remDesc(self, i):
        i = self._index(i)
        self._rows = np.delete(self._rows, i, axis=0)
        del self._extra[i]

    def clear(self):
        self._rows = np.zeros((0, 3), dtype=np.uint64)
        self._extra = []

    def print(self):
        print(str(self))

    def __str__(self):
        lines = ["%s of %s, %d descriptors" % (type(self).__name__, self._type.name, len(self._rows))]
        lines += ["  %r" % (self[i],) for i in range(min(len(self._rows), 64))]
        if len(self._rows) > 64:
            lines.append("  ...")
        return "\n".join(lines)

    def __repr__(self):
        return "<%s %s x%d>" % (type(self).__name__, self._type.name, len(self._rows))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return (self._type == other._type and self._rows.shape == other._rows.shape
                and bool((self._rows == other._rows).all()) and self._extra == other._extra)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __reduce__(self):
        return (_rebuild, (type(self).__name__, int(self._type), self._rows.copy(), list(self._extra)))

    # ---- for the engine ----
    def rows(self):
        """The N x 3 uint64 array (addr, len, devId): do not modify."""
        return self._rows


def _rebuild(cls_name, mem_type, rows, extra):
    cls = {"nixlXferDList": nixlXferDList, "nixlRegDList": nixlRegDList, "nixlRemoteDList": nixlRemoteDList}[cls_name]
    obj = cls.__new__(cls)
    obj._type = _mem_type(mem_type)
    obj._rows = np.array(rows, dtype=np.uint64).reshape(-1, 3)
    obj._extra = list(extra)
    if len(obj._extra) != len(obj._rows):
        raise nixlInvalidParamError("malformed pickled descriptor list")
    return obj


class nixlXferDList(_DescList):
    """A transfer list: ``(addr, len, devId)`` descriptors of one memory type."""


class nixlRegDList(_DescList):
    """A registration list: ``(addr, len, devId, meta)``; an N x 3 array gets meta ``b""``."""

    _width = 4

    def _default_extra(self):
        return b""

    def _extra_of(self, desc):
        meta = desc[3]
        if isinstance(meta, str):
            return meta.encode()
        if isinstance(meta, (bytes, bytearray)):
            return bytes(meta)
        raise TypeError("descriptor meta must be str or bytes, not %s" % type(meta).__name__)

    def _tuple(self, i):
        return super()._tuple(i) + (self._extra[i],)

    def trim(self):
        """The same descriptors as a transfer list, without the metas."""
        out = nixlXferDList(self._type)
        out._rows = self._rows.copy()
        out._extra = [None] * len(out._rows)
        return out


class nixlRemoteDList(_DescList):
    """A remote list: ``(addr, len, devId, agent_name)``."""

    _width = 4

    def _default_extra(self):
        return ""

    def _extra_of(self, desc):
        name = desc[3]
        if isinstance(name, (bytes, bytearray)):
            return bytes(name).decode()
        if isinstance(name, str):
            return name
        raise TypeError("descriptor agent name must be str or bytes")

    def _tuple(self, i):
        return super()._tuple(i) + (self._extra[i],)
