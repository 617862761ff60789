"""RDMA READ between two endpoints, as in the Endpoint API document (docs/endpoint.md).

    python examples/python/p2p_rdma_rc_read.py

Both endpoints live in this process and exchange their metadata directly; between processes the
same dicts travel over any channel (they are JSON-serialisable). The initiator reads the target's
tensor: first the document's 8 bytes (local[0:8] = remote[8:16]), then the whole region.
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

    tensor = torch.zeros([NBYTES], dtype=torch.uint8)
    remote_tensor = torch.randint(0, 256, [NBYTES], dtype=torch.uint8, generator=torch.Generator().manual_seed(1))

    local_handle = initiator.register_memory_region(
        "kv",
        tensor.data_ptr(),
        int(tensor.storage_offset()),
        tensor.numel() * tensor.itemsize,
    )
    target.register_memory_region(
        "kv",
        remote_tensor.data_ptr(),
        int(remote_tensor.storage_offset()),
        remote_tensor.numel() * remote_tensor.itemsize,
    )
    remote_handle = initiator.register_remote_memory_region(
        "kv",
        target.endpoint_info()["mr_info"]["kv"],
    )

    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())

    future = initiator.read(
        [
            # local_mr, remote_mr, local_offset, remote_offset, length
            (local_handle, remote_handle, 0, 8, 8),
        ],
        None,
    )
    future.wait()
    ok = torch.equal(tensor[:8], remote_tensor[8:16]) and not tensor[8:].any()

    # The whole region: the read is split into work requests and completes once every byte is here.
    initiator.read([(local_handle, remote_handle, 0, 0, NBYTES)], None).wait()
    ok = ok and torch.equal(tensor, remote_tensor)

    initiator.shutdown()
    target.shutdown()
    print("read: 8 bytes from remote offset 8, then %d bytes, %s" % (NBYTES, "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
