"""ferry.connect run by programs written against Dynamo's ``dynamo.nixl_connect``.

Those programs await what the document's own form returns at once (``await
connector.create_readable(...)``, ``with await connector.create_writable(...) as op``), describe
memory as ``(array, "cpu")`` or ``(ptr, size, device, ref)``, hand the metadata over as
``model_dump()``'s dict and ``RdmaMetadata.model_validate`` it on the other side, and read
``connector.hostname``, ``op.operation_kind``, ``read.results()`` and ``str(op.status)``. Each
test crosses two processes as such a program does (connect_peer.py is the other one, driven as in
test_connect.py), and checks every byte. The document's own synchronous forms are test_connect.py's.

CUDA forms are made and inspected here everywhere, and used only where CUDA's driver is not usable:
each is then refused with ferry.NotSupported naming the driver's reason, before any registration (an
address of a made-up CUDA array that is not mapped in this process stands for device memory:
reading it as host memory would crash the test). Where the driver is usable CUDA descriptors move
(tests/python/test_gpu.py).
"""

import asyncio
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin on 2 cores

import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ferry  # noqa: E402
import ferry._core  # noqa: E402
from ferry.connect import (Connector, Descriptor, Device, DeviceKind, OperationKind,  # noqa: E402
                           OperationStatus, PassiveOperation, RdmaMetadata, ReadableOperation,
                           ReadOperation, WritableOperation, WriteOperation)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from connect_peer import pattern  # noqa: E402
from stopped import stop_process  # noqa: E402
from test_connect import Peer, run, waited  # noqa: E402

S = OperationStatus
SIZE = 1 << 20


class CudaArray:
    """An array that exports only ``__cuda_array_interface__``, as a CuPy array does."""

    def __init__(self, shape, typestr="<f4", ptr=0x7F0000001000):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": None, "version": 3}


def test_an_awaited_readable_is_read_by_a_peer_that_validates_the_dumped_metadata():
    async def main():
        async with Connector() as connector, Peer() as peer:
            src = pattern(201, SIZE)
            with await connector.create_readable(Descriptor((src, "cpu"))) as readable:
                assert isinstance(readable, ReadableOperation) and readable.status == S.INITIALIZED
                assert readable.operation_kind == OperationKind.READ and str(readable.status) == "INIT"
                metadata = readable.metadata().model_dump()   # a dict, as over a JSON request body
                begun, done = await peer.transfer("read", metadata=metadata, sizes=[SIZE], seeds=[201],
                                                  list=False, form="array_device", results=True)
                assert done["status"] == "COMPLETE" and done["equal"] == [True], done
                assert done["results"] is True, done
                assert await waited(readable) is None
            assert readable.status == S.COMPLETE and str(readable.status) == "DONE"
            assert np.array_equal(src, pattern(201, SIZE))

            # The document's synchronous form gives the same operation; awaiting it gives it back.
            plain = connector.create_readable(Descriptor(src))
            assert isinstance(plain, ReadableOperation) and (await plain) is plain
            begun, done = await peer.transfer("read", metadata=plain.metadata().model_dump_json(),
                                              sizes=[SIZE], seeds=[201])
            assert done["status"] == "COMPLETE" and done["equal"] == [True], done
            assert await waited(plain) is None

    run(main())


def test_an_awaited_writable_is_written_by_a_peer_with_address_descriptors():
    async def main():
        async with Connector() as connector, Peer() as peer:
            dst = [np.zeros(SIZE, np.uint8), np.zeros(4096, np.uint8)]
            descs = [Descriptor((dst[0], Device("cpu"))), Descriptor((dst[1], "cpu"))]
            with await connector.create_writable(descs) as writable:
                assert isinstance(writable, WritableOperation) and isinstance(writable, PassiveOperation)
                assert writable.operation_kind == OperationKind.WRITE
                assert all(d.is_registered for d in descs)
                begun, done = await peer.transfer("write", metadata=writable.metadata().model_dump(),
                                                  sizes=[SIZE, 4096], seeds=[202, 203], form="ptr_size")
                assert done["status"] == "COMPLETE", done
                assert await waited(writable) is None
            assert writable.status == S.COMPLETE and not any(d.is_registered for d in descs)
            assert np.array_equal(dst[0], pattern(202, SIZE)) and np.array_equal(dst[1], pattern(203, 4096))

    run(main())


