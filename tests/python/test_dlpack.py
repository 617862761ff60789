"""Memory given as a DLPack producer (``__dlpack__`` / ``__dlpack_device__``) to every registration:
the Endpoint API (endpoints and pools), ferry.verbs (PD.mr), the agent and ferry.connect's
Descriptor. The producers here are neither NumPy arrays nor torch tensors themselves: objects that
only speak DLPack, over NumPy or torch memory. The bytes must land in the producer's own memory
(no copy), the producer must live as long as the registration, memory on another device is
refused, and so is a read-only producer where something must be written into it.

CUDA memory given through ``__cuda_array_interface__`` (as CuPy gives it) is taken by its address,
checked for contiguity, and registered only where CUDA's driver is usable; CUDA memory without an
address and tensors on other devices (mps, xpu) are refused by name. These producers' memory is
host memory, so that nothing here needs a GPU (tests/python/test_gpu.py moves GPU memory)."""

import asyncio
import gc
import weakref

import numpy as np
import pytest

import ferry
import ferry._core
import ferry.path
import ferry.verbs as ibv
import ferry.vtools
from ferry import RDMAEndpoint, RDMAMemoryPool
from ferry._memory import CudaArrayMemory, registrable
from ferry.connect import Connector, Descriptor

try:
    import torch
    import torch.utils.dlpack
except ImportError:  # pragma: no cover - torch is in requirements-dev.txt
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not importable")

SIZE = 1 << 16
WAIT = 10.0


class DLPackOnly:
    """Exports its memory through DLPack only: no buffer protocol, no data_ptr()."""

    def __init__(self, inner, device=None):
        self._inner = inner
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device if self._device is not None else self._inner.__dlpack_device__()

    @property
    def address(self):
        """The address the producer's own memory starts at."""
        if isinstance(self._inner, np.ndarray):
            return self._inner.__array_interface__["data"][0]
        return self._inner.data_ptr()

    def numpy(self):
        """The producer's memory as NumPy sees it (for checking bytes; not what ferry registers)."""
        return self._inner if isinstance(self._inner, np.ndarray) else self._inner.numpy()


class LegacyTorchProducer(DLPackOnly):
    """An older producer: ``__dlpack__(stream=None)`` only, returning torch.utils.dlpack's unversioned capsule."""

    def __dlpack__(self, stream=None):
        return torch.utils.dlpack.to_dlpack(self._inner)


def pattern(seed, n=SIZE):
    return ((np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed)) >> np.uint64(5)).astype(np.uint8)


def producers():
    """(name, factory(array of uint8) -> producer); every factory shares the array's memory."""
    out = [("numpy", lambda a: DLPackOnly(a)),
           ("numpy-float32-2d", lambda a: DLPackOnly(a.view(np.float32).reshape(16, -1)))]
    if torch is not None:
        out += [("torch", lambda a: DLPackOnly(torch.from_numpy(a))),
                ("torch-legacy-capsule", lambda a: LegacyTorchProducer(torch.from_numpy(a)))]
    return out


PRODUCERS = producers()
IDS = [name for name, _ in PRODUCERS]


def cuda_like(device_type):
    return DLPackOnly(np.zeros(64, np.uint8), device=(device_type, 0))


# ---- the conversion ----

@pytest.mark.parametrize("name, make", PRODUCERS, ids=IDS)
def test_conversion_is_a_zero_copy_view_holding_the_producer(name, make):
    backing = np.zeros(SIZE, np.uint8)
    producer = make(backing)
    view = registrable(producer, "test")
    assert view.__array_interface__["data"][0] == producer.address == backing.ctypes.data
    assert view.nbytes == SIZE and view.flags.writeable
    assert view.dlpack_producer is producer
    memoryview(view).cast("B")[100] = 7  # written through the view, seen by the producer's memory
    assert backing[100] == 7


def test_buffers_tensors_and_addresses_keep_their_own_path():
    a = np.zeros(8, np.uint8)
    for obj in (a, bytearray(8), b"x", 1234):
        assert registrable(obj, "test") is obj
    if torch is not None:
        t = torch.zeros(8)
        assert registrable(t, "test") is t


