"""GPU memory (docs/gpu.md): ferry loads CUDA's driver at run time to tell GPU memory from host
memory, never reads the one as the other, and moves GPU memory where the driver is usable.

Everywhere: ``ferry info`` (text and ``--json``) names the driver and, where it is not usable,
why: none on this host, a library that is no driver, a ``FERRY_CUDA_LIBRARY`` that does not exist;
``ferry._core.cuda()`` says the same to Python. A process without a usable driver refuses CUDA
memory in every Python layer, naming the driver's reason: ``Connector.is_cuda_available`` is
False, a CUDA Descriptor and a CUDA tensor raise ``ferry.NotSupported``, ferry.nixl's VRAM_SEG
raises ``nixlNotFoundError``.

With a driver and a device (marker ``gpu``, ctest label ``gpu``): memory a GPU holds registers and
moves, the bytes checked on the device: the Endpoint API (WRITE, READ, send/recv, between two
endpoints and to and from host memory; between two processes by CUDA IPC), ferry.connect (a readable and a writable operation on
CUDA tensors between two Connectors), ferry.nixl (VRAM registrations, a WRITE between two agents).
Without a usable driver these tests skip with its reason, and fail instead under
``FERRY_REQUIRE_CUDA=1``. The memory comes from torch or CuPy where they have CUDA, else from the
driver itself (``DriverBuffer``): so CI runs them too (ctest ``python.test_gpu.test_driver``), with
``FERRY_CUDA_LIBRARY`` naming the test driver, libferry_test_cuda.so, whose device memory faults
when the host touches it."""

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
import ferry._core

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FERRY = os.path.join(os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests")), "..", "ferry")
NBYTES = (1 << 20) + 7  # not a multiple of any chunk, frame or page size
WAIT = 60.0


def ferry_info(*args, **env):
    if not os.access(FERRY, os.X_OK):
        pytest.skip("the ferry program is not built at %s" % FERRY)
    out = subprocess.run([FERRY, "info", *args], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr
    return out.stdout


def cuda_line(text):
    lines = [line for line in text.splitlines() if line.startswith("cuda: ")]
    assert len(lines) == 1, text
    return lines[0]


def pattern(seed, n=NBYTES):
    i = np.arange(n, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def test_ferry_info_names_the_cuda_driver_and_why_it_is_not_usable():
    doc = json.loads(ferry_info("--json"))["cuda"]
    line = cuda_line(ferry_info())
    assert doc["library"] == "libcuda.so.1"
    if doc["usable"]:
        assert doc["devices"] >= 1 and doc["driver_version"] >= 1000 and doc["reason"] == ""
        assert line.startswith("cuda: usable: driver %d." % (doc["driver_version"] // 1000)), line
    else:
        assert doc["reason"] and (doc["devices"], doc["driver_version"]) == (0, 0)
        assert line == "cuda: not usable: " + doc["reason"]


@pytest.mark.parametrize("library, why", [
    ("libz.so.1", "libz.so.1 has no cuInit (not a CUDA driver?)"),
    ("/nonexistent/libcuda.so.1", "cannot load /nonexistent/libcuda.so.1 (no NVIDIA driver here): "),
])
def test_a_library_that_is_no_driver_is_named(library, why):
    assert cuda_line(ferry_info(FERRY_CUDA_LIBRARY=library)).startswith("cuda: not usable: " + why)
    doc = json.loads(ferry_info("--json", FERRY_CUDA_LIBRARY=library))["cuda"]
    assert (doc["usable"], doc["library"]) == (False, library) and doc["reason"].startswith(why)


def test_python_sees_the_driver_as_ferry_info_does():
    from ferry.connect import Connector
    doc = json.loads(ferry_info("--json"))["cuda"]
    seen = ferry._core.cuda()
    assert seen == doc
    assert isinstance(seen["usable"], bool) and isinstance(seen["reason"], str)
    assert bool(seen["reason"]) is not seen["usable"]  # a reason exactly when it is not usable
    assert Connector().is_cuda_available is seen["usable"]


# What a process without a usable driver says when given CUDA memory, layer by layer. The memory is
# host memory: were it taken, nothing would crash, and the answers would say so.
WITHOUT_DRIVER = r"""
import json, sys
import numpy as np
import ferry, ferry._core, ferry.nixl
from ferry.connect import Connector, Descriptor


class CudaDevice:
    type, index = "cuda", 0

    def __str__(self):
        return "cuda:0"


class CudaTensor:
    '''What ferry sees of a torch CUDA tensor: data_ptr(), numel(), element_size(), device.'''

    def __init__(self, array):
        self.array = array
        self.device = CudaDevice()

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True


def refusal(call, kind):
    try:
        call()
    except kind as e:
        return str(e)
    return None


memory = np.zeros(4096, np.uint8)
from ferry.objects import ObjectStore, ObjectClient
store = ObjectStore.start()
objects = ObjectClient(store.url, rdma=False)
objects.create_bucket("nodriver")
connector = Connector()
endpoint = ferry.RDMAEndpoint()
agent = ferry.nixl.nixl_agent("no-driver")
out = {
    "cuda": ferry._core.cuda(),
    "is_cuda_available": connector.is_cuda_available,
    "descriptor": refusal(lambda: Descriptor((memory.ctypes.data, 4096, "cuda:0", memory)).register_memory(connector),
                          ferry.NotSupported),
    "endpoint": refusal(lambda: endpoint.register_memory_region("t", CudaTensor(memory)), ferry.NotSupported),
    "nixl": refusal(lambda: agent.register_memory([(memory.ctypes.data, 4096, 0, "")], "VRAM"),
                    ferry.nixl.nixlNotFoundError),
    "nixl_tensor": refusal(lambda: agent.register_memory([CudaTensor(memory)]), ferry.nixl.nixlNotFoundError),
    "objects_put": refusal(lambda: objects.put("nodriver", "k", CudaTensor(memory)), ferry.NotSupported),
    "objects_get": refusal(lambda: objects.get_into("nodriver", "k", CudaTensor(memory)), ferry.NotSupported),
    "objects_listed": [o.key for o in objects.list("nodriver")],
    "mem_types": agent.get_plugin_mem_types("FERRY"),
    "regions": sorted(endpoint.mr_info()),
}
endpoint.shutdown()
objects.close()
store.stop()
print(json.dumps(out))
"""


def test_without_a_usable_driver_every_layer_refuses_cuda_memory_naming_why():
    library = "/nonexistent/libcuda.so.1"
    env = dict(os.environ, FERRY_CUDA_LIBRARY=library,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", WITHOUT_DRIVER], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    reason = got["cuda"]["reason"]
    assert got["cuda"]["usable"] is False and got["cuda"]["library"] == library
    assert reason.startswith("cannot load %s (no NVIDIA driver here)" % library), reason
    assert got["is_cuda_available"] is False
    for layer in ("descriptor", "endpoint", "nixl", "nixl_tensor", "objects_put", "objects_get"):
        assert got[layer] is not None, "%s took CUDA memory without a usable driver" % layer
        assert reason in got[layer], (layer, got[layer])
    assert "cuda:0" in got["descriptor"] and "cuda:0" in got["endpoint"]
    assert "VRAM_SEG" in got["nixl"] and "VRAM_SEG" in got["nixl_tensor"]
    assert "cuda:0" in got["objects_put"] and "cuda:0" in got["objects_get"], got
    assert got["objects_listed"] == []  # nothing was stored
    assert got["mem_types"] == ["DRAM_SEG"] and got["regions"] == []


# ---- with a GPU ----

class DriverBuffer:
    """Device memory allocated through CUDA's driver API itself (cuMemAlloc), for a process with a
    usable driver but neither torch with CUDA nor CuPy: the test driver (FERRY_CUDA_LIBRARY=
    libferry_test_cuda.so, whose device memory the host cannot touch) or a GPU machine without
    them. ferry sees what it sees of a torch CUDA tensor (data_ptr, numel, element_size, device);
    the test reads and writes its bytes only through the driver's copies."""

    class Device:
        type, index = "cuda", 0

        def __str__(self):
            return "cuda:0"

    _driver = None

    @classmethod
    def driver(cls):
        import ctypes
        if cls._driver is None:
            lib = ctypes.CDLL(ferry._core.cuda()["library"])
            for name, args in (("cuInit", [ctypes.c_uint]),
                               ("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
                               ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
                               ("cuCtxSetCurrent", [ctypes.c_void_p]),
                               ("cuMemAlloc_v2", [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                               ("cuMemcpyHtoD_v2", [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]),
                               ("cuMemcpyDtoH_v2", [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t])):
                getattr(lib, name).argtypes = args
            handle, context = ctypes.c_int(), ctypes.c_void_p()
            assert lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(handle), 0) == 0
            assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0
            assert lib.cuCtxSetCurrent(context) == 0
            cls._driver = lib
        return cls._driver

    def __init__(self, nbytes):
        import ctypes
        self.nbytes = nbytes
        self.device = DriverBuffer.Device()
        ptr = ctypes.c_uint64()
        assert self.driver().cuMemAlloc_v2(ctypes.byref(ptr), nbytes) == 0, "cuMemAlloc failed"
        self.ptr = ptr.value

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.nbytes

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True

    def set(self, host):
        host = np.ascontiguousarray(host, dtype=np.uint8)
        assert host.nbytes == self.nbytes
        assert self.driver().cuMemcpyHtoD_v2(self.ptr, host.ctypes.data, self.nbytes) == 0

    def get(self):
        out = np.empty(self.nbytes, np.uint8)
        assert self.driver().cuMemcpyDtoH_v2(out.ctypes.data, self.ptr, self.nbytes) == 0
        return out


def cuda_buffer(nbytes):
    """(pointer, owner) of nbytes on cuda:0, by torch or CuPy, else through the driver itself
    (DriverBuffer); skips (or fails under FERRY_REQUIRE_CUDA=1) where there is no usable driver."""
    doc = ferry._core.cuda()
    if not doc["usable"]:
        why = "no usable CUDA driver: " + doc["reason"]
        if os.environ.get("FERRY_REQUIRE_CUDA") == "1":
            pytest.fail("FERRY_REQUIRE_CUDA=1: " + why)
        pytest.skip(why)
    try:
        import torch
        if torch.cuda.is_available():
            t = torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0")
            return t.data_ptr(), t
    except ImportError:
        pass
    try:
        import cupy
        a = cupy.zeros(nbytes, dtype=cupy.uint8)
        return a.data.ptr, a
    except ImportError:
        pass
    b = DriverBuffer(nbytes)
    b.set(np.zeros(nbytes, np.uint8))
    return b.ptr, b


def fill(owner, host):
    """Copies the host array into the device buffer, and waits until it is there."""
    if hasattr(owner, "copy_"):  # torch
        import torch
        owner.copy_(torch.from_numpy(np.ascontiguousarray(host)))
        torch.cuda.synchronize()
    elif isinstance(owner, DriverBuffer):
        owner.set(host)
    else:  # CuPy
        import cupy
        owner.set(np.ascontiguousarray(host))
        cupy.cuda.Device(0).synchronize()


def on_host(owner):
    return owner.cpu().numpy() if hasattr(owner, "cpu") else owner.get()


def same_on_device(a, b):
    """Whether two device buffers hold the same bytes, compared by the device (the driver's
    copies, for a DriverBuffer)."""
    if isinstance(a, DriverBuffer):
        return bool(np.array_equal(a.get(), b.get()))
    return bool((a == b).all())


@pytest.mark.gpu
def test_endpoint_api_moves_cuda_memory_both_ways_and_by_send_recv():
    src_ptr, src = cuda_buffer(NBYTES)
    dst_ptr, dst = cuda_buffer(NBYTES)
    _, back = cuda_buffer(NBYTES)
    fill(src, pattern(1))
    start = driver_counts()
    a, b = ferry.RDMAEndpoint(), ferry.RDMAEndpoint()
    try:
        local = a.register_memory_region("src", src_ptr, 0, NBYTES)   # by data_ptr, on both sides
        landing = b.register_memory_region("dst", dst_ptr, 0, NBYTES)
        into = a.register_memory_region("back", back)                   # the tensor or array itself
        host = np.zeros(NBYTES, np.uint8)
        on_a = a.register_memory_region("host", host)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        remote = a.register_remote_memory_region("dst", b.mr_info()["dst"])

        a.write([(local, remote, 0, 0, NBYTES)], None).wait(WAIT)
        assert same_on_device(dst, src), "WRITE: device to device"
        a.read([(into, remote, 0, 0, NBYTES)], None).wait(WAIT)
        assert same_on_device(back, src), "READ: device to device"
        a.read([(on_a, remote, 0, 0, NBYTES)], None).wait(WAIT)
        assert np.array_equal(host, pattern(1)), "READ: device to host"
        host[:] = pattern(2)
        a.write([(on_a, remote, 3, 5, 65536)], None).wait(WAIT)   # host to device: remote offset 3, local 5
        expected = pattern(1)
        expected[3:3 + 65536] = pattern(2)[5:5 + 65536]
        assert np.array_equal(on_host(dst), expected), "WRITE: host to device"

        fill(dst, np.zeros(NBYTES, np.uint8))
        received = b.recv([(landing, 0, NBYTES)], None)
        a.send([(local, 0, NBYTES)], None).wait(WAIT)
        received.wait(WAIT)
        assert received.nbytes() == NBYTES and same_on_device(dst, src), "send/recv: device to device"
        if start is not None:   # a SEND is staged: the sender's and the receiver's staging buffers are pinned
            assert driver_counts()["pinned"] - start["pinned"] >= 2, (start, driver_counts())
        assert np.array_equal(on_host(src), pattern(1)), "the source is unchanged"
    finally:
        a.shutdown()
        b.shutdown()
    deadline = time.monotonic() + WAIT
    while start is not None:   # connections end on their own threads after shutdown returns
        end = driver_counts()
        if end["unpinned"] - start["unpinned"] == end["pinned"] - start["pinned"]:
            break
        assert time.monotonic() < deadline, ("a staging buffer stayed pinned after its connection went", start, end)
        time.sleep(0.01)


def driver_counts():
    """The test driver's (libferry_test_cuda.so) copies, IPC opens and host pinnings so far in this
    process: {"htod", "dtoh", "dtod", "opened", "closed", "pinned", "unpinned"}; None with any
    other driver."""
    import ctypes
    counts = getattr(ctypes.CDLL(ferry._core.cuda()["library"]), "ferry_test_cuda_counts", None)
    if counts is None:
        return None
    out = (ctypes.c_uint64 * 7)()
    counts(out)
    return dict(zip(("htod", "dtoh", "dtod", "opened", "closed", "pinned", "unpinned"), out))


class GpuPeer:
    """tests/python/gpu_peer.py: an Endpoint API target in another process whose region "dst" is
    device memory. One JSON line per command and answer; every read has a deadline."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "gpu_peer.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def read(self, timeout=WAIT):
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("line", self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        assert got.get("line"), "the GPU peer did not answer within %s s (exit code %s)" % (timeout, self.proc.poll())
        return json.loads(got["line"])

    def send(self, obj):
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def call(self, **cmd):
        self.send(cmd)
        answer = self.read()
        assert answer.get("ok"), answer
        return answer

    def close(self):
        try:
            if self.proc.poll() is None:
                self.call(cmd="quit")
            self.proc.wait(WAIT)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@pytest.mark.gpu
def test_endpoint_api_moves_cuda_memory_between_processes_device_to_device():
    """Two processes of one host: WRITE and READ between this process's device memory and the
    other's take the same-host path's CUDA IPC (the other's allocation opened here by its handle,
    one device-to-device copy each), not the connection's staging through host memory."""
    src_ptr, src = cuda_buffer(NBYTES)
    back_ptr, back = cuda_buffer(NBYTES)
    fill(src, pattern(7))
    peer = GpuPeer()
    a = ferry.RDMAEndpoint()
    try:
        hello = peer.read()
        local = a.register_memory_region("src", src_ptr, 0, NBYTES)
        into = a.register_memory_region("back", back_ptr, 0, NBYTES)
        a.connect(hello["info"])
        peer.send(a.endpoint_info())
        assert peer.read()["ready"]
        remote = a.register_remote_memory_region("dst", hello["mr"])
        # The first request may go over the connection while the same-host path comes up.
        a.write([(local, remote, 0, 0, 64)], None).wait(WAIT)
        before = driver_counts()
        a.write([(local, remote, 0, 0, NBYTES)], None).wait(WAIT)
        assert peer.call(cmd="digest")["sha256"] == hashlib.sha256(pattern(7).tobytes()).hexdigest(), \
            "WRITE: device to the other process's device"
        peer.call(cmd="fill", seed=8)
        a.read([(into, remote, 0, 0, NBYTES)], None).wait(WAIT)
        after = driver_counts()
        assert np.array_equal(on_host(back), pattern(8)), \
            "READ: the other process's device to this one's"
        if before is not None:   # the test driver: which copies moved the bytes
            assert after["opened"] >= 1, "the other process's allocation was opened by its IPC handle"
            assert after["dtod"] - before["dtod"] == 2, (before, after)
            assert (after["htod"], after["dtoh"]) == (before["htod"], before["dtoh"]), \
                "no byte was staged through host memory"
    finally:
        a.shutdown()
        peer.close()


@pytest.mark.gpu
def test_connector_moves_cuda_tensors_between_two_connectors():
    _, src = cuda_buffer(NBYTES)
    _, dst = cuda_buffer(NBYTES)
    _, written = cuda_buffer(NBYTES)
    fill(src, pattern(3))
    from ferry.connect import Connector, Descriptor, DeviceKind

    async def main():
        async with Connector("gpu-owner") as owner, Connector("gpu-peer") as peer:
            assert owner.is_cuda_available is True and peer.is_cuda_available is True
            source = Descriptor(src)
            assert source.device.kind == DeviceKind.CUDA and source.size == NBYTES
            source.register_memory(owner)   # CUDA memory: nothing to refuse
            readable = owner.create_readable(source)
            # The metadata names the device (the peer's own memory may be anywhere).
            assert [d.device for d in readable.metadata().descriptors] == ["cuda:0"]
            read = await peer.begin_read(readable.metadata().model_dump_json(), Descriptor(dst))
            await asyncio.wait_for(read.wait_for_completion(), WAIT)
            await asyncio.wait_for(readable.wait_for_completion(), WAIT)
            assert same_on_device(dst, src), "a readable operation on a CUDA tensor, read into another"
            writable = owner.create_writable(Descriptor(written))
            assert [d.device for d in writable.metadata().descriptors] == ["cuda:0"]
            host = np.zeros(NBYTES, np.uint8)   # host memory reads from the device too
            again = owner.create_readable(Descriptor(src))
            into_host = await peer.begin_read(again.metadata(), Descriptor(host))
            await asyncio.wait_for(into_host.wait_for_completion(), WAIT)
            await asyncio.wait_for(again.wait_for_completion(), WAIT)
            assert np.array_equal(host, pattern(3)), "a readable operation on a CUDA tensor, read into host memory"
            write = await peer.begin_write(Descriptor(src), writable.metadata().model_dump_json())
            await asyncio.wait_for(write.wait_for_completion(), WAIT)
            await asyncio.wait_for(writable.wait_for_completion(), WAIT)
            assert same_on_device(written, src), "a writable operation on a CUDA tensor, written from another"

    asyncio.run(asyncio.wait_for(main(), 2 * WAIT))


@pytest.mark.gpu
def test_nixl_registers_vram_and_writes_it_between_two_agents():
    import ferry.nixl as nixl
    _, src = cuda_buffer(NBYTES)
    _, dst = cuda_buffer(NBYTES)
    fill(src, pattern(4))
    a, b = nixl.nixl_agent("gpu-initiator"), nixl.nixl_agent("gpu-target")
    try:
        assert "VRAM_SEG" in a.get_backend_mem_types("UCX")
        local = a.register_memory(src)
        target = b.register_memory(dst)
        assert local.getType() == nixl.VRAM_SEG and target.getType() == nixl.VRAM_SEG
        assert a.add_remote_agent(b.get_agent_metadata()) == b"gpu-target"
        handle = a.initialize_xfer("WRITE", a.get_xfer_descs(src), a.get_xfer_descs(dst), "gpu-target", b"vram")
        a.transfer(handle)
        deadline = time.monotonic() + WAIT
        while a.check_xfer_state(handle) != "DONE":
            assert time.monotonic() < deadline, "the VRAM WRITE did not finish within %s s" % WAIT
            time.sleep(0.002)
        assert same_on_device(dst, src), "WRITE: VRAM to VRAM between two agents"
        deadline = time.monotonic() + WAIT
        while not b.get_new_notifs().get("gpu-initiator"):
            assert time.monotonic() < deadline, "no notification after the VRAM WRITE"
            time.sleep(0.002)
        # Within one agent a transfer is a host memmove: VRAM is refused there, never touched.
        a.register_memory(dst)
        loop = a.initialize_xfer("WRITE", a.get_xfer_descs(src), a.get_xfer_descs(dst), "gpu-initiator")
        with pytest.raises(nixl.nixlNotSupportedError, match="VRAM_SEG"):
            a.transfer(loop)
        a.release_xfer_handle(loop)
        a.release_xfer_handle(handle)
        a.deregister_memory(local)
        b.deregister_memory(target)
    finally:
        a.agent.close()
        b.agent.close()


@pytest.mark.gpu
@pytest.mark.parametrize("rdma", [False, True], ids=["http", "rdma"])
def test_object_client_puts_from_and_gets_into_cuda_memory(rdma):
    from ferry.objects import ObjectStore, ObjectClient
    _, src = cuda_buffer(NBYTES)
    _, dst = cuda_buffer(NBYTES + 4096)
    fill(src, pattern(6))
    with ObjectStore.start() as store:
        client = ObjectClient(store.url, rdma=rdma)
        assert client.rdma is rdma
        client.create_bucket("gpu-objects")
        client.put("gpu-objects", "tensor", src)   # over HTTP: copied from the device a piece at a time
        assert client.head("gpu-objects", "tensor")["size"] == NBYTES
        assert np.array_equal(np.frombuffer(client.get("gpu-objects", "tensor"), np.uint8), pattern(6))
        assert client.get_into("gpu-objects", "tensor", dst) == NBYTES
        landed = on_host(dst)
        assert np.array_equal(landed[:NBYTES], pattern(6)), "GET into device memory"
        assert not landed[NBYTES:].any(), "nothing past the object"
        client.close()
