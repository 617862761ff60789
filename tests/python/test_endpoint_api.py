"""The Endpoint API in one process: the document's examples, its constructor and registration forms,
named and array batches, errors, and shutdown."""

import ctypes
import mmap
import threading
import time

import numpy as np
import pytest

import ferry
from ferry import Assignment, RDMAContext, RDMAEndpoint, RDMAMemoryPool, RDMAWorker, available_nic, socket_id

try:
    import torch
except ImportError:  # pragma: no cover - torch is in requirements-dev.txt
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not importable")


def pattern(seed, length, offset=0):
    i = np.arange(offset, offset + length, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 7)) >> np.uint64(7)).astype(np.uint8)


def connect(a, b):
    b.connect(a.endpoint_info())
    a.connect(b.endpoint_info())


@pytest.fixture
def pair():
    made = []

    def make(num_qp=1, **options):
        a = RDMAEndpoint(num_qp=num_qp, **options)
        b = RDMAEndpoint(num_qp=num_qp, **options)
        connect(a, b)
        made.extend([a, b])
        return a, b

    yield make
    for ep in made:
        ep.shutdown()


# ---- the document's examples, as written there ----

@needs_torch
def test_document_read_example():
    devices = available_nic()
    assert devices, "No RDMA devices available"
    initiator = RDMAEndpoint(device_name=devices[0], ib_port=1, link_type="RoCE")
    target = RDMAEndpoint(device_name=devices[-1], ib_port=1, link_type="RoCE")
    tensor = torch.zeros([16], dtype=torch.uint8)
    remote_tensor = torch.arange(16, dtype=torch.uint8)
    local_handle = initiator.register_memory_region(
        "kv", tensor.data_ptr(), int(tensor.storage_offset()), tensor.numel() * tensor.itemsize)
    target.register_memory_region(
        "kv", remote_tensor.data_ptr(), int(remote_tensor.storage_offset()),
        remote_tensor.numel() * remote_tensor.itemsize)
    endpoint_info = initiator.endpoint_info()
    mr_info = initiator.mr_info()
    assert mr_info == endpoint_info["mr_info"] and "kv" in mr_info
    remote_handle = initiator.register_remote_memory_region("kv", target.endpoint_info()["mr_info"]["kv"])
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
    assert tensor[:8].tolist() == list(range(8, 16))
    assert tensor[8:].tolist() == [0] * 8
    initiator.shutdown()
    target.shutdown()


@needs_torch
def test_document_write_example():
    devices = available_nic()
    initiator = RDMAEndpoint(device_name=devices[0], ib_port=1, link_type="RoCE")
    target = RDMAEndpoint(device_name=devices[-1], ib_port=1, link_type="RoCE")
    local_tensor = torch.zeros([16], device="cpu", dtype=torch.uint8)
    lhandler = initiator.register_memory_region(
        "buffer", local_tensor.data_ptr() + int(local_tensor.storage_offset()),
        local_tensor.numel() * local_tensor.itemsize)
    remote_tensor = torch.ones([16], device="cpu", dtype=torch.uint8)
    target.register_memory_region(
        "buffer", remote_tensor.data_ptr() + int(remote_tensor.storage_offset()),
        remote_tensor.numel() * remote_tensor.itemsize)
    rhandler = initiator.register_remote_memory_region("buffer", target.endpoint_info()["mr_info"]["buffer"])
    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())
    slot = initiator.write([(lhandler, rhandler, 0, 8, 8)], None)
    slot.wait()
    # The tuple's target_offset (0) is the remote offset of a write, source_offset (8) the local one.
    assert torch.all(remote_tensor[:8] == 0)
    assert torch.all(remote_tensor[8:] == 1)
    del target, initiator


