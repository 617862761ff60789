"""A verbs context, a protection domain and memory registrations: the opening example of the verbs
interface (section 7 of the verbs specification) and its memory examples (7.2.6), on ferry.verbs.

    python examples/verbs/context_pd_memory.py

The program checks what each registration covers: an MR over a str holds its UTF-8 bytes
(read-only), MRs over a bytearray and an mmap cover their memory, and SGEs are cut from an MR.
Closing the context closes its PD and the PD's MRs (docs/python-verbs.md).
"""

import ctypes
import mmap
import sys

import ferry
import ferry.verbs as ibv


def address_of(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def main():
    checks = []
    end_port = ferry.get_end_port()
    with ferry.get_verbs(end_port) as ctx:
        pd = ctx.pd()

        # --- 7.2.6: anything with the buffer protocol; writable MRs need a mutable buffer ---
        s = "Hello"
        mr_str = pd.mr(s, ibv.IBV_ACCESS_REMOTE_READ)
        checks.append(ctypes.string_at(mr_str.addr, mr_str.length) == b"Hello")

        # The specification passes IBV_ACCESS_REMOTE_WRITE alone; verbs (libibverbs and ferry alike)
        # require LOCAL_WRITE with it, so both bits are given here.
        s = bytearray(256)
        mr = pd.mr(s, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        checks.append((mr.addr, mr.length) == (address_of(s), 256))
        m = mmap.mmap(-1, 256)
        mr_map = pd.mr(m, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE)
        checks.append((mr_map.addr, mr_map.length) == (address_of(m), 256))

        # A writable registration of an immutable object is refused.
        try:
            pd.mr(b"immutable", ibv.IBV_ACCESS_LOCAL_WRITE)
            checks.append(False)
        except TypeError:
            checks.append(True)

        # SGEs are constructed through the MR.
        sge = mr.sge()
        checks.append((sge.addr, sge.length, sge.lkey) == (mr.addr, 256, mr.lkey))
        sge = mr.sge(length=128, off=10)
        checks.append((sge.addr, sge.length, sge.lkey) == (mr.addr + 10, 128, mr.lkey))

    # The context closed its PD and every MR; the memory belongs to its owners again.
    checks.append(pd.closed and mr.closed and mr_str.closed and mr_map.closed)
    m.close()
    s.extend(b"resizable again")
    ok = all(checks)
    print("context %s, PD, MRs over str, bytearray and mmap, SGEs: %d checks, %s"
          % (end_port, len(checks), "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
