// CUDA's driver API, loaded at run time: libcuda.so.1 (FERRY_CUDA_LIBRARY) by dlopen, as the
// ibverbs provider loads libibverbs. ferry builds without a CUDA toolkit, and on a machine without
// a GPU nothing changes. What ferry asks the driver today: whether a range of memory belongs to a
// GPU, so that registration refuses device memory with an error that says so instead of reading it
// as host memory (docs/architecture.md, "GPU memory").
#pragma once

#include <cstddef>
#include <string>

#include "ferry/common/status.h"

namespace ferry::cuda {

// The driver as this process found it (loaded once, at the first call).
struct DriverInfo {
  bool usable = false;
  std::string library;  // what was loaded, or tried
  std::string reason;   // why the driver is not usable ("" when it is)
  int version = 0;      // cuDriverGetVersion: 1000 * major + 10 * minor
  int devices = 0;
};
const DriverInfo& driver();

// "usable: driver 13.0, 1 device" or "not usable: <reason>", for `ferry info`.
std::string describe();

// Where the memory at addr lives. kHost for host memory (managed memory too: the driver migrates
// its pages on access), and for everything when the driver is not usable; kDevice with the GPU's
// ordinal for memory the driver allocated on a device.
enum class MemoryKind { kHost, kDevice };
struct MemoryLocation {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
};
MemoryLocation locate(const void* addr);

// kNotSupported naming the device when [addr, +length) starts in GPU memory (`what` names the
// call, e.g. "register memory"); OK for host memory.
Status refuseDeviceMemory(const void* addr, size_t length, const char* what);

}  // namespace ferry::cuda
