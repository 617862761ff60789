"""Memory handed to a registration as a DLPack producer (``__dlpack__`` / ``__dlpack_device__``).

The one conversion every layer that registers memory applies first: the Endpoint API
(``register_memory_region`` of endpoints and pools), ``ferry.verbs`` (``PD.mr``), the agent
(``PeerAgent.register_memory_region``) and ``ferry.connect`` (``Descriptor``). Each of them takes
addresses, buffer objects and tensors (``data_ptr()``, on the CPU or a CUDA device) itself; a DLPack
producer that is none of those becomes one of them here, holding the producer alive as long as the
registration holds it:

- CPU memory (``kDLCPU``; a JAX or TensorFlow array on the CPU, or any object that only speaks
  DLPack) becomes a zero-copy NumPy view of its memory, which the layers take as a buffer. A
  producer that marks its memory read-only (DLPack 1.0's flag) gives a read-only view: it is
  registered for reading only, like ``bytes``. A producer of the older, unversioned protocol cannot
  mark it, and its memory is taken as writable (as those producers refuse to export read-only
  memory).
- CUDA memory (``kDLCUDA``) of a producer that also exports ``__cuda_array_interface__`` (CuPy)
  becomes a :class:`CudaArrayMemory`, which the layers take as a CUDA tensor: its address
  goes to the registration, which asks CUDA's driver where it lives (docs/gpu.md); where the driver
  is not usable, the layers refuse it with :class:`ferry.NotSupported` naming why. The memory must
  be C-contiguous, and the producer's work on it complete (ferry does not wait on the interface's
  ``stream``), as for a torch tensor's ``data_ptr()``.

Memory on any other DLPack device (pinned host memory of a GPU runtime, managed memory, ROCm, ...)
and CUDA memory whose address the producer does not give raise :class:`ferry.NotSupported` naming
the device. ``ferry.verbs`` registers buffers only, and refuses CUDA memory.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .errors import InvalidArgument, NotSupported

__all__ = ["CudaArrayMemory", "registrable"]

_KDL_CPU = 1
_KDL_CUDA = 2

# DLDeviceType of dlpack.h, for naming a refused device.
_DEVICE_TYPES = {
    1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal",
    9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev", 13: "kDLCUDAManaged",
    14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon", 17: "kDLMAIA",
}


def _is_dlpack(obj: object) -> bool:
    return hasattr(type(obj), "__dlpack__") and hasattr(type(obj), "__dlpack_device__")


def _is_tensor(obj: object) -> bool:
    # The test the bindings apply to take a tensor by data_ptr() (python/src/memory_args.cc).
    return hasattr(obj, "data_ptr") and hasattr(obj, "numel") and hasattr(obj, "element_size")


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


def registrable(obj: Any, what: str) -> object:
    """``obj`` as the registration layers take it.

    Addresses, buffer objects (NumPy arrays among them) and tensors are returned unchanged. A
    DLPack producer that is none of them is returned as a zero-copy NumPy view of its CPU memory
    that holds the producer (``view.dlpack_producer``), or, on a CUDA device and exporting
    ``__cuda_array_interface__``, as a :class:`CudaArrayMemory` (a CUDA tensor to the layers) that
    holds it. ``what`` names the call in errors.

    Raises ferry.NotSupported for memory on a device other than the CPU and CUDA, for CUDA memory
    of a producer without ``__cuda_array_interface__`` (no address to register) or marked read-only,
    and for CPU memory without NumPy; ferry.InvalidArgument when the producer's memory cannot be
    taken without a copy (non-contiguous memory, an element type NumPy has no dtype for, a malformed
    ``__cuda_array_interface__``).
    """
    if isinstance(obj, int) or not _is_dlpack(obj) or _is_tensor(obj) or _has_buffer(obj):
        return obj
    device = obj.__dlpack_device__()
    try:
        device_type, device_id = int(device[0]), int(device[1])
    except (TypeError, ValueError, IndexError):
        raise InvalidArgument("%s: __dlpack_device__() of %s returned %r, not (device_type, device_id)"
                              % (what, type(obj).__name__, device)) from None
    if device_type == _KDL_CUDA:
        interface = cuda_array_interface(obj)
        if interface is None:
            raise NotSupported("%s: the %s is in kDLCUDA memory (device type %d, device %d) and exports neither "
                               "__cuda_array_interface__ nor data_ptr(): ferry has no address of it to register"
                               % (what, type(obj).__name__, device_type, device_id))
        return CudaArrayMemory(obj, interface, device_id, what)
    if device_type != _KDL_CPU:
        name = _DEVICE_TYPES.get(device_type, "DLPack device type %d" % device_type)
        raise NotSupported("%s: the %s is in %s memory (device type %d, device %d); only CPU memory (kDLCPU) "
                           "and CUDA memory (kDLCUDA) can be registered"
                           % (what, type(obj).__name__, name, device_type, device_id))
    try:
        import numpy
    except ImportError:  # NumPy is optional for ferry
        raise NotSupported("%s: registering a DLPack object (%s) needs NumPy" % (what, type(obj).__name__)) from None
    view: Any  # a NumPy array (numpy is imported here, when first needed)
    try:
        try:
            view = numpy.from_dlpack(obj, copy=False)
        except TypeError:
            # NumPy before 2.1 has no copy argument, and a producer of the DLPack protocol before
            # its version 1 takes no keywords: NumPy then asks for an unversioned capsule, which
            # never copies CPU memory. That capsule cannot say "read-only" (producers refused to
            # export read-only memory through it), so NumPy's view is read-only whatever the
            # memory; it is made writable again below, without a copy.
            view = _writable(numpy, numpy.from_dlpack(obj))
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise InvalidArgument("%s: the memory of the %s cannot be viewed without a copy: %s"
                              % (what, type(obj).__name__, exc)) from None
    if not (view.flags.c_contiguous or view.flags.f_contiguous):
        raise InvalidArgument("%s: the memory of the %s is not contiguous" % (what, type(obj).__name__))
    view = view.view(_view_class(numpy))
    view.dlpack_producer = obj
    return view


class CudaDevice:
    """A CUDA device as a torch tensor's ``device`` names it: ``type`` "cuda", ``index``."""

    __slots__ = ("type", "index")

    def __init__(self, index: int) -> None:
        self.type = "cuda"
        self.index = index

    def __str__(self) -> str:
        return "cuda:%d" % self.index