def test_document_write_with_imm_example(pair):
    initiator, target = pair()
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    local = initiator.register_memory_region("kv", src.ctypes.data, 0, src.nbytes)
    target.register_memory_region("kv", dst.ctypes.data, 0, dst.nbytes)
    remote = initiator.register_remote_memory_region("kv", target.endpoint_info()["mr_info"]["kv"])
    assignments = [(local, remote, 0, 0, 64)]
    recv_future = target.imm_recv(None)
    write_future = initiator.write_with_imm(assignments, imm_data=7, stream=None)
    write_future.wait()
    recv_future.wait()
    assert write_future.check() is True and recv_future.check() is True
    assert recv_future.imm_data() == 7
    assert np.array_equal(dst, src)


@needs_torch
def test_document_send_recv_example_with_torch_and_numpy(pair):
    initiator, target = pair()
    send_tensor = torch.arange(4096, dtype=torch.int32).to(torch.uint8)
    recv_array = np.zeros(4096, dtype=np.uint8)
    send_handle = initiator.register_memory_region("send", send_tensor)  # a CPU tensor, directly
    recv_handle = target.register_memory_region("recv", recv_array)      # a NumPy array
    recv_future = target.recv([(recv_handle, 0, 4096)], None)
    send_future = initiator.send([(send_handle, 0, 4096)], None)
    send_future.wait()
    recv_future.wait()
    assert recv_future.nbytes() == 4096
    assert np.array_equal(recv_array, send_tensor.numpy())


def test_future_names_of_the_document(pair):
    a, b = pair()
    buf = bytearray(16)
    h = a.register_memory_region("b", buf)
    b.register_memory_region("b", bytearray(16))
    r = a.register_remote_memory_region("b", b.mr_info()["b"])
    assert isinstance(a.read([(h, r, 0, 0, 8)], None), ferry.SlimeReadWriteFuture)
    assert isinstance(b.imm_recv(None), ferry.SlimeImmRecvFuture)
    assert isinstance(b.recv([(b.local_handle("b"), 0, 16)], None), ferry.SlimeRecvFuture)
    assert isinstance(a.send([(h, 0, 4)], None), ferry.SlimeSendFuture)
    assert ferry.SlimeReadWriteFuture is ferry.ReadWriteFuture


# ---- construction ----

def test_available_nic_and_socket_id():
    nics = available_nic()
    assert nics and all(isinstance(n, str) for n in nics)
    assert all(socket_id(n) >= 0 for n in nics)
    assert socket_id("no_such_device") == 0


def test_constructor_forms_share_context_pool_and_worker():
    ctx = RDMAContext()
    assert ctx.device_name == available_nic()[0] and ctx.link_type == "RoCE"
    pool = RDMAMemoryPool(ctx)
    worker = RDMAWorker(ctx.device_name, 3)
    eps = [
        RDMAEndpoint(),
        RDMAEndpoint(device_name="", ib_port=1, link_type="RoCE", num_qp=2),
        RDMAEndpoint(ctx, 2),
        RDMAEndpoint(context=ctx, num_qp=1, worker=worker),
        RDMAEndpoint(pool, num_qp=2, worker=worker),
        RDMAEndpoint(pool, 1, worker),
    ]
    assert [e.num_qp for e in eps] == [1, 2, 2, 1, 2, 1]
    assert len(worker) == 3 and worker.id == 3
    # Regions of a pool are the regions of all its endpoints.
    buf = bytearray(32)
    h = eps[4].register_memory_region("shared", buf)
    assert eps[5].mr_info()["shared"]["handle"] == h
    assert "shared" in eps[5].endpoint_info()["mr_info"]
    assert "shared" in pool.mr_info()
    # The pool of an endpoint made on a context takes the same registration forms.
    own = eps[2].get_pool()
    h2 = own.register_memory_region("own", bytearray(8))
    assert own.get_handle("own") == h2 and "own" in eps[2].mr_info()
    for e in eps:
        e.shutdown()
    worker.stop()


def test_constructor_validates_device_port_and_link_type():
    with pytest.raises(ferry.NotFound):
        RDMAEndpoint(device_name="no_such_device")
    with pytest.raises(ferry.InvalidArgument, match="RoCE"):
        RDMAEndpoint(link_type="IB")
    with pytest.raises(ferry.InvalidArgument):
        RDMAEndpoint(ib_port=2)
    with pytest.raises(ferry.InvalidArgument):
        RDMAEndpoint(num_qp=0)
    ep = RDMAEndpoint(link_type="roce")  # case does not matter
    ep.shutdown()


