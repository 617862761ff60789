// Turning a ferry::Status into the Python exception of its code (ferry.errors).
#pragma once

#include <pybind11/pybind11.h>

#include "ferry/common/status.h"

namespace ferry::python {

// Raises the ferry.errors exception for status (one class per StatusCode, all under ferry.Error).
// When `func` is given (the verbs call that failed, e.g. "ibv_modify_qp"), the exception is a
// ferry.SysError too, with .func and .errno set as the verbs specification describes.
[[noreturn]] void raiseStatus(const Status& status, const char* func = nullptr);

// Returns the value of a Result or raises its status.
template <typename T>
T unwrap(Result<T> result, const char* func = nullptr) {
  if (!result.isOk()) raiseStatus(result.status(), func);
  return std::move(result).value();
}
inline void check(const Status& status, const char* func = nullptr) {
  if (!status.isOk()) raiseStatus(status, func);
}

}  // namespace ferry::python
