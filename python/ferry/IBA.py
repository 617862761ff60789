"""InfiniBand Architecture values the verbs interface uses: GIDs, GUIDs, P_Keys, Q_Keys, MTU and
rate codes, timer codes (the `rdma.IBA` names of the verbs specification).

ferry has no subnet manager or MADs, so this holds only what paths and queue pairs need.
"""

from __future__ import annotations

import ipaddress as _ipaddress
import math as _math
import sys as _sys
import types as _types
from typing import Optional, Tuple, Union

__all__ = [
    "GID", "GUID", "PKEY_DEFAULT", "DEFAULT_PKEY", "PKEY_PARTIAL_DEFAULT", "PKEY_MEMBERSHIP_BIT",
    "IB_DEFAULT_QP0_QKEY", "IB_DEFAULT_QP1_QKEY", "LID_PERMISSIVE", "LID_MULTICAST",
    "GID_DEFAULT_PREFIX", "MTU_256", "MTU_512", "MTU_1024", "MTU_2048", "MTU_4096",
    "PR_RATE_2Gb5", "PR_RATE_10Gb", "PR_RATE_30Gb", "PR_RATE_5Gb", "PR_RATE_20Gb",
    "PR_RATE_40Gb", "PR_RATE_60Gb", "PR_RATE_80Gb", "PR_RATE_120Gb", "mtu_bytes", "to_timer",
    "from_timer", "const_str",
]

#: The default (full member) partition key.
PKEY_DEFAULT = 0xFFFF
#: Same as :data:`PKEY_DEFAULT` (the spelling used in path-record properties).
DEFAULT_PKEY = PKEY_DEFAULT
#: The default partition key with limited membership.
PKEY_PARTIAL_DEFAULT = 0x7FFF
#: The full-membership bit of a P_Key.
PKEY_MEMBERSHIP_BIT = 0x8000

#: Q_Key of QP0.
IB_DEFAULT_QP0_QKEY = 0
#: The well-known Q_Key of QP1. Its high bit is set: a UD send with this remote Q_Key uses the
#: sending QP's own Q_Key (IBA 10.2.5), so two QPs set up with it talk to each other.
IB_DEFAULT_QP1_QKEY = 0x80010000

#: The permissive LID (any port).
LID_PERMISSIVE = 0xFFFF
#: The first multicast LID.
LID_MULTICAST = 0xC000
#: The link-local subnet prefix (fe80::/64), as the upper 64 bits of a GID.
GID_DEFAULT_PREFIX = 0xFE80 << 48

# Path MTU codes (the same numbers as ibv_mtu).
MTU_256 = 1
MTU_512 = 2
MTU_1024 = 3
MTU_2048 = 4
MTU_4096 = 5

# Path record rate codes (the same numbers as ibv_rate).
PR_RATE_2Gb5 = 2
PR_RATE_10Gb = 3
PR_RATE_30Gb = 4
PR_RATE_5Gb = 5
PR_RATE_20Gb = 6
PR_RATE_40Gb = 7
PR_RATE_60Gb = 8
PR_RATE_80Gb = 9
PR_RATE_120Gb = 10


def mtu_bytes(code: int) -> int:
    """Bytes of an MTU code: 1 -> 256 ... 5 -> 4096. Raises ValueError for another code."""
    if code not in (MTU_256, MTU_512, MTU_1024, MTU_2048, MTU_4096):
        raise ValueError("unknown MTU code %r" % (code,))
    return 128 << code


def to_timer(seconds: float) -> int:
    """The IBA timer code (4.096 us * 2**code) of the shortest time at least `seconds` long,
    between 1 and 31 (0 means 'infinite' and is never returned)."""
    if seconds <= 0:
        return 1
    code = int(_math.ceil(_math.log2(seconds / 4.096e-6)))
    return max(1, min(31, code))


def from_timer(code: int) -> float:
    """Seconds of an IBA timer code (4.096 us * 2**code)."""
    return 4.096e-6 * (2 ** code)


def const_str(prefix: str, value: int, with_prefix: bool = False, mod: Optional[_types.ModuleType] = None) -> str:
    """The name of the constant starting with `prefix` whose value is `value` in module `mod`
    (default: :mod:`ferry.verbs`), e.g. ``const_str("IBV_WC_", 10)`` -> ``"REM_ACCESS_ERR"``.
    Unknown values give their number."""
    if mod is None:
        mod = _sys.modules.get("ferry.verbs")
    if mod is not None:
        for name in sorted(vars(mod)):
            if name.startswith(prefix) and getattr(mod, name) == value:
                return name if with_prefix else name[len(prefix):]
    return "%s%r" % (prefix if with_prefix else "", value)


