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
//
// CUDA IPC between processes works as the driver's does, within one host: the bytes are in a memfd,
// a handle names the exporter's pid, the memfd's descriptor and the allocation's place in it, and
// cuIpcOpenMemHandle maps that part of the exporter's memfd (through /proc/<pid>/fd) at device
// addresses of its own. Opening a handle of one's own process is an error, as with the driver.
// ferry_test_cuda_counts() tells a test which copies ran (and how many handles were opened), so
// it can check which path moved the bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;      // CUDA_ERROR_INVALID_VALUE
constexpr int kOutOfMemory = 2;       // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kNotInitialized = 3;    // CUDA_ERROR_NOT_INITIALIZED
constexpr int kMemoryTypeAttr = 2;    // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kIsManagedAttr = 8;     // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kOrdinalAttr = 9;       // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT
constexpr unsigned kMemoryTypeDevice = 2;
constexpr size_t kCapacity = size_t{1} << 30;
constexpr uint64_t kHandleMagic = 0x4150494475637466ull;  // "ftcuDIPA"

// What an IPC handle holds (64 bytes, as CUipcMemHandle).
struct Handle {
  uint64_t magic;
  uint64_t pid;
  uint64_t fd;      // the exporter's memfd
  uint64_t offset;  // the allocation, in it
  uint64_t length;
  uint64_t unused[3];
};
static_assert(sizeof(Handle) == 64);

// A run of device addresses and where its bytes are: an allocation of this process (in the
// memfd), or one another process exported and this one opened (a mapping of that memfd).
struct Range {
  size_t length = 0;
  uint8_t* bytes = nullptr;
  bool opened = false;
};

struct Device {
  std::mutex mu;
  bool initialized = false;
  int memfd = -1;
  uint8_t* reserved = nullptr;  // the device addresses: PROT_NONE
  uint8_t* backing = nullptr;   // the bytes of this process's allocations: the memfd
  size_t used = 0;
  std::map<uint64_t, Range> ranges;  // by first device address
  std::atomic<uint64_t> counts[7]{};
};

enum Count { kHtoD, kDtoH, kDtoD, kOpened, kClosed, kPinned, kUnpinned };

Device& device() {
  static Device* d = new Device();  // never destroyed: copies may run at exit
  return *d;
}

bool onDevice(uint64_t addr, size_t n) {
  const Device& d = device();
  const auto base = reinterpret_cast<uint64_t>(d.reserved);
  return d.reserved != nullptr && addr >= base && n <= kCapacity && addr - base <= kCapacity - n;
}

// The range [addr, addr + n) lies in, its first address in *first; nullptr when none holds it all.
const Range* rangeOf(uint64_t addr, size_t n, uint64_t* first) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.ranges.upper_bound(addr);
  if (it == d.ranges.begin()) return nullptr;
  --it;
  if (addr - it->first > it->second.length || n > it->second.length - (addr - it->first)) return nullptr;
  *first = it->first;
  return &it->second;
}

// The bytes of [addr, addr + n) when they lie in one range; nullptr otherwise.
uint8_t* bytesOf(uint64_t addr, size_t n) {
  uint64_t first = 0;
  const Range* r = rangeOf(addr, n, &first);
  return r == nullptr ? nullptr : r->bytes + (addr - first);
}

void count(Count what) { device().counts[what].fetch_add(1, std::memory_order_relaxed); }

int context = 1;  // what a context or a stream handle points at: a valid, opaque pointer

}  // namespace

extern "C" {

int cuInit(unsigned int) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.initialized) return kSuccess;
  void* reserved = mmap(nullptr, kCapacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return kOutOfMemory;
  // The memfd is sparse: only the pages written take memory.
  d.memfd = memfd_create("ferry-test-cuda", MFD_CLOEXEC);
  if (d.memfd < 0 || ftruncate(d.memfd, static_cast<off_t>(kCapacity)) != 0) return kOutOfMemory;
  void* backing = mmap(nullptr, kCapacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, d.memfd, 0);
  if (backing == MAP_FAILED) return kOutOfMemory;
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
  d.ranges[*out] = Range{aligned, d.backing + d.used, false};
  d.used += aligned;
  return kSuccess;
}