@pytest.mark.parametrize("device_type, name", [(2, "kDLCUDA"), (3, "kDLCUDAHost"), (10, "kDLROCM"), (99, "99")])
def test_memory_on_another_device_is_refused_by_every_registration(device_type, name):
    ep = RDMAEndpoint()
    pool = RDMAMemoryPool()
    try:
        calls = [lambda p: ep.register_memory_region("gpu", p),
                 lambda p: pool.register_memory_region("gpu", p),
                 lambda p: Descriptor(p)]
        for call in calls:
            with pytest.raises(ferry.NotSupported, match="%s.*device 0" % name):
                call(cuda_like(device_type))
        with ferry.get_verbs(ferry.get_end_port()) as ctx:
            with pytest.raises(ferry.NotSupported, match=name):
                ctx.pd().mr(cuda_like(device_type), ibv.IBV_ACCESS_LOCAL_WRITE)
        with ferry.start_peer_agent(store="", alias="gpu") as agent:
            with pytest.raises(ferry.NotSupported, match=name):
                agent.register_memory_region("gpu", cuda_like(device_type))
        assert "gpu" not in ep.mr_info()
    finally:
        ep.shutdown()


def test_non_contiguous_memory_is_refused():
    strided = DLPackOnly(np.zeros(64, np.uint8)[::2])
    ep = RDMAEndpoint()
    try:
        with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
            ep.register_memory_region("strided", strided)
    finally:
        ep.shutdown()


# ---- CUDA memory: by the address __cuda_array_interface__ gives ----

class CudaInterfaceProducer:
    """A DLPack producer on kDLCUDA that exports ``__cuda_array_interface__`` and nothing else, as
    a CuPy array does; its memory is a NumPy array's, so that taking it for host memory cannot crash.
    Its DLPack capsule is never to be asked for: ferry takes the address from the interface."""

    def __init__(self, array, strides=None, read_only=False, device_id=0):
        self.array = array
        self._device_id = device_id
        self.__cuda_array_interface__ = {"data": (array.ctypes.data, read_only), "shape": array.shape,
                                         "typestr": array.dtype.str, "strides": strides, "version": 3}

    def __dlpack__(self, **kwargs):
        raise AssertionError("the DLPack capsule of CUDA memory was asked for")

    def __dlpack_device__(self):
        return (2, self._device_id)


class TensorOn:
    """What ferry sees of a tensor on a device: data_ptr(), numel(), element_size(), device.type."""

    class Device:
        def __init__(self, kind):
            self.type, self.index = kind, 0

        def __str__(self):
            return "%s:0" % self.type

    def __init__(self, kind, array):
        self.array, self.device = array, TensorOn.Device(kind)

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return self.array.itemsize

    def is_contiguous(self):
        return True


def every_registration(ep, pool, agent):
    """(name, call) for each registration a DLPack producer or a tensor may be given to."""
    return [("endpoint", lambda p: ep.register_memory_region("gpu", p)),
            ("pool", lambda p: pool.register_memory_region("gpu", p)),
            ("agent", lambda p: agent.register_memory_region("gpu", p)),
            ("descriptor", lambda p: Descriptor(p))]


def test_cuda_memory_with_an_interface_is_taken_by_its_address_and_holds_the_producer():
    memory = np.zeros((16, 8), np.float32)
    producer = CudaInterfaceProducer(memory, device_id=1)
    taken = registrable(producer, "test")
    assert isinstance(taken, CudaArrayMemory) and taken.dlpack_producer is producer
    assert (taken.data_ptr(), taken.numel(), taken.element_size()) == (memory.ctypes.data, 128, 4)
    assert taken.is_contiguous() and (taken.device.type, taken.device.index) == ("cuda", 1)
    # Strides that are C-contiguous (or that only a dimension of 1 breaks) are contiguous.
    assert registrable(CudaInterfaceProducer(memory, strides=(32, 4)), "test").numel() == 128
    assert registrable(CudaInterfaceProducer(memory[:1], strides=(999, 4)), "test").numel() == 8
    producer_ref = weakref.ref(producer)
    del producer
    gc.collect()
    assert producer_ref() is taken.dlpack_producer, "the producer lives as long as what registers it"


def test_cuda_memory_registers_only_where_the_driver_is_usable():
    """Without a usable driver, memory that says it is CUDA memory is refused naming why: ferry
    could not tell it from host memory, and never reads a device pointer as a host one. With one,
    the driver decides (this memory is the host's, and registers as such)."""
    driver = ferry._core.cuda()
    ep, pool = RDMAEndpoint(), RDMAMemoryPool()
    try:
        with ferry.start_peer_agent(store="", alias="gpu") as agent:
            for i, memory in enumerate([CudaInterfaceProducer(np.zeros(64, np.uint8)),
                                        TensorOn("cuda", np.zeros(64, np.uint8))]):
                for name, register in [("endpoint", ep.register_memory_region), ("pool", pool.register_memory_region),
                                       ("agent", agent.register_memory_region)]:
                    if driver["usable"]:
                        register("cuda%d" % i, memory)
                        continue
                    with pytest.raises(ferry.NotSupported, match="cuda:0, and CUDA's driver is not usable") as refused:
                        register("cuda%d" % i, memory)
                    assert driver["reason"] and driver["reason"] in str(refused.value), (name, refused.value)
        assert set(ep.mr_info()) == ({"cuda0", "cuda1"} if driver["usable"] else set())
    finally:
        ep.shutdown()


