"""SEND/RECV of torch tensors between two endpoints, as in the Endpoint API document
(docs/endpoint.md).

    python examples/python/p2p_rdma_rc_send_recv_torch.py

CPU tensors are registered directly (the registration keeps them alive). The receive is posted
before the send, as in the document; a message that arrives before its ``recv()`` is kept until
one comes. Sends and receives are matched by order. The second message is larger than one
receive buffer (64 KiB by default) and travels in fragments.
"""

import sys

import torch

from ferry import RDMAEndpoint, available_nic


def main():
    devices = available_nic()
    assert devices, "No RDMA devices available"

    initiator = RDMAEndpoint(device_name=devices[0], ib_port=1, link_type="RoCE")
    target = RDMAEndpoint(device_name=devices[-1], ib_port=1, link_type="RoCE")

    send_tensor = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    recv_tensor = torch.zeros_like(send_tensor)
    nbytes = send_tensor.numel() * send_tensor.element_size()
    send_handle = initiator.register_memory_region("send", send_tensor)
    recv_handle = target.register_memory_region("recv", recv_tensor)

    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())

    # The document's message: 4096 bytes.
    recv_future = target.recv([(recv_handle, 0, 4096)], None)
    send_future = initiator.send([(send_handle, 0, 4096)], None)

    send_future.wait()
    recv_future.wait()
    ok = recv_future.nbytes() == 4096 and torch.equal(recv_tensor[:1024], send_tensor[:1024]) \
        and not recv_tensor[1024:].any()

    # The whole tensor in one message.
    recv_future = target.recv([(recv_handle, 0, nbytes)], None)
    initiator.send([(send_handle, 0, nbytes)], None).wait()
    recv_future.wait()
    ok = ok and recv_future.nbytes() == nbytes and torch.equal(recv_tensor, send_tensor)

    initiator.shutdown()
    target.shutdown()
    print("send/recv: a 4096-byte message, then a %d-byte tensor, %s" % (nbytes, "verified" if ok else "CORRUPT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