class CudaArrayMemory:
    """The CUDA memory of a DLPack producer that exports ``__cuda_array_interface__``, in the form
    the registrations take a CUDA tensor: ``data_ptr()``, ``numel()``, ``element_size()``,
    ``is_contiguous()`` and ``device`` (``type`` "cuda", ``index``). ``dlpack_producer`` holds the
    producer, so its memory lives while the registration holds this object."""

    __slots__ = ("dlpack_producer", "device", "_ptr", "_count", "_itemsize")

    def __init__(self, producer: object, interface: Dict[str, Any], device_id: int, what: str) -> None:
        ptr, count, itemsize, read_only = cuda_array_layout(producer, interface, what)
        if read_only:
            raise NotSupported("%s: the %s's CUDA memory is marked read-only, and ferry registers CUDA memory "
                               "writable only" % (what, type(producer).__name__))
        self.dlpack_producer = producer
        self.device = CudaDevice(device_id)
        self._ptr, self._count, self._itemsize = ptr, count, itemsize

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return self._count

    def element_size(self) -> int:
        return self._itemsize

    def is_contiguous(self) -> bool:
        return True  # checked when made

    def __repr__(self) -> str:
        return "CudaArrayMemory(%s at 0x%x, %d bytes, cuda:%d)" % (
            type(self.dlpack_producer).__name__, self._ptr, self._count * self._itemsize, self.device.index)


def cuda_array_interface(obj: object) -> Optional[Dict[str, Any]]:
    """``obj.__cuda_array_interface__``, or None when it has none (or raises for it, as a producer
    may for memory that is not CUDA memory)."""
    try:
        interface = getattr(obj, "__cuda_array_interface__", None)
    except Exception:  # noqa: BLE001  (whatever a producer raises, it exports no CUDA memory)
        return None
    return interface if isinstance(interface, dict) else None


def cuda_array_layout(obj: object, interface: Dict[str, Any], what: str) -> Tuple[int, int, int, bool]:
    """(address, element count, element size, read-only) of C-contiguous memory described by
    ``__cuda_array_interface__`` (version 2 and later: ``strides`` None is C-contiguous).
    ferry.InvalidArgument naming ``what`` for a malformed interface or memory that is not
    C-contiguous."""
    try:
        data = interface["data"]
        ptr, read_only = int(data[0]), bool(data[1])
        shape = tuple(int(n) for n in interface["shape"])
        itemsize = int(interface["typestr"][2:])
        strides = interface.get("strides")
        strides = None if strides is None else tuple(int(s) for s in strides)
    except (KeyError, IndexError, TypeError, ValueError):
        raise InvalidArgument("%s: the %s's __cuda_array_interface__ is malformed"
                              % (what, type(obj).__name__)) from None
    if itemsize <= 0 or any(n < 0 for n in shape) or (strides is not None and len(strides) != len(shape)):
        raise InvalidArgument("%s: the %s's __cuda_array_interface__ is malformed" % (what, type(obj).__name__))
    count = 1
    for n in shape:
        count *= n
    if strides is not None and count > 1:
        step = itemsize
        for n, stride in reversed(list(zip(shape, strides))):
            if n > 1 and stride != step:
                raise InvalidArgument("%s: the %s is not contiguous" % (what, type(obj).__name__))
            step *= n
    return ptr, count, itemsize, read_only


class _ArrayInterface:
    """The memory of a read-only NumPy view of an unversioned DLPack capsule, exported writable.
    Holds the view, and with it the capsule."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.__array_interface__ = dict(view.__array_interface__, data=(view.__array_interface__["data"][0], False))


def _writable(numpy: Any, view: Any) -> Any:
    return view if view.flags.writeable else numpy.asarray(_ArrayInterface(view))


_VIEW_CLASS: List[type] = []


def _view_class(numpy: Any) -> type:
    """The ndarray subclass of the views (made on first use: NumPy is imported only then)."""
    if not _VIEW_CLASS:
        class DLPackView(numpy.ndarray):
            """A NumPy view of a DLPack producer's memory; ``dlpack_producer`` keeps the producer alive."""

        _VIEW_CLASS.append(DLPackView)
    return _VIEW_CLASS[0]