#: What :class:`GID` takes: None, a GID, bytes, an int or the IPv6 text form.
GIDLike = Union["GID", bytes, bytearray, memoryview, int, str, None]
#: What :class:`GUID` takes: None, a GUID, bytes, an int or hex digits.
GUIDLike = Union["GUID", bytes, bytearray, memoryview, int, str, None]


class GID(bytes):
    """A 128-bit global identifier, as 16 bytes in network order. Prints like an IPv6 address.

    ``GID("fe80::2:c903:0:1491")``, ``GID(b"...16 bytes...", raw=True)``, ``GID(int)`` and
    ``GID(other_gid)`` all work. For ferry's software devices a GID names a verbs context: its
    IPv4 address in the last four bytes and its port in bytes 8-9."""

    __slots__ = ()

    def __new__(cls, value: GIDLike = None, raw: bool = False) -> GID:
        """``value`` as a GID: None (all zero), a GID, 16 bytes (any length with ``raw``), a
        128-bit int or the IPv6 text form. ValueError for a value out of range or malformed text,
        TypeError for another type."""
        if value is None:
            data = bytes(16)
        elif isinstance(value, GID):
            data = bytes(value)
        elif isinstance(value, (bytes, bytearray, memoryview)) and (raw or len(value) == 16):
            data = bytes(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            if value < 0 or value >= 1 << 128:
                raise ValueError("a GID is a 128-bit unsigned number")
            data = value.to_bytes(16, "big")
        elif isinstance(value, str):
            text = value.strip()
            try:
                data = _ipaddress.IPv6Address(text).packed
            except ValueError:
                raise ValueError("%r is not a GID (IPv6 address form)" % (value,)) from None
        else:
            raise TypeError("cannot make a GID from %r" % (type(value).__name__,))
        if len(data) != 16:
            raise ValueError("a GID is 16 bytes, got %d" % len(data))
        return super().__new__(cls, data)

    def __int__(self) -> int:
        return int.from_bytes(self, "big")

    @property
    def prefix(self) -> int:
        """The upper 64 bits (subnet prefix)."""
        return int(self) >> 64

    @property
    def guid(self) -> GUID:
        """The lower 64 bits as a :class:`GUID`."""
        return GUID(bytes(self)[8:], raw=True)

    def is_zero(self) -> bool:
        """Whether all 128 bits are 0 (no GID)."""
        return not any(self)

    def __str__(self) -> str:
        return str(_ipaddress.IPv6Address(bytes(self)))

    def __repr__(self) -> str:
        return "GID(%r)" % str(self)

    def __reduce__(self) -> Tuple[type, Tuple[bytes, bool]]:
        return (GID, (bytes(self), True))


class GUID(bytes):
    """A 64-bit globally unique identifier, 8 bytes in network order; prints as four groups of
    four hex digits (``0002:c903:0000:1491``)."""

    __slots__ = ()

    def __new__(cls, value: GUIDLike = None, raw: bool = False) -> GUID:
        """``value`` as a GUID: None (all zero), a GUID, 8 bytes (any length with ``raw``), a
        64-bit int or hex digits (colons and a ``0x`` prefix allowed). ValueError for a value out
        of range or malformed text, TypeError for another type."""
        if value is None:
            data = bytes(8)
        elif isinstance(value, GUID):
            data = bytes(value)
        elif isinstance(value, (bytes, bytearray, memoryview)) and (raw or len(value) == 8):
            data = bytes(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            if value < 0 or value >= 1 << 64:
                raise ValueError("a GUID is a 64-bit unsigned number")
            data = value.to_bytes(8, "big")
        elif isinstance(value, str):
            digits = value.replace(":", "")
            if digits.lower().startswith("0x"):
                digits = digits[2:]
            try:
                data = int(digits, 16).to_bytes(8, "big")
            except (ValueError, OverflowError):
                raise ValueError("%r is not a GUID" % (value,)) from None
        else:
            raise TypeError("cannot make a GUID from %r" % (type(value).__name__,))
        if len(data) != 8:
            raise ValueError("a GUID is 8 bytes, got %d" % len(data))
        return super().__new__(cls, data)

    def __int__(self) -> int:
        return int.from_bytes(self, "big")

    def __str__(self) -> str:
        h = bytes(self).hex()
        return ":".join(h[i:i + 4] for i in range(0, 16, 4))

    def __repr__(self) -> str:
        return "GUID(%r)" % str(self)

    def __reduce__(self) -> Tuple[type, Tuple[bytes, bool]]:
        return (GUID, (bytes(self), True))
