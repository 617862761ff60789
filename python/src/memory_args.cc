// Arguments shared by the Endpoint API and agent bindings (memory_args.h).
#include "memory_args.h"

#include <chrono>
#include <memory>

#include "common/cuda_driver.h"
#include "status.h"

namespace ferry::python {

bool interpreterAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

PyOwner::~PyOwner() {
  if (!interpreterAlive()) return;  // the interpreter is going away: leave it to the OS
  PyGILState_STATE gil = PyGILState_Ensure();
  if (view) PyBuffer_Release(&*view);
  Py_XDECREF(object);
  PyGILState_Release(gil);
}

[[noreturn]] void raiseInvalid(const std::string& message) { raiseStatus(invalidArgument(message)); }

// An exact non-negative integer from a Python int (or anything with __index__, e.g. NumPy ints).
uint64_t toU64(PyObject* o, const char* what, size_t index) {
  PyObject* number = PyLong_Check(o) ? (Py_INCREF(o), o) : PyNumber_Index(o);
  if (number == nullptr) {
    PyErr_Clear();
    raiseInvalid(std::string(what) + " of item " + std::to_string(index) + " is not an integer");
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(number);
  Py_DECREF(number);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    raiseInvalid(std::string(what) + " of item " + std::to_string(index) + " is negative or above 2^64-1");
  }
  return v;
}

void checkTensorDevice(py::handle tensor, const std::string& what) {
  // A CUDA tensor's pointer goes on as a CPU tensor's does: the registration asks the driver where
  // it lives. Where ferry has no usable driver it would see host memory there, and read a device
  // pointer as a host one, so the tensor's own word is taken and it is refused. Other devices
  // (mps, xpu, ...) are reached by no driver ferry loads.
  if (!py::hasattr(tensor, "device")) return;
  const std::string type = py::str(tensor.attr("device").attr("type")).cast<std::string>();
  if (type == "cuda") {
    const cuda::DriverInfo* driver = nullptr;
    {
      py::gil_scoped_release release;  // the first call loads the driver
      driver = &cuda::driver();
    }
    if (!driver->usable) {
      raiseStatus(notSupported(what + ": the tensor is on " +
                               py::str(tensor.attr("device")).cast<std::string>() +
                               ", and CUDA's driver is not usable here: " + driver->reason));
    }
  } else if (type != "cpu") {
    raiseStatus(notSupported(what + ": the tensor is on device type '" + type +
                             "'; only CPU and CUDA tensors can be registered"));
  }
}

Memory toMemory(py::handle target, uint64_t offset, py::handle lengthObj) {
  Memory m;
  PyObject* obj = target.ptr();
  std::optional<uint64_t> length;
  if (!lengthObj.is_none()) length = toU64(lengthObj.ptr(), "length", 0);
  if (PyLong_Check(obj)) {
    if (!length) raiseInvalid("register_memory_region: a length is needed with an address");
    uint64_t base = toU64(obj, "address", 0);
    m.addr = reinterpret_cast<void*>(base + offset);
    m.length = *length;
    return m;
  }
  auto owner = std::make_shared<PyOwner>();
  uint64_t base = 0, size = 0;
  if (PyObject_CheckBuffer(obj)) {
    Py_buffer view;
    bool writable = true;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) != 0) {
      PyErr_Clear();
      writable = false;
      if (PyObject_GetBuffer(obj, &view, PyBUF_ANY_CONTIGUOUS) != 0) {
        PyErr_Clear();
        raiseInvalid("register_memory_region: the buffer is not contiguous");
      }
    }
    // Held until the region is unregistered: the exporter cannot resize or free it meanwhile.
    owner->view = view;
    base = reinterpret_cast<uint64_t>(view.buf);
    size = static_cast<uint64_t>(view.len);
    m.options.writable = writable;
  } else if (py::hasattr(target, "data_ptr") && py::hasattr(target, "numel") &&
             py::hasattr(target, "element_size")) {
    checkTensorDevice(target, "register_memory_region");
    if (py::hasattr(target, "is_contiguous") && !target.attr("is_contiguous")().cast<bool>()) {
      raiseInvalid("register_memory_region: the tensor is not contiguous");
    }
    base = target.attr("data_ptr")().cast<uint64_t>();
    size = target.attr("numel")().cast<uint64_t>() * target.attr("element_size")().cast<uint64_t>();
    Py_INCREF(obj);
    owner->object = obj;
  } else {
    raiseInvalid(
        "register_memory_region: expected an address (int), a buffer (bytearray, memoryview, mmap, "
        "NumPy array) or a CPU or CUDA tensor");
  }
  if (offset > size)
    raiseInvalid("register_memory_region: offset " + std::to_string(offset) + " is beyond the " +
                 std::to_string(size) + "-byte buffer");
  if (!length) length = size - offset;
  if (*length > size - offset) {
    raiseInvalid("register_memory_region: offset + length (" + std::to_string(offset + *length) +
                 ") exceeds the " + std::to_string(size) + "-byte buffer");
  }
  m.addr = reinterpret_cast<void*>(base + offset);
  m.length = *length;
  m.options.owner = std::move(owner);
  return m;
}

// Waits in slices so that signals reach Python; raises the operation's error.
int waitFuture(const endpoint::Future& f, py::object timeout) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> deadline;
  if (!timeout.is_none()) {
    PyObject* o = timeout.ptr();
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o) || PyIndex_Check(o))) {
      raiseInvalid(std::string("wait: the timeout must be a number of seconds or None, not ") +
                   Py_TYPE(o)->tp_name);
    }
    double seconds = PyFloat_AsDouble(o);
    if (seconds == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      raiseInvalid("wait: the timeout is not a number of seconds");
    }
    if (!(seconds >= 0)) raiseInvalid("wait: the timeout must be a non-negative number of seconds or None");
    // Beyond about 30 years (math.inf, 1e300) is "no deadline": the time point would overflow.
    if (seconds < 1e9) {
      deadline =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    }
  }
  for (;;) {
    auto slice = std::chrono::milliseconds(100);
    if (deadline) {
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());  // rounded up: never short
      slice = std::max(std::chrono::milliseconds(0), std::min(slice, left));
    }
    Status st;
    {
      py::gil_scoped_release release;
      st = f.wait(slice);
    }
    if (f.done()) {
      // The operation's own status: the slice may have timed out just before it completed.
      check(f.status());
      return 0;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (deadline && Clock::now() >= *deadline) {
      raiseStatus(Status(StatusCode::kTimedOut, "wait: the operation did not complete within the timeout",
                         ETIMEDOUT));
    }
  }
}

uint32_t toImm(py::handle value) {
  long long v = value.cast<long long>();
  if (v < -(1ll << 31) || v >= (1ll << 32)) raiseInvalid("imm_data must fit in 32 bits");
  return static_cast<uint32_t>(v);
}

}  // namespace ferry::python
