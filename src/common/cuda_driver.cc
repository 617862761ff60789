#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>

#include "ferry/common/config.h"

namespace ferry::cuda {

namespace {

// The few entry points ferry uses, with the driver API's C types spelled as the ABI has them
// (CUresult is an int; CUpointer_attribute and CUmemorytype are ints; CUdeviceptr is 64 bits).
using CuResult = int;
using CuInit = CuResult (*)(unsigned int);
using CuDriverGetVersion = CuResult (*)(int*);
using CuDeviceGetCount = CuResult (*)(int*);
using CuPointerGetAttribute = CuResult (*)(void*, int, uint64_t);
using CuGetErrorString = CuResult (*)(CuResult, const char**);

constexpr CuResult kCudaSuccess = 0;
constexpr int kPointerAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned int kMemoryTypeDevice = 2;      // CU_MEMORYTYPE_DEVICE
constexpr unsigned int kMemoryTypeUnified = 4;     // CU_MEMORYTYPE_UNIFIED

struct Api {
  CuPointerGetAttribute pointerGetAttribute = nullptr;
};

struct Loaded {
  DriverInfo info;
  Api api;
};

template <typename Fn>
bool resolve(void* library, const char* name, Fn* slot, Loaded* loaded) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    loaded->info.reason = loaded->info.library + " has no " + name + " (not a CUDA driver?)";
    return false;
  }
  *slot = reinterpret_cast<Fn>(symbol);
  return true;
}

std::string errorText(CuGetErrorString getErrorString, CuResult rc) {
  const char* text = nullptr;
  if (getErrorString != nullptr && getErrorString(rc, &text) == kCudaSuccess && text != nullptr) return text;
  return "CUresult " + std::to_string(rc);
}

Loaded load() {
  Loaded loaded;
  DriverInfo& info = loaded.info;
  info.library = config::cudaLibrary();
  // Never closed: the driver lives as long as the process once initialized.
  void* library = dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    info.reason =
        "cannot load " + info.library + " (no NVIDIA driver here): " + (error ? error : "dlopen failed");
    return loaded;
  }
  CuInit init = nullptr;
  CuDriverGetVersion version = nullptr;
  CuDeviceGetCount count = nullptr;
  CuGetErrorString errorString = nullptr;
  if (!resolve(library, "cuInit", &init, &loaded) ||
      !resolve(library, "cuDriverGetVersion", &version, &loaded) ||
      !resolve(library, "cuDeviceGetCount", &count, &loaded) ||
      !resolve(library, "cuPointerGetAttribute", &loaded.api.pointerGetAttribute, &loaded)) {
    return loaded;
  }
  (void)resolve(library, "cuGetErrorString", &errorString, &loaded);
  info.reason.clear();  // cuGetErrorString is optional
  if (CuResult rc = init(0); rc != kCudaSuccess) {
    info.reason = "cuInit: " + errorText(errorString, rc);
    return loaded;
  }
  if (CuResult rc = version(&info.version); rc != kCudaSuccess) {
    info.reason = "cuDriverGetVersion: " + errorText(errorString, rc);
    return loaded;
  }
  if (CuResult rc = count(&info.devices); rc != kCudaSuccess || info.devices == 0) {
    info.reason = rc != kCudaSuccess ? "cuDeviceGetCount: " + errorText(errorString, rc) : "no CUDA device";
    return loaded;
  }
  info.usable = true;
  return loaded;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const DriverInfo& driver() { return loaded().info; }

std::string describe() {
  const DriverInfo& d = driver();
  if (!d.usable) return "not usable: " + d.reason;
  return "usable: driver " + std::to_string(d.version / 1000) + "." + std::to_string(d.version % 1000 / 10) +
         " (" + d.library + "), " + std::to_string(d.devices) + (d.devices == 1 ? " device" : " devices");
}

MemoryLocation locate(const void* addr) {
  const Loaded& l = loaded();
  MemoryLocation out;
  if (!l.info.usable || addr == nullptr) return out;
  unsigned int type = 0;
  // Memory the driver does not know (ordinary host memory) is CUDA_ERROR_INVALID_VALUE: host.
  if (l.api.pointerGetAttribute(&type, kPointerAttributeMemoryType, reinterpret_cast<uint64_t>(addr)) !=
          kCudaSuccess ||
      (type != kMemoryTypeDevice && type != kMemoryTypeUnified)) {
    return out;
  }
  // Managed memory is the host's too (the driver migrates its pages on access).
  int managed = 0;
  if (l.api.pointerGetAttribute(&managed, kPointerAttributeIsManaged, reinterpret_cast<uint64_t>(addr)) ==
          kCudaSuccess &&
      managed != 0) {
    return out;
  }
  out.kind = MemoryKind::kDevice;
  int ordinal = -1;
  if (l.api.pointerGetAttribute(&ordinal, kPointerAttributeDeviceOrdinal, reinterpret_cast<uint64_t>(addr)) ==
      kCudaSuccess) {
    out.device = ordinal;
  }
  return out;
}

Status refuseDeviceMemory(const void* addr, size_t length, const char* what) {
  if (length == 0) return Status::ok();
  const MemoryLocation where = locate(addr);
  if (where.kind == MemoryKind::kHost) return Status::ok();
  return notSupported(
      std::string(what) + ": [" + std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", +" +
      std::to_string(length) + ") is memory of CUDA device " + std::to_string(where.device) +
      "; ferry's providers move host memory only so far (register a host copy, or pinned host "
      "memory)");
}

}  // namespace ferry::cuda