# ---- registration ----

def test_registration_forms_and_buffer_objects(pair):
    a, b = pair()
    target = np.zeros(1 << 16, dtype=np.uint8)
    b.register_memory_region("t", target)
    remote = a.register_remote_memory_region("t", b.mr_info()["t"])

    data = pattern(5, 1 << 16)
    mm = mmap.mmap(-1, 1 << 16)
    mm.write(data.tobytes())
    sources = {
        "bytearray": bytearray(data.tobytes()),
        "memoryview": memoryview(bytearray(data.tobytes())),
        "mmap": mm,
        "numpy": data.copy(),
        "bytes": data.tobytes(),  # read-only: fine as a write source
    }
    if torch is not None:
        sources["torch"] = torch.from_numpy(data.copy())
    for name, source in sources.items():
        target[:] = 0
        h = a.register_memory_region(name, source)
        a.write([(h, remote, 0, 0, 1 << 16)], None).wait(10)
        assert np.array_equal(target, data), name
    # (key, buffer, offset, length): the region starts at the offset.
    h = a.register_memory_region("part", sources["numpy"], 100, 50)
    target[:] = 0
    a.write([(h, remote, 0, 0, 50)], None).wait(10)
    assert np.array_equal(target[:50], data[100:150])
    with pytest.raises(ferry.InvalidArgument):
        a.write([(h, remote, 0, 0, 51)], None)  # beyond the 50-byte region
    # A registered mmap cannot be closed under the device; after unregistering it can.
    with pytest.raises(BufferError):
        mm.close()
    a.unregister_memory_region("mmap")
    mm.close()
    # A read-only buffer cannot receive a READ.
    ro = a.local_handle("bytes")
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        a.read([(ro, remote, 0, 0, 8)], None)
    with pytest.raises(ferry.InvalidArgument, match="offset"):
        a.register_memory_region("too_far", bytearray(8), 4, 8)


def test_int_keys_names_and_handles_in_tuples(pair):
    a, b = pair()
    src = np.frombuffer(pattern(9, 4096).tobytes(), dtype=np.uint8).copy()
    dst = np.zeros(4096, dtype=np.uint8)
    assert a.register_memory_region(5, src.ctypes.data, 0, src.nbytes) == 5  # int key = handle
    b.register_memory_region(17, dst.ctypes.data, 0, dst.nbytes)
    info = b.endpoint_info()["mr_info"]["17"]
    assert a.register_remote_memory_region(17, info) == 17  # the peer's handle, where free
    a.write([(5, 17, 0, 0, 1024)], None).wait(10)           # handles
    a.write([(5, "17", 1024, 1024, 1024)], None).wait(10)   # remote by name
    a.write([("5", 17, 2048, 2048, 2048)], None).wait(10)   # local by name
    assert np.array_equal(dst, src)
    with pytest.raises(ferry.InvalidArgument):
        a.write([(5, "nope", 0, 0, 8)], None)
    with pytest.raises(ferry.InvalidArgument):
        a.write([(99, 17, 0, 0, 8)], None)
    with pytest.raises(ferry.InvalidArgument):
        a.write([(5, 17, 0, 0, -1)], None)
    with pytest.raises(ferry.InvalidArgument):
        a.write([(5, 17, 0)], None)


