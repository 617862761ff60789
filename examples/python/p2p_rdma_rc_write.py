"""RDMA WRITE between two endpoints, as in the Endpoint API document (docs/endpoint.md).

    python examples/python/p2p_rdma_rc_write.py

The initiator writes into the target's tensor of ones. For a write the tuple's target_offset is
the remote offset and source_offset the local one: ``(local, remote, 0, 8, 8)`` puts local[8:16]
(zeros) at remote[0:8]. Then a 1 MiB pattern overwrites the whole region.
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

    local_tensor = torch.zeros([NBYTES], device="cpu", dtype=torch.uint8)
    remote_tensor = torch.ones([NBYTES], device="cpu", dtype=torch.uint8)

    lhandler = initiator.register_memory_region(
        "buffer",
        local_tensor.data_ptr() + int(local_tensor.storage_offset()),
        local_tensor.numel() * local_tensor.itemsize,
    )
    target.register_memory_region(
        "buffer",
        remote_tensor.data_ptr() + int(remote_tensor.storage_offset()),
        remote_tensor.numel() * remote_tensor.itemsize,
    )
    rhandler = initiator.register_remote_memory_region("buffer", target.endpoint_info()["mr_info"]["buffer"])

    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())

    slot = initiator.write([(lhandler, rhandler, 0, 8, 8)], None)
    slot.wait()
    ok = bool(torch.all(remote_tensor[:8] == 0)) and bool(torch.all(remote_tensor[8:] == 1))

    # The local tensor may be changed again once wait() returned: the write no longer reads it.
    local_tensor.copy_(torch.randint(0, 256, [NBYTES], dtype=torch.uint8, generator=torch.Generator().manual_seed(2)))
    initiator.write([(lhandler, rhandler, 0, 0, NBYTES)], None).wait()
    ok = ok and torch.equal(remote_tensor, local_tensor)

    initiator.shutdown()
    target.shutdown()
    print("write: 8 zero bytes to remote offset 0, then %d bytes, %s" % (NBYTES, "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
