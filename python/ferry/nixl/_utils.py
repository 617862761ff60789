"""``nixl._utils``: the helpers NIXL's tests and examples use to make and check raw memory."""

import ctypes

_libc = ctypes.CDLL(None)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
_libc.free.argtypes = (ctypes.c_void_p,)
_libc.free.restype = None

_PAGE = 4096


def malloc_passthru(size):
    """The address of ``size`` fresh bytes, 4 KiB aligned (free with ``free_passthru``)."""
    size = int(size)
    if size <= 0:
        raise ValueError("size must be positive")
    addr = _libc.aligned_alloc(_PAGE, (size + _PAGE - 1) // _PAGE * _PAGE)
    if not addr:
        raise MemoryError("aligned_alloc of %d bytes failed" % size)
    return addr


def free_passthru(addr):
    _libc.free(ctypes.c_void_p(int(addr)))


def ba_buf(addr, size):
    """Fills ``size`` bytes at ``addr`` with 0xba."""
    ctypes.memset(int(addr), 0xBA, int(size))


def verify_transfer(addr1, addr2, size):
    """Raises AssertionError unless the ``size`` bytes at both addresses are equal."""
    a = ctypes.string_at(int(addr1), int(size))
    b = ctypes.string_at(int(addr2), int(size))
    if a != b:
        first = next(i for i in range(len(a)) if a[i] != b[i])
        raise AssertionError("transfer mismatch: %d bytes differ from byte %d on" % (size, first))