def test_alloc_memory_region_gives_registered_memory_viewed_without_a_copy(pair):
    """alloc_memory_region: memory ferry allocates (a same-host peer maps it), registered under
    the key, returned as a buffer NumPy and torch view in place; the region keeps it alive."""
    a, b = pair()
    src = a.alloc_memory_region("kv-src", 8192)
    dst = b.alloc_memory_region(23, 8192)
    assert isinstance(src, ferry.verbs.SharedMemory) and len(src) == 8192
    assert a.mr_info()["kv-src"]["addr"] == src.addr and b.mr_info()["23"]["length"] == 8192
    s = np.frombuffer(src, dtype=np.uint8)
    d = np.frombuffer(dst, dtype=np.uint8)
    assert not d.any()
    s[:] = pattern(31, 8192)
    a.register_remote_memory_region(23, b.endpoint_info()["mr_info"]["23"])
    a.write([("kv-src", 23, 100, 0, 4000), ("kv-src", 23, 5000, 4000, 3000)], None).wait(10)
    assert np.array_equal(d[100:4100], s[:4000]) and np.array_equal(d[5000:8000], s[4000:7000])
    d[:] = pattern(32, 8192)
    a.read([("kv-src", 23, 0, 0, 8192)], None).wait(10)
    assert np.array_equal(s, d)
    if torch is not None:
        t = torch.frombuffer(dst, dtype=torch.uint8)
        assert t.data_ptr() == dst.addr
    pool = RDMAMemoryPool()
    held = pool.alloc_memory_region("pooled", 4096)
    assert pool.mr_info()["pooled"]["addr"] == held.addr
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ferry.InvalidArgument):
            a.alloc_memory_region("bad", bad)
    assert "bad" not in a.mr_info()


def test_a_single_tuple_is_a_batch_of_one(pair):
    """read/write/write_with_imm take one assignment tuple alone, send/recv one chunk alone."""
    a, b = pair()
    src = pattern(11, 4096)
    dst = np.zeros(4096, dtype=np.uint8)
    back = np.zeros(4096, dtype=np.uint8)
    a.register_memory_region(1, src.ctypes.data, 0, src.nbytes)
    a.register_memory_region(3, back.ctypes.data, 0, back.nbytes)
    b.register_memory_region(2, dst.ctypes.data, 0, dst.nbytes)
    a.register_remote_memory_region(2, b.endpoint_info()["mr_info"]["2"])
    a.write((1, 2, 0, 0, 2048)).wait(10)
    imm = b.imm_recv()
    a.write_with_imm((1, 2, 2048, 2048, 2048), imm_data=9).wait(10)
    imm.wait(10)
    assert np.array_equal(dst, src)
    a.read((3, 2, 0, 0, 4096)).wait(10)
    assert np.array_equal(back, src)
    # A tuple of five ferry.Assignment objects is a batch of five, not one assignment.
    back[:] = 0
    five = tuple(ferry.Assignment(local=3, remote=2, local_offset=i * 512, remote_offset=i * 512, length=512)
                 for i in range(5))
    a.read(five).wait(10)
    assert np.array_equal(back[:2560], src[:2560]) and not back[2560:].any()
    with pytest.raises(ferry.InvalidArgument):
        a.write((1, 2, 0, 0))  # four fields: neither an assignment nor a batch