def test_begin_read_and_begin_write_of_a_peers_awaited_operations_with_tuple_descriptors():
    async def main():
        async with Connector() as connector, Peer("--worker-id", "encode-0") as peer:
            # Read: the peer awaits create_readable of (array, "cpu") descriptors.
            r = await peer.call("create", op="r", what="readable", sizes=[SIZE], seeds=[204],
                                form="array_device", awaited=True, list=False)
            dst = np.zeros(SIZE, np.uint8)
            into = Descriptor((dst, "cpu"))
            assert not into.is_registered
            op = await connector.begin_read(RdmaMetadata.model_validate_json(r["metadata"]), into)
            assert isinstance(op, ReadOperation) and op.operation_kind == OperationKind.READ
            assert op.remote.name == "encode-0" and op.connector is connector
            await op.wait_for_completion()
            assert op.status == S.COMPLETE and op.results() == [into] and not into.is_registered
            assert np.array_equal(dst, pattern(204, SIZE))
            owner = await peer.call("wait", op="r")
            assert owner["status"] == "COMPLETE", owner

            # Write: (ptr, size) and (ptr, size, device) descriptors, a list of two.
            w = await peer.call("create", op="w", what="writable", sizes=[SIZE, 8192], awaited=True,
                                form="array_device")
            src = [pattern(205, SIZE), pattern(206, 8192)]
            descs = [Descriptor((src[0].ctypes.data, SIZE)), Descriptor((src[1].ctypes.data, 8192, "cpu"))]
            op = await connector.begin_write(descs, RdmaMetadata.model_validate(json_dict(w["metadata"])))
            assert isinstance(op, WriteOperation) and op.operation_kind == OperationKind.WRITE
            await op.wait_for_completion()
            assert op.status == S.COMPLETE
            owner = await peer.call("wait", op="w", seeds=[205, 206])
            assert owner["status"] == "COMPLETE" and owner["equal"] == [True, True], owner

            # A read cancelled before it ended has no results: results() raises the error that ended
            # it. The owner moves the bytes, so while its process is stopped the read cannot end
            # before the cancel (1 MiB on the same host would otherwise land within the call).
            r = await peer.call("create", op="r2", what="readable", sizes=[SIZE], seeds=[207], awaited=True)
            stop_process(peer.proc.pid)
            try:
                op = await connector.begin_read(r["metadata"], Descriptor((np.zeros(SIZE, np.uint8), "cpu")))
                assert op.status == S.IN_PROGRESS
                op.cancel()
            finally:
                os.kill(peer.proc.pid, signal.SIGCONT)
            assert op.status == S.CANCELLED and str(op.status) == "STOP"
            with pytest.raises(ferry.Cancelled):
                op.results()
            owner = await peer.call("wait", op="r2")
            assert owner["status"] in ("ERRORED", "CANCELLED"), owner

    run(main())


def json_dict(text):
    return RdmaMetadata.model_validate_json(text).model_dump()


def cuda_forms():
    """A Descriptor of each CUDA form, over an address nothing maps here."""
    return [Descriptor((CudaArray((256, 4)), "cuda:1")),
            Descriptor((0x7F0000001000, 4096, "cuda:0", None)),
            Descriptor((0x7F0000001000, 4096, Device((DeviceKind.CUDA, 2)))),
            Descriptor((0x7F0000001000, 4096, "gpu:3"))]


@pytest.mark.skipif(ferry._core.cuda()["usable"], reason="CUDA's driver is usable here: CUDA descriptors "
                    "are used, not refused (tests/python/test_gpu.py)")
def test_cuda_forms_are_refused_when_used_without_a_usable_driver_naming_why():
    reason = ferry._core.cuda()["reason"]

    async def main():
        async with Connector("prefill-8") as connector, Peer() as peer:
            assert connector.is_cuda_available is False
            r = await peer.call("create", op="r", what="readable", sizes=[4096], seeds=[209])
            w = await peer.call("create", op="w", what="writable", sizes=[4096])
            for d in cuda_forms():
                for use in (lambda: connector.create_readable(d),
                            lambda: connector.create_writable([Descriptor(bytearray(64)), d]),
                            lambda: connector.begin_read(r["metadata"], d),
                            lambda: connector.begin_write(d, w["metadata"]),
                            lambda: d.register_memory(connector)):
                    with pytest.raises(ferry.NotSupported) as refused:
                        result = use()
                        if asyncio.iscoroutine(result):
                            await result
                    assert str(d.device) in str(refused.value) and reason in str(refused.value), refused.value
            for name in ("r", "w"):
                assert (await peer.call("status", op=name))["status"] == "INITIALIZED"

    run(main())


def test_cuda_forms_are_made_and_a_declared_device_must_be_the_memorys():
    async def main():
        async with Connector("prefill-7") as connector, Peer() as peer:
            assert connector.hostname == socket.gethostname() and str(connector) == "prefill-7"
            assert connector.is_cuda_available is ferry._core.cuda()["usable"]
            cuda = cuda_forms()
            assert [(str(d.device), d.size, d.ptr) for d in cuda] == [
                ("cuda:1", 4096, 0x7F0000001000), ("cuda:0", 4096, 0x7F0000001000),
                ("cuda:2", 4096, 0x7F0000001000), ("cuda:3", 4096, 0x7F0000001000)]
            r = await peer.call("create", op="r", what="readable", sizes=[4096], seeds=[208])

            # A device given with an array must be the one its memory is on.
            with pytest.raises(ferry.InvalidArgument):
                Descriptor((np.zeros(64, np.uint8), "cuda:0"))
            with pytest.raises(ferry.InvalidArgument):
                Descriptor((CudaArray((16,)), "cpu"))
            with pytest.raises(ferry.InvalidArgument):
                Descriptor((np.zeros(64, np.uint8), "tpu"))
            with pytest.raises(ferry.InvalidArgument):
                Descriptor((1, 2, "cpu", None, "extra"))
            # What metadata carries for a descriptor, and what it cannot give back.
            host = Descriptor((np.zeros(64, np.uint8), "cpu"))
            assert host.metadata == host.metadata() and (host.metadata.size, host.metadata.device) == (64, "cpu")
            with pytest.raises(ferry.NotSupported):
                RdmaMetadata.model_validate_json(r["metadata"]).to_descriptors()
            with pytest.raises(ferry.NotSupported):
                Descriptor.from_serialized(host.metadata)
            host.register_memory(connector)   # host memory: nothing to refuse
            # The host forms move bytes.
            dst = np.zeros(4096, np.uint8)
            op = await connector.begin_read(json_dict(r["metadata"]), Descriptor((dst, "cpu")))
            assert await waited(op) is None and np.array_equal(dst, pattern(208, 4096))
            assert [str(k) for k in (DeviceKind.HOST, DeviceKind.CUDA, OperationKind.READ, OperationKind.WRITE)] \
                == ["cpu", "cuda", "READ", "WRITE"]
            assert [str(s) for s in OperationStatus][1:] == ["INIT", "PROC", "DONE", "STOP", "ERR"]

    run(main())
