"""Memory handed to a registration as a DLPack producer (``__dlpack__`` / ``__dlpack_device__``).

The one conversion every layer that registers memory applies first: the Endpoint API
(``register_memory_region`` of endpoints and pools), ``ferry.verbs`` (``PD.mr``), the agent
(``PeerAgent.register_memory_region``) and ``ferry.connect`` (``Descriptor``). Each of them takes
addresses, buffer objects and CPU tensors itself; a DLPack producer that is none of those (a JAX or
TensorFlow array on the CPU, or any object that only speaks DLPack) becomes a zero-copy NumPy
view of its memory here, which the layers then take as a buffer. The view keeps the producer alive
as long as the registration holds the view.

Only CPU memory (``kDLCPU``) is accepted: memory on any other DLPack device, pinned host memory of
a GPU runtime included, raises :class:`ferry.NotSupported` naming the device. A producer that
marks its memory read-only (DLPack 1.0's flag) gives a read-only view: it is registered for
reading only, like ``bytes``. A producer of the older, unversioned protocol cannot mark it, and
its memory is taken as writable (as those producers refuse to export read-only memory).
"""

from __future__ import annotations

from typing import Any, List

from .errors import InvalidArgument, NotSupported

__all__ = ["registrable"]

_KDL_CPU = 1

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
    DLPack producer that is none of them is returned as a zero-copy NumPy view of its memory that
    holds the producer (``view.dlpack_producer``). ``what`` names the call in errors.

    Raises ferry.NotSupported for memory on a device other than the CPU (or without NumPy), and
    ferry.InvalidArgument when the producer's memory cannot be viewed without a copy (for
    example non-contiguous memory, or an element type NumPy has no dtype for).
    """
    if isinstance(obj, int) or not _is_dlpack(obj) or _is_tensor(obj) or _has_buffer(obj):
        return obj
    device = obj.__dlpack_device__()
    try:
        device_type, device_id = int(device[0]), int(device[1])
    except (TypeError, ValueError, IndexError):
        raise InvalidArgument("%s: __dlpack_device__() of %s returned %r, not (device_type, device_id)"
                              % (what, type(obj).__name__, device)) from None
    if device_type != _KDL_CPU:
        name = _DEVICE_TYPES.get(device_type, "DLPack device type %d" % device_type)
        raise NotSupported("%s: the %s is in %s memory (device type %d, device %d); only CPU memory "
                           "(kDLCPU) can be registered" % (what, type(obj).__name__, name, device_type, device_id))
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