def test_memory_given_by_raw_address_is_registered_for_the_operation():
    """(tensor.data_ptr(), offset, length) of memory never registered, as DLSlime's users write it:
    registered for that operation, unpublished, and released when it completes."""
    torch = pytest.importorskip("torch")
    pool = RDMAMemoryPool(RDMAContext())
    a, b = RDMAEndpoint(pool), RDMAEndpoint()
    connect(a, b)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    b.register_memory_region("dst", dst)
    a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    src = torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8)
    regions_before = set(a.mr_info())
    registered_before = len(pool)

    def released():
        # Unregistered by the completing thread right after it woke the waiter.
        deadline = time.monotonic() + 5
        while len(pool) != registered_before and time.monotonic() < deadline:
            time.sleep(0.001)
        return len(pool) == registered_before

    # write: the local side by address, at an offset into it.
    a.write((src.data_ptr(), "dst", 4096, 512, 65536)).wait(10)
    assert np.array_equal(dst[4096:4096 + 65536], src.numpy()[512:512 + 65536])
    assert released(), "the registration for the WRITE was released"
    # read into memory given by address; several assignments on one address share one registration.
    back = torch.zeros(1 << 20, dtype=torch.uint8)
    a.read([(back.data_ptr(), "dst", 0, 4096, 4096), (back.data_ptr(), "dst", 8192, 8192, 4096)]).wait(10)
    assert np.array_equal(back.numpy()[:4096], dst[4096:8192])
    assert np.array_equal(back.numpy()[8192:12288], dst[8192:12288])
    assert released()
    # send/recv with chunks by address.
    incoming = torch.zeros(4096, dtype=torch.uint8)
    h = b.register_memory_region("in", incoming.numpy())
    r = b.recv((h, 0, 4096))
    a.send((src.data_ptr(), 100, 1000)).wait(10)
    r.wait(10)
    assert r.nbytes() == 1000 and np.array_equal(incoming.numpy()[:1000], src.numpy()[100:1100])
    assert released()
    assert set(a.mr_info()) == regions_before  # nothing was published meanwhile
    # Memory that cannot be read (PROT_NONE) is refused clearly and changes nothing.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    guard = libc.mmap(None, 1 << 16, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert guard not in (None, ctypes.c_void_p(-1).value)
    try:
        dst[:] = 7
        with pytest.raises(ferry.InvalidArgument, match="not a registered region"):
            a.write((guard, "dst", 0, 0, 4096))
        assert (dst == 7).all()
    finally:
        libc.munmap(guard, 1 << 16)
    assert len(pool) == registered_before, "a refused registration leaves nothing behind"
    # A small integer is a key, as before: unknown keys are refused, never taken for addresses.
    with pytest.raises(ferry.Error):
        a.write((12345, "dst", 0, 0, 8))
    a.shutdown()
    b.shutdown()


def test_named_assignments_and_array_batches(pair):
    a, b = pair(num_qp=2)
    n = 100_000
    src = pattern(4, n * 8)
    dst = np.zeros(n * 8, dtype=np.uint8)
    back = np.zeros(n * 8, dtype=np.uint8)
    hs = a.register_memory_region("src", src)
    hb = a.register_memory_region("back", back)
    b.register_memory_region("dst", dst)
    hr = a.register_remote_memory_region("dst", b.mr_info()["dst"])

    # Named fields, independent of the direction.
    a.write([Assignment(local=hs, remote="dst", local_offset=8, remote_offset=0, length=8)], None).wait(10)
    assert np.array_equal(dst[:8], src[8:16])
    assert Assignment.from_tuple("write", (hs, hr, 0, 8, 8)) == Assignment(
        local=hs, remote=hr, local_offset=8, remote_offset=0, length=8)
    assert Assignment.from_tuple("read", (hs, hr, 0, 8, 8)).as_tuple("read") == (hs, hr, 0, 8, 8)
    with pytest.raises(TypeError):
        Assignment(hs, hr, 0, 8, 8)  # keyword-only: no guessing which offset is which

    # 100,000 assignments as a structured array: a permutation, byte-exact.
    perm = np.random.default_rng(1).permutation(n).astype(np.uint64)
    batch = np.zeros(n, dtype=ferry.assignment_dtype)
    batch["mr_key"] = hs
    batch["remote_mr_key"] = hr
    batch["target_offset"] = perm * 8                       # remote (write)
    batch["source_offset"] = np.arange(n, dtype=np.uint64) * 8  # local
    batch["length"] = 8
    start = time.perf_counter()
    a.write(batch, None).wait(60)
    took = time.perf_counter() - start
    expect = np.zeros_like(dst)
    expect.reshape(n, 8)[perm] = src.reshape(n, 8)
    assert np.array_equal(dst, expect)
    assert all(qp["max_outstanding"] <= 256 for qp in a.stats()["qps"])
    assert set(a.stats()) == {"operations", "qps", "operations_queued", "unexpected_bytes", "immediates_queued",
                              "worker_wakeups"}
    assert a.stats()["worker_wakeups"] >= 0
    print("100000 assignments from a structured array: %.3f s" % took)

    # The same back as an N x 5 uint64 array (read: target_offset is local).
    rows = np.stack([np.full(n, hb, np.uint64), np.full(n, hr, np.uint64), np.arange(n, dtype=np.uint64) * 8,
                     perm * 8, np.full(n, 8, np.uint64)], axis=1)
    a.read(np.ascontiguousarray(rows), None).wait(60)
    assert np.array_equal(back, src)
    with pytest.raises(ferry.InvalidArgument):
        a.read(np.zeros((3, 4), dtype=np.uint64), None)
    with pytest.raises(ferry.InvalidArgument):
        a.read(np.zeros((3, 5), dtype=np.float64), None)


