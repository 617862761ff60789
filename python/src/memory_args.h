// Arguments the Endpoint API and the agent bindings both take from Python: memory to register (an
// address, a buffer object or a CPU or CUDA tensor, kept alive while registered), exact non-negative
// integers, immediates, and the timed wait of a future that lets signals through.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ferry/endpoint/future.h"
#include "ferry/endpoint/memory_pool.h"

namespace ferry::python {

namespace py = pybind11;

// Whether the interpreter still runs (owners released after it finalised are left to the OS).
bool interpreterAlive();

// Keeps a Python object (or its exported buffer) alive while its memory is registered. Released
// with the GIL, on whatever thread the registration ends.
struct PyOwner {
  PyObject* object = nullptr;
  std::optional<Py_buffer> view;
  ~PyOwner();
};

[[noreturn]] void raiseInvalid(const std::string& message);

// An exact non-negative integer from a Python int (or anything with __index__, e.g. NumPy ints);
// `what` and `index` name it in the error.
uint64_t toU64(PyObject* o, const char* what, size_t index);

// What register_memory_region() got: an address, a buffer object, or a tensor-like object
// (data_ptr(), numel(), element_size(); on device type "cpu" or "cuda", contiguous), plus an offset
// (bytes added to the address) and a length (None: to the end of the buffer or tensor). A CUDA
// tensor's pointer is passed on as is: the registration locates it through the driver. Raises
// ferry.NotSupported for a CUDA tensor where the driver is not usable (with its reason) and for a
// tensor on another device type (naming it), ferry.InvalidArgument for a non-contiguous tensor or
// a range beyond the memory.
struct Memory {
  void* addr = nullptr;
  uint64_t length = 0;
  endpoint::RegionOptions options;
};
Memory toMemory(py::handle target, uint64_t offset, py::handle lengthObj);

// A tensor-like object's device (its `device.type`, when it has one): "cpu", or "cuda" where CUDA's
// driver is usable. Raises ferry.NotSupported for a CUDA tensor where the driver is not usable
// (with its reason: its pointer would be read as host memory) and for any other device type
// (naming it); `what` names the call in the message.
void checkTensorDevice(py::handle tensor, const std::string& what);

// Waits in slices of 100 ms so that signals reach Python (timeout in seconds, None: until done);
// raises the operation's error, or ferry.TimedOut. Returns 0.
int waitFuture(const endpoint::Future& f, py::object timeout);

// A 32-bit immediate (negative values as their two's complement).
uint32_t toImm(py::handle value);

}  // namespace ferry::python
