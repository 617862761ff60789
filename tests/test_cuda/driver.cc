// libferry_test_cuda.so: the part of CUDA's driver API ferry calls, over memory the host cannot
// touch, for running the GPU suite's Python tests on a machine without a GPU
// (FERRY_CUDA_LIBRARY=<this library>; tests/python/test_gpu.py).
//
// Device memory is a range of addresses reserved PROT_NONE: a path that read or wrote it as host
// memory would fault. Its bytes live in a second, ordinary mapping that only the copies below
// reach (cuMemcpy*), as the C++ suite's HostBackedDevice does in-process. One device, ordinal 0;
// cuMemAlloc hands out 4 KiB-aligned pieces of a 1 GiB range and never reuses them. The C ABI is
// the driver's own: CUresult (0 success, 1 CUDA_ERROR_INVALID_VALUE), CUdeviceptr as 64 bits.
// Nothing of ferry is linked in: ferry finds this library as it finds libcuda.so.1, by dlopen.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;    // CUDA_ERROR_INVALID_VALUE
constexpr int kOutOfMemory = 2;     // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED
constexpr int kMemoryTypeAttr = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kIsManagedAttr = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kOrdinalAttr = 9;     // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeDevice = 2;
constexpr size_t kCapacity = size_t{1} << 30;

struct Device {
  std::mutex mu;
  bool initialized = false;
  uint8_t* reserved = nullptr;  // the device addresses: PROT_NONE
  uint8_t* backing = nullptr;   // their bytes
  size_t used = 0;
};

Device& device() {
  static Device* d = new Device();  // never destroyed: copies may run at exit
  return *d;
}

bool onDevice(uint64_t addr, size_t n) {
  const Device& d = device();
  const auto base = reinterpret_cast<uint64_t>(d.reserved);
  return d.reserved != nullptr && addr >= base && n <= kCapacity && addr - base <= kCapacity - n;
}

uint8_t* bytesOf(uint64_t addr) {
  Device& d = device();
  return d.backing + (addr - reinterpret_cast<uint64_t>(d.reserved));
}

int context = 1;  // what a context or a stream handle points at: a valid, opaque pointer

}  // namespace

extern "C" {

int cuInit(unsigned int) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.initialized) return kSuccess;
  void* reserved = mmap(nullptr, kCapacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* backing =
      mmap(nullptr, kCapacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED || backing == MAP_FAILED) return kOutOfMemory;
  d.reserved = static_cast<uint8_t*>(reserved);
  d.backing = static_cast<uint8_t*>(backing);
  d.initialized = true;
  return kSuccess;
}

int cuDriverGetVersion(int* version) {
  *version = 13000;
  return kSuccess;
}

int cuDeviceGetCount(int* count) {
  *count = device().initialized ? 1 : 0;
  return device().initialized ? kSuccess : kNotInitialized;
}

int cuGetErrorString(int rc, const char** text) {
  *text = rc == kInvalidValue ? "invalid argument (test driver)" : "error (test driver)";
  return kSuccess;
}

int cuDeviceGet(int* handle, int ordinal) {
  if (ordinal != 0) return kInvalidValue;
  *handle = 0;
  return kSuccess;
}

int cuDevicePrimaryCtxRetain(void** ctx, int) {
  *ctx = &context;
  return kSuccess;
}
int cuCtxPushCurrent_v2(void*) { return kSuccess; }
int cuCtxPopCurrent_v2(void** ctx) {
  if (ctx != nullptr) *ctx = &context;
  return kSuccess;
}
int cuCtxSetCurrent(void*) { return kSuccess; }
int cuStreamCreate(void** stream, unsigned int) {
  *stream = &context;
  return kSuccess;
}
int cuStreamSynchronize(void*) { return kSuccess; }

int cuPointerGetAttribute(void* data, int attribute, uint64_t ptr) {
  if (!onDevice(ptr, 1)) return kInvalidValue;  // host memory: the driver does not know it
  switch (attribute) {
    case kMemoryTypeAttr: *static_cast<unsigned*>(data) = kMemoryTypeDevice; return kSuccess;
    case kIsManagedAttr: *static_cast<int*>(data) = 0; return kSuccess;
    case kOrdinalAttr: *static_cast<int*>(data) = 0; return kSuccess;
    default: return kInvalidValue;
  }
}

int cuMemAlloc_v2(uint64_t* out, size_t n) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.initialized) return kNotInitialized;
  const size_t aligned = (n + 4095) & ~size_t{4095};
  if (n == 0 || aligned > kCapacity - d.used) return kOutOfMemory;
  *out = reinterpret_cast<uint64_t>(d.reserved + d.used);
  d.used += aligned;
  return kSuccess;
}

int cuMemFree_v2(uint64_t ptr) { return onDevice(ptr, 1) ? kSuccess : kInvalidValue; }

int cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
  if (!onDevice(dst, n)) return kInvalidValue;
  std::memcpy(bytesOf(dst), src, n);
  return kSuccess;
}
int cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
  if (!onDevice(src, n)) return kInvalidValue;
  std::memcpy(dst, bytesOf(src), n);
  return kSuccess;
}
int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
  if (!onDevice(dst, n) || !onDevice(src, n)) return kInvalidValue;
  std::memmove(bytesOf(dst), bytesOf(src), n);
  return kSuccess;
}
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void*) {
  return cuMemcpyHtoD_v2(dst, src, n);
}
int cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void*) { return cuMemcpyDtoH_v2(dst, src, n); }
int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void*) { return cuMemcpyDtoD_v2(dst, src, n); }
int cuMemcpyPeerAsync(uint64_t dst, void*, uint64_t src, void*, size_t n, void*) {
  return cuMemcpyDtoD_v2(dst, src, n);
}

}  // extern "C"