# ---- errors ----

def test_errors_are_ferry_exceptions():
    a = RDMAEndpoint()
    buf = bytearray(64)
    h = a.register_memory_region("buf", buf)
    r = a.register_remote_memory_region("buf", a.mr_info()["buf"])
    with pytest.raises(ferry.Unavailable, match="connect"):
        a.read([(h, r, 0, 0, 8)], None)
    with pytest.raises(ferry.InvalidArgument):
        a.register_remote_memory_region("x", {"addr": 1})
    with pytest.raises(ferry.InvalidArgument):
        a.register_memory_region("buf", bytearray(64))  # the name is taken by another range
    f = a.imm_recv(None)
    with pytest.raises(ferry.TimedOut):
        f.wait(0.05)
    assert not f.done()
    assert f.check() is False  # pending: no error to raise yet
    a.shutdown()
    with pytest.raises(ferry.Cancelled):
        f.wait(1)
    with pytest.raises(ferry.Cancelled):
        f.check()  # done() and the error of wait(0), in one call
    with pytest.raises(ferry.Closed):
        a.imm_recv(None)


def test_malformed_peer_info_raises_and_changes_nothing():
    a, b, c = RDMAEndpoint(num_qp=2), RDMAEndpoint(num_qp=2), RDMAEndpoint(num_qp=1)
    good = b.endpoint_info()

    def changed(**fields):
        info = dict(good)
        info.update(fields)
        return info

    bad = [
        {}, [], "not json", b"\xff\xfe", {"io_info": {}, "msg_info": {}},
        changed(ferry_endpoint=2), changed(ferry_endpoint="1"), changed(num_qp=3),
        changed(qp_paths=good["qp_paths"][:1]), changed(qp_paths=[{}, {}]),
        changed(qp_paths=[dict(good["qp_paths"][0], sqpn=1 << 25), good["qp_paths"][1]]),
        changed(qp_paths=[dict(good["qp_paths"][0], mtu=9), good["qp_paths"][1]]),
        changed(recv_buffer_size=0),
        changed(mr_info={"evil": {"addr": -5, "length": 8, "rkey": 1}}),
        changed(mr_info={"evil": {"addr": 5, "length": 8}}),
        changed(device="x" * (64 << 20)), changed(device=""), changed(device=7),
        {k: v for k, v in good.items() if k != "mr_info"},
        c.endpoint_info(),
    ]
    for info in bad:
        with pytest.raises(ferry.InvalidArgument):
            a.connect(info)
        assert not a.connected
    with pytest.raises(ferry.InvalidArgument):
        a.connect({"ferry_endpoint": 1, "x": object()})  # not JSON-serialisable
    with pytest.raises(ferry.NotFound):
        a.remote_handle("evil")
    # Nothing changed: the real metadata still connects, and bytes move.
    src, dst = bytearray(b"x" * 100), bytearray(100)
    hs = a.register_memory_region("src", src)
    b.register_memory_region("dst", dst)
    b.connect(a.endpoint_info())
    a.connect(b.endpoint_info())
    a.write([(hs, a.register_remote_memory_region("dst", b.mr_info()["dst"]), 0, 0, 100)], None).wait(10)
    assert dst == src
    for ep in (a, b, c):
        ep.shutdown()


