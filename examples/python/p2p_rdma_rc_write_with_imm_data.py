"""RDMA WRITE with immediate data, as in the Endpoint API document (docs/endpoint.md).

    python examples/python/p2p_rdma_rc_write_with_imm_data.py

The target asks for the next immediate (``imm_recv``) before the initiator writes; the immediate
(7) is delivered once all the written bytes are in the target's memory, so the target may read
them as soon as its future completes.
"""

import sys

import torch

from ferry import RDMAEndpoint, available_nic

NBYTES = 1 << 20


def main():
    devices = available_nic()
    assert devices, "No RDMA devices available"

    initiator = RDMAEndpoint(device_name=devices[0], ib_port=1, link_type="RoCE")
    target = RDMAEndpoint(device_name=devices[-1], ib_port=1, link_type="RoCE")

    src = torch.randint(0, 256, [NBYTES], dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    dst = torch.zeros([NBYTES], dtype=torch.uint8)
    local = initiator.register_memory_region("kv", src.data_ptr(), int(src.storage_offset()),
                                             src.numel() * src.itemsize)
    target.register_memory_region("kv", dst.data_ptr(), int(dst.storage_offset()), dst.numel() * dst.itemsize)
    remote = initiator.register_remote_memory_region("kv", target.endpoint_info()["mr_info"]["kv"])

    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())

    # local_mr, remote_mr, target_offset (remote), source_offset (local), length
    assignments = [(local, remote, 0, 0, NBYTES)]

    recv_future = target.imm_recv(None)
    write_future = initiator.write_with_imm(assignments, imm_data=7, stream=None)

    write_future.wait()
    recv_future.wait()
    assert recv_future.imm_data() == 7
    ok = torch.equal(dst, src)

    initiator.shutdown()
    target.shutdown()
    print("write_with_imm: %d bytes, immediate %d, %s" % (NBYTES, recv_future.imm_data(),
                                                          "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
