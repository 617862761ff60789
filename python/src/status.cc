#include "status.h"

namespace py = pybind11;

namespace ferry::python {

void raiseStatus(const Status& status, const char* func) {
  py::object errors = py::module_::import("ferry.errors");
  py::object error =
      errors.attr("make_error")(static_cast<int>(status.code()), status.message(), status.cause(),
                                func ? py::object(py::str(func)) : py::object(py::none()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

}  // namespace ferry::python