def test_cuda_memory_that_is_not_contiguous_or_read_only_or_malformed_is_refused():
    ep, pool = RDMAEndpoint(), RDMAMemoryPool()
    memory = np.zeros((16, 8), np.uint8)
    try:
        with ferry.start_peer_agent(store="", alias="gpu") as agent:
            for name, call in every_registration(ep, pool, agent):
                with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
                    call(CudaInterfaceProducer(memory, strides=(16, 1)))   # every other row
                with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
                    call(CudaInterfaceProducer(memory, strides=(1, 16)))   # Fortran order
                bad = CudaInterfaceProducer(memory)
                bad.__cuda_array_interface__ = dict(bad.__cuda_array_interface__, typestr="?")
                with pytest.raises(ferry.InvalidArgument, match="malformed"):
                    call(bad)
                if name != "descriptor":   # a Descriptor refuses read-only CUDA memory when used
                    with pytest.raises(ferry.NotSupported, match="read-only"):
                        call(CudaInterfaceProducer(memory, read_only=True))
        with ferry.get_verbs(ferry.get_end_port()) as ctx:
            with pytest.raises(ferry.InvalidArgument, match="not contiguous"):
                ctx.pd().mr(CudaInterfaceProducer(memory, strides=(16, 1)), ibv.IBV_ACCESS_LOCAL_WRITE)
            with pytest.raises(ferry.NotSupported, match="CUDA device 0.*host buffers only"):
                ctx.pd().mr(CudaInterfaceProducer(memory), ibv.IBV_ACCESS_LOCAL_WRITE)
        assert "gpu" not in ep.mr_info()
    finally:
        ep.shutdown()


def test_cuda_memory_without_an_address_and_tensors_on_other_devices_are_not_supported():
    ep, pool = RDMAEndpoint(), RDMAMemoryPool()
    try:
        with ferry.start_peer_agent(store="", alias="gpu") as agent:
            for name, call in every_registration(ep, pool, agent):
                # kDLCUDA through DLPack alone: no address ferry could take.
                with pytest.raises(ferry.NotSupported, match="kDLCUDA.*__cuda_array_interface__"):
                    call(cuda_like(2))
                with pytest.raises(ferry.NotSupported, match="mps"):
                    call(TensorOn("mps", np.zeros(64, np.uint8)))
                with pytest.raises(ferry.NotSupported, match="xpu"):
                    call(TensorOn("xpu", np.zeros(64, np.uint8)))
        assert "gpu" not in ep.mr_info()
    finally:
        ep.shutdown()


# ---- the Endpoint API ----

@pytest.fixture
def endpoints():
    a, b = RDMAEndpoint(), RDMAEndpoint()
    b.connect(a.endpoint_info())
    a.connect(b.endpoint_info())
    yield a, b
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("name, make", PRODUCERS, ids=IDS)
def test_endpoint_write_and_read_land_in_the_producers_memory(endpoints, name, make):
    a, b = endpoints
    src_mem, dst_mem, back_mem = pattern(3), np.zeros(SIZE, np.uint8), np.zeros(SIZE, np.uint8)
    src, dst, back = make(src_mem), make(dst_mem), make(back_mem)
    h_src = a.register_memory_region("src", src)
    h_back = a.register_memory_region("back", back, 0, SIZE)
    b.register_memory_region("dst", dst)
    info = b.mr_info()["dst"]
    assert (info["addr"], info["length"], info["writable"]) == (dst.address, SIZE, True)
    assert a.mr_info()["src"]["addr"] == src.address
    remote = a.register_remote_memory_region("dst", info)

    a.write([(h_src, remote, 0, 0, SIZE)], None).wait(WAIT)
    assert np.array_equal(dst_mem, src_mem)
    assert np.array_equal(dst.numpy().view(np.uint8).reshape(-1), src_mem)
    a.read([(h_back, remote, 0, 100, SIZE - 100)], None).wait(WAIT)  # back[0:] = dst[100:]
    assert np.array_equal(back_mem[:SIZE - 100], src_mem[100:]) and not back_mem[SIZE - 100:].any()