int cuMemFree_v2(uint64_t ptr) { return onDevice(ptr, 1) ? kSuccess : kInvalidValue; }

int cuMemGetAddressRange_v2(uint64_t* base, size_t* length, uint64_t ptr) {
  uint64_t first = 0;
  const Range* r = rangeOf(ptr, 1, &first);
  if (r == nullptr) return kInvalidValue;
  if (base != nullptr) *base = first;
  if (length != nullptr) *length = r->length;
  return kSuccess;
}

int cuDeviceGetUuid(unsigned char* uuid, int device) {
  if (device != 0) return kInvalidValue;
  std::memcpy(uuid, "ferry-test-gpu-0", 16);
  return kSuccess;
}
int cuDeviceGetUuid_v2(unsigned char* uuid, int device) { return cuDeviceGetUuid(uuid, device); }

int cuIpcGetMemHandle(Handle* handle, uint64_t ptr) {
  uint64_t first = 0;
  const Range* r = rangeOf(ptr, 1, &first);
  if (r == nullptr || first != ptr || r->opened) return kInvalidValue;  // an allocation of ours, its start
  Device& d = device();
  *handle = Handle{kHandleMagic,
                   static_cast<uint64_t>(getpid()),
                   static_cast<uint64_t>(d.memfd),
                   static_cast<uint64_t>(r->bytes - d.backing),
                   r->length,
                   {}};
  return kSuccess;
}

// CUipcMemHandle by value, as the driver takes it.
int cuIpcOpenMemHandle_v2(uint64_t* out, Handle handle, unsigned int) {
  Device& d = device();
  if (!d.initialized || handle.magic != kHandleMagic || handle.length == 0 || handle.length > kCapacity)
    return kInvalidValue;
  if (handle.pid == static_cast<uint64_t>(getpid())) return kInvalidContext;  // as the driver: not one's own
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%llu/fd/%llu", static_cast<unsigned long long>(handle.pid),
                static_cast<unsigned long long>(handle.fd));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidValue;
  void* bytes =
      mmap(nullptr, handle.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(handle.offset));
  close(fd);
  if (bytes == MAP_FAILED) return kInvalidValue;
  std::lock_guard<std::mutex> lock(d.mu);
  if (handle.length > kCapacity - d.used) {
    munmap(bytes, handle.length);
    return kOutOfMemory;
  }
  *out = reinterpret_cast<uint64_t>(d.reserved + d.used);
  d.ranges[*out] = Range{handle.length, static_cast<uint8_t*>(bytes), true};
  d.used += handle.length;
  count(kOpened);
  return kSuccess;
}

int cuIpcCloseMemHandle(uint64_t ptr) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.ranges.find(ptr);
  if (it == d.ranges.end() || !it->second.opened) return kInvalidValue;
  munmap(it->second.bytes, it->second.length);
  d.ranges.erase(it);  // its device addresses are not handed out again
  count(kClosed);
  return kSuccess;
}

// Pinning host memory changes nothing here but the counts.
int cuMemHostRegister_v2(void* addr, size_t n, unsigned int) {
  if (addr == nullptr || n == 0) return kInvalidValue;
  count(kPinned);
  return kSuccess;
}
int cuMemHostUnregister(void* addr) {
  if (addr == nullptr) return kInvalidValue;
  count(kUnpinned);
  return kSuccess;
}

// For tests: host-to-device, device-to-host and device-to-device copies made so far, IPC handles
// opened and closed, host ranges pinned and unpinned.
void ferry_test_cuda_counts(uint64_t* out) {
  for (int i = 0; i < 7; ++i) out[i] = device().counts[i].load(std::memory_order_relaxed);
}

int cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
  uint8_t* to = bytesOf(dst, n);
  if (to == nullptr) return kInvalidValue;
  std::memcpy(to, src, n);
  count(kHtoD);
  return kSuccess;
}
int cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
  const uint8_t* from = bytesOf(src, n);
  if (from == nullptr) return kInvalidValue;
  std::memcpy(dst, from, n);
  count(kDtoH);
  return kSuccess;
}
int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
  uint8_t* to = bytesOf(dst, n);
  const uint8_t* from = bytesOf(src, n);
  if (to == nullptr || from == nullptr) return kInvalidValue;
  std::memmove(to, from, n);
  count(kDtoD);
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
