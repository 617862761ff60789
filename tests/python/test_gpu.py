"""GPU memory (docs/architecture.md, "GPU memory"): ferry loads CUDA's driver at run time to tell
GPU memory from host memory, and never reads the one as the other.

Everywhere: ``ferry info`` (text and ``--json``) names the driver and, where it is not usable,
why: none on this host, a library that is no driver, a ``FERRY_CUDA_LIBRARY`` that does not exist.

With a driver and a device (marker ``gpu``, ctest label ``gpu``): memory a GPU holds is refused at
registration by the Endpoint API with ``ferry.NotSupported`` naming the device, nothing
registered; host memory beside it still registers and moves. Without a usable driver these tests
skip with its reason, and fail instead under ``FERRY_REQUIRE_CUDA=1``."""

import json
import os
import subprocess

import numpy as np
import pytest

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FERRY = os.path.join(os.environ.get("FERRY_TEST_BIN_DIR", os.path.join(ROOT, "build", "tests")), "..", "ferry")


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


# ---- with a GPU ----

def cuda_buffer(nbytes):
    """(pointer, owner) of nbytes on cuda:0, by torch or CuPy; skips (or fails under
    FERRY_REQUIRE_CUDA=1) where there is no usable driver or neither library has CUDA."""
    doc = json.loads(ferry_info("--json"))["cuda"]
    required = os.environ.get("FERRY_REQUIRE_CUDA") == "1"
    why = None
    if not doc["usable"]:
        why = "no usable CUDA driver: " + doc["reason"]
    else:
        try:
            import torch
            if torch.cuda.is_available():
                t = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
                return t.data_ptr(), t
        except ImportError:
            pass
        try:
            import cupy
            a = cupy.empty(nbytes, dtype=cupy.uint8)
            return a.data.ptr, a
        except ImportError:
            why = "neither torch with CUDA nor CuPy is installed"
    if required:
        pytest.fail("FERRY_REQUIRE_CUDA=1: " + why)
    pytest.skip(why)


@pytest.mark.gpu
def test_gpu_memory_is_refused_naming_the_device_and_host_memory_still_moves():
    ptr, owner = cuda_buffer(1 << 20)
    a, b = ferry.RDMAEndpoint(), ferry.RDMAEndpoint()
    with pytest.raises(ferry.NotSupported, match="memory of CUDA device 0"):
        a.register_memory_region("gpu", ptr, 0, 1 << 20)
    assert "gpu" not in a.mr_info()
    src, dst = np.arange(4096, dtype=np.uint8), np.zeros(4096, dtype=np.uint8)
    local = a.register_memory_region("host", src.ctypes.data, 0, src.nbytes)
    b.register_memory_region("host", dst.ctypes.data, 0, dst.nbytes)
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    remote = a.register_remote_memory_region("host", b.mr_info()["host"])
    a.write([(local, remote, 0, 0, src.nbytes)], None).wait()
    assert np.array_equal(src, dst)
    del owner