def test_endpoint_registration_keeps_the_producer_alive_until_unregistered(endpoints):
    a, b = endpoints

    def register():
        producer = DLPackOnly(pattern(5))
        a.register_memory_region("kept", producer)
        return weakref.ref(producer), producer.address

    alive, address = register()
    gc.collect()
    assert alive() is not None, "the registration let its producer go"
    b.register_memory_region("sink", np.zeros(SIZE, np.uint8))
    sink = a.register_remote_memory_region("sink", b.mr_info()["sink"])
    a.write([(a.local_handle("kept"), sink, 0, 0, SIZE)], None).wait(WAIT)  # the memory is still the pattern
    assert a.mr_info()["kept"]["addr"] == address
    a.unregister_memory_region("kept")
    gc.collect()
    assert alive() is None, "unregistering did not release the producer"


def test_pool_registration_takes_a_producer():
    pool = RDMAMemoryPool()
    backing = np.zeros(SIZE, np.uint8)
    producer = DLPackOnly(backing)
    h = pool.register_memory_region("p", producer)
    assert pool.mr_info()["p"]["handle"] == h and pool.mr_info()["p"]["addr"] == backing.ctypes.data


def test_read_only_producer_is_registered_for_reads_only(endpoints):
    a, b = endpoints
    frozen = pattern(9)
    frozen.flags.writeable = False
    producer = DLPackOnly(frozen)
    view = registrable(producer, "test")
    assert not view.flags.writeable and view.__array_interface__["data"][0] == frozen.ctypes.data
    h = a.register_memory_region("frozen", producer)
    assert a.mr_info()["frozen"]["writable"] is False
    b.register_memory_region("t", np.zeros(SIZE, np.uint8))
    remote = a.register_remote_memory_region("t", b.mr_info()["t"])
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        a.read([(h, remote, 0, 0, 8)], None)  # a READ would write into it
    a.write([(h, remote, 0, 0, SIZE)], None).wait(WAIT)  # a source it may be
    got = np.zeros(SIZE, np.uint8)
    b.register_memory_region("got", got)
    b.read([(b.local_handle("got"), b.register_remote_memory_region("frozen", a.mr_info()["frozen"]), 0, 0, SIZE)],
           None).wait(WAIT)
    assert np.array_equal(got, frozen)
    # The peer cannot write into it either: its region is published as not writable.
    with pytest.raises(ferry.InvalidArgument):
        b.write([(b.local_handle("got"), "frozen", 0, 0, 8)], None)
    assert np.array_equal(frozen, pattern(9))


# ---- ferry.verbs ----

def connected_qps(end_port):
    """Two RC QPs of this process, each on its own context, set up as in 7.2.3."""
    sides = []
    for _ in range(2):
        ctx = ferry.get_verbs(end_port)
        pd = ctx.pd()
        cq = ctx.cq(32)
        sides.append((ctx, pd, cq, pd.qp(ibv.IBV_QPT_RC, 16, cq, 16, cq)))
    (ctx_a, _, _, qp_a), (ctx_b, _, _, qp_b) = sides
    path = ferry.path.IBPath(end_port, SGID=end_port.default_gid)
    ferry.path.fill_path(qp_a, path)
    path.reverse(for_reply=False)
    path_b = ferry.path.IBPath.from_json(path.to_json(), end_port)
    ferry.path.fill_path(qp_b, path_b)
    with ferry.get_gmp_mad(end_port, verbs=ctx_b) as umad:
        ferry.path.resolve_path(umad, path_b)
    path_a = ferry.path.IBPath.from_json(path_b.to_json(), end_port)
    path_a.reverse(for_reply=False)
    access = ibv.IBV_ACCESS_REMOTE_WRITE | ibv.IBV_ACCESS_REMOTE_READ
    qp_a.establish(path_a, access)
    qp_b.establish(path_b, access)
    return sides


def poll_one(cq):
    wcs = list(ferry.vtools.CQPoller(cq).iterwc(count=1, timeout=WAIT))
    assert wcs and wcs[0].status == ibv.IBV_WC_SUCCESS, wcs
    return wcs[0]