def test_message_longer_than_recv_buffer_fails_clearly(pair):
    a, b = pair()
    src, dst = pattern(3, 10000), np.zeros(10000, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    f = b.recv([(hd, 0, 100)], None)
    a.send([(hs, 0, 5000)], None).wait(10)
    with pytest.raises(ferry.InvalidArgument, match="longer than the receive buffer"):
        f.wait(10)
    g = b.recv([(hd, 0, 10000)], None)  # the next message is unaffected
    a.send([(hs, 0, 7000)], None).wait(10)
    g.wait(10)
    assert g.nbytes() == 7000 and np.array_equal(dst[:7000], src[:7000])


# ---- concurrency, ordering, shutdown ----

@pytest.mark.parametrize("num_qp", [1, 2, 4])
def test_more_operations_than_queue_depth_byte_exact(pair, num_qp):
    a, b = pair(num_qp=num_qp, send_depth=16, recv_depth=4, recv_buffer_size=2048)
    ops, piece = 1500, 1000
    src = pattern(num_qp, ops * piece)
    dst = np.zeros(ops * piece, dtype=np.uint8)
    back = np.zeros(ops * piece, dtype=np.uint8)
    hs, hb = a.register_memory_region("src", src), a.register_memory_region("back", back)
    b.register_memory_region("dst", dst)
    r = a.register_remote_memory_region("dst", b.mr_info()["dst"])
    writes = [a.write([(hs, r, i * piece, i * piece, piece)], None) for i in range(ops)]
    for f in writes:
        f.wait(30)
    assert np.array_equal(dst, src)
    reads = [a.read([(hb, r, i * piece, i * piece, piece)], None) for i in range(ops)]
    for f in reads:
        f.wait(30)
    assert np.array_equal(back, src)
    stats = a.stats()
    assert all(qp["max_outstanding"] <= 16 for qp in stats["qps"])
    assert all(qp["work_requests"] > 0 for qp in stats["qps"])
    assert stats["operations_queued"] == 0


@pytest.mark.parametrize("num_qp", [1, 2])
def test_immediates_exactly_once_in_order(pair, num_qp):
    a, b = pair(num_qp=num_qp, recv_depth=4)
    src = pattern(8, 1 << 20)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    hs = a.register_memory_region("src", src)
    b.register_memory_region("dst", dst)
    r = a.register_remote_memory_region("dst", b.mr_info()["dst"])
    whole = [(hs, r, 0, 0, 1 << 20)]
    # Pre-posted.
    pre = [b.imm_recv(None) for _ in range(5)]
    for i in range(5):
        a.write_with_imm(whole, imm_data=i, stream=None).wait(10)
    assert [f.wait(10) or f.imm_data() for f in pre] == list(range(5))
    assert np.array_equal(dst, src)
    # Written first (more than the receive depth), asked for afterwards.
    for i in range(5, 20):
        a.write_with_imm(whole, imm_data=i, stream=None).wait(10)
    deadline = time.monotonic() + 10  # the peer's completions reach its worker thread shortly after
    while b.stats()["immediates_queued"] < 15 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert b.stats()["immediates_queued"] == 15
    late = [b.imm_recv(None) for _ in range(15)]
    assert [f.wait(10) or f.imm_data() for f in late] == list(range(5, 20))
    # Interleaved: a writer thread against a receiver here; large values too.
    values = [20, 2**31, 2**32 - 1, 0, 12345]
    writer = threading.Thread(target=lambda: [a.write_with_imm(whole, imm_data=v).wait(10) for v in values])
    writer.start()
    got = []
    for _ in values:
        f = b.imm_recv()
        f.wait(10)
        got.append(f.imm_data())
    writer.join()
    assert got == values
    extra = b.imm_recv(None)
    with pytest.raises(ferry.TimedOut):
        extra.wait(0.2)  # exactly once: nothing left over


def test_send_recv_churn(pair):
    a, b = pair(num_qp=2, recv_depth=4, recv_buffer_size=4096)
    src = pattern(6, 1 << 20)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    rng = np.random.default_rng(2)
    for round_ in range(20):
        sizes = [int(x) for x in rng.integers(0, 20000, size=10)]
        offsets = np.cumsum([0] + sizes[:-1])
        early = round_ % 2 == 0  # recv() first in even rounds, send() first in odd ones
        recvs = [b.recv([(hd, int(o), s)], None) for o, s in zip(offsets, sizes)] if early else []
        sends = [a.send([(hs, int(o), s)], None) for o, s in zip(offsets, sizes)]
        if not early:
            recvs = [b.recv([(hd, int(o), s)], None) for o, s in zip(offsets, sizes)]
        for f in sends + recvs:
            f.wait(10)
        assert [f.nbytes() for f in recvs] == sizes
        end = int(offsets[-1] + sizes[-1])
        assert np.array_equal(dst[:end], src[:end])
        dst[:] = 0
    assert b.stats()["unexpected_bytes"] == 0


def test_shutdown_with_waits_in_threads_returns_promptly(pair):
    a, b = pair(num_qp=2, send_depth=4)
    src = np.zeros(16 << 20, dtype=np.uint8)
    hs = a.register_memory_region("s", src)
    b.register_memory_region("d", np.zeros(16 << 20, dtype=np.uint8))
    r = a.register_remote_memory_region("d", b.mr_info()["d"])
    futures = [a.recv([(hs, 0, 100)], None) for _ in range(3)] + [a.imm_recv(None) for _ in range(3)]
    futures += [a.write([(hs, r, 0, 0, 16 << 20)] * 20, None) for _ in range(3)]
    outcomes = [None] * len(futures)

    def waiter(i):
        try:
            futures[i].wait(30)
            outcomes[i] = "ok"
        except ferry.Cancelled:
            outcomes[i] = "cancelled"
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes[i] = repr(exc)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(len(futures))]
    for t in threads:
        t.start()
    time.sleep(0.05)
    start = time.monotonic()
    a.shutdown()
    for t in threads:
        t.join(10)
    assert time.monotonic() - start < 5
    assert outcomes[:6] == ["cancelled"] * 6
    assert all(o in ("ok", "cancelled") for o in outcomes[6:]), outcomes
    a.shutdown()  # idempotent