@pytest.mark.parametrize("name, make", PRODUCERS, ids=IDS)
def test_verbs_rdma_write_and_read_land_in_the_producers_memory(name, make):
    sides = connected_qps(ferry.get_end_port())
    (ctx_a, pd_a, cq_a, qp_a), (ctx_b, pd_b, _, _) = sides
    try:
        src_mem, dst_mem, back_mem = pattern(4), np.zeros(SIZE, np.uint8), np.zeros(SIZE, np.uint8)
        src, dst, back = make(src_mem), make(dst_mem), make(back_mem)
        mr_src = pd_a.mr(src, ibv.IBV_ACCESS_LOCAL_WRITE)
        mr_back = pd_a.mr(back, ibv.IBV_ACCESS_LOCAL_WRITE)
        mr_dst = pd_b.mr(dst, ibv.IBV_ACCESS_LOCAL_WRITE | ibv.IBV_ACCESS_REMOTE_WRITE | ibv.IBV_ACCESS_REMOTE_READ)
        assert (mr_dst.addr, mr_dst.length) == (dst.address, SIZE) and mr_src.addr == src.address
        qp_a.post_send(ibv.send_wr(wr_id=1, opcode=ibv.IBV_WR_RDMA_WRITE, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=mr_src.sge(), remote_addr=mr_dst.addr, rkey=mr_dst.rkey))
        poll_one(cq_a)
        assert np.array_equal(dst_mem, src_mem)
        qp_a.post_send(ibv.send_wr(wr_id=2, opcode=ibv.IBV_WR_RDMA_READ, send_flags=ibv.IBV_SEND_SIGNALED,
                                   sg_list=mr_back.sge(length=1000), remote_addr=mr_dst.addr + 10,
                                   rkey=mr_dst.rkey))
        poll_one(cq_a)
        assert np.array_equal(back_mem[:1000], src_mem[10:1010]) and not back_mem[1000:].any()
    finally:
        ctx_a.close()
        ctx_b.close()


def test_verbs_mr_keeps_the_producer_and_refuses_write_access_to_read_only_memory():
    with ferry.get_verbs(ferry.get_end_port()) as ctx:
        pd = ctx.pd()
        producer = DLPackOnly(np.zeros(64, np.uint8))
        alive = weakref.ref(producer)
        mr = pd.mr(producer, ibv.IBV_ACCESS_LOCAL_WRITE)
        del producer
        gc.collect()
        assert alive() is not None
        mr.close()
        gc.collect()
        assert alive() is None

        frozen = np.zeros(64, np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(TypeError, match="read-only"):
            pd.mr(DLPackOnly(frozen), ibv.IBV_ACCESS_LOCAL_WRITE)
        mr = pd.mr(DLPackOnly(frozen), ibv.IBV_ACCESS_REMOTE_READ)
        assert mr.addr == frozen.ctypes.data


# ---- the agent ----

@pytest.mark.parametrize("name, make", PRODUCERS[:1] + PRODUCERS[2:3], ids=IDS[:1] + IDS[2:3])
def test_agent_write_lands_in_the_producers_memory(name, make):
    with ferry.start_peer_agent(store="", alias="dl-left") as left, \
            ferry.start_peer_agent(store="", alias="dl-right") as right:
        src_mem, dst_mem = pattern(6), np.zeros(SIZE, np.uint8)
        src, dst = make(src_mem), make(dst_mem)
        left.register_memory_region("src", src)
        right.register_memory_region("dst", dst)
        conn = left.connect_address(right.address)
        conn.write([("src", "dst", 0, 0, SIZE)]).wait(WAIT)
        assert np.array_equal(dst_mem, src_mem)
        conn.read([("src", "dst", 0, 0, SIZE)]).wait(WAIT)  # dst back into src: unchanged bytes
        assert np.array_equal(src_mem, pattern(6))


# ---- ferry.connect ----

def test_connect_descriptor_takes_a_producer_and_moves_into_it():
    async def main():
        async with Connector() as owner, Connector() as peer:
            dst_mem = np.zeros(SIZE, np.uint8)
            dst = DLPackOnly(dst_mem)
            d = Descriptor(dst)
            assert (d.ptr, d.size, d.read_only, str(d.device)) == (dst.address, SIZE, False, "cpu")
            writable = owner.create_writable(d)
            src_mem = pattern(8)
            op = await peer.begin_write(Descriptor(DLPackOnly(src_mem)), writable.metadata())
            await asyncio.wait_for(op.wait_for_completion(), WAIT)
            await asyncio.wait_for(writable.wait_for_completion(), WAIT)
            assert np.array_equal(dst_mem, src_mem)

            frozen = pattern(10)
            frozen.flags.writeable = False
            ro = Descriptor(DLPackOnly(frozen))
            assert ro.read_only and ro.ptr == frozen.ctypes.data
            with pytest.raises(ferry.InvalidArgument):
                owner.create_writable(ro)
            readable = owner.create_readable(ro)  # reading from it is fine
            got = np.zeros(SIZE, np.uint8)
            op = await peer.begin_read(readable.metadata(), Descriptor(DLPackOnly(got)))
            await asyncio.wait_for(op.wait_for_completion(), WAIT)
            assert np.array_equal(got, frozen)

    asyncio.run(main())