def test_gil_is_released_while_waiting(pair):
    a, b = pair()
    buf = bytearray(16)
    h = b.register_memory_region("b", buf)
    f = b.recv([(h, 0, 16)], None)
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    with pytest.raises(ferry.TimedOut):
        f.wait(0.3)
    stop.set()
    t.join()
    assert counter[0] > 1000  # the other thread ran Python code during the wait


def test_worker_stop_cancels_its_endpoints():
    w = RDMAWorker()
    a = RDMAEndpoint(worker=w)
    b = RDMAEndpoint(worker=w)
    connect(a, b)
    f = a.imm_recv(None)
    w.stop()
    with pytest.raises(ferry.Cancelled):
        f.wait(5)
    assert a.is_shutdown and b.is_shutdown and not w.running


def test_add_endpoint_moves_it_to_a_worker(pair):
    a, b = pair()
    w = RDMAWorker(0, 1)
    w.add_endpoint(a)
    w.add_endpoint(b)
    assert len(w) == 2
    buf, dst = bytearray(b"abc" * 10), bytearray(30)
    h = a.register_memory_region("x", buf)
    b.register_memory_region("y", dst)
    a.write([(h, a.register_remote_memory_region("y", b.mr_info()["y"]), 0, 0, 30)], None).wait(10)
    assert dst == buf
    w.stop()


def test_wait_takes_any_number_of_seconds_and_refuses_what_is_not_one(pair):
    import math
    a, b = pair()
    src, dst = pattern(4, 64), np.zeros(64, dtype=np.uint8)
    hs, hd = a.register_memory_region("s", src), b.register_memory_region("d", dst)
    f = b.recv([(hd, 0, 64)], None)
    # A timeout beyond any deadline (math.inf, 1e300) waits like None: not a TimedOut after 0.1 s.
    sender = threading.Timer(0.5, lambda: a.send([(hs, 0, 64)], None).wait(10))
    sender.start()
    try:
        assert f.wait(math.inf) == 0
    finally:
        sender.join()
    assert f.wait(1e300) == 0 and f.wait(0) == 0 and f.wait(2) == 0
    for bad in ("1", b"1", [1], True, -1, float("nan"), -math.inf):
        with pytest.raises(ferry.InvalidArgument):
            f.wait(bad)
