#include "common/cuda_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "ferry/common/config.h"

namespace ferry::cuda {

namespace {

// The entry points ferry uses, with the driver API's C types spelled as the ABI has them (CUresult,
// CUdevice, CUpointer_attribute and CUmemorytype are ints; CUdeviceptr is 64 bits; CUcontext and
// CUstream are pointers).
using CuResult = int;
using CuDevicePtr = uint64_t;
using CuContext = void*;
using CuStream = void*;

constexpr CuResult kCudaSuccess = 0;
constexpr int kPointerAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned int kMemoryTypeDevice = 2;      // CU_MEMORYTYPE_DEVICE
constexpr unsigned int kMemoryTypeUnified = 4;     // CU_MEMORYTYPE_UNIFIED
// CU_STREAM_DEFAULT: ferry's copies wait for work on the legacy default stream, where an
// application that uses no streams of its own (and PyTorch's default stream) puts its kernels.
constexpr unsigned int kStreamDefault = 0;
constexpr int kDeviceAttributeDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kRangeHandleTypeDmaBufFd = 1;           // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr unsigned int kIpcLazyEnablePeerAccess = 1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr unsigned int kHostRegisterPortable = 1;     // CU_MEMHOSTREGISTER_PORTABLE

// CUipcMemHandle and CUuuid as the ABI has them (cuIpcOpenMemHandle takes the handle by value).
struct CuIpcMemHandle {
  char reserved[64];
};
struct CuUuid {
  char bytes[16];
};

struct Api {
  CuResult (*init)(unsigned int) = nullptr;
  CuResult (*driverGetVersion)(int*) = nullptr;
  CuResult (*deviceGetCount)(int*) = nullptr;
  CuResult (*getErrorString)(CuResult, const char**) = nullptr;  // optional
  CuResult (*pointerGetAttribute)(void*, int, CuDevicePtr) = nullptr;
  CuResult (*deviceGet)(int*, int) = nullptr;
  CuResult (*primaryCtxRetain)(CuContext*, int) = nullptr;
  CuResult (*ctxPushCurrent)(CuContext) = nullptr;
  CuResult (*ctxPopCurrent)(CuContext*) = nullptr;
  CuResult (*streamCreate)(CuStream*, unsigned int) = nullptr;
  CuResult (*streamSynchronize)(CuStream) = nullptr;
  CuResult (*memcpyDtoHAsync)(void*, CuDevicePtr, size_t, CuStream) = nullptr;
  CuResult (*memcpyHtoDAsync)(CuDevicePtr, const void*, size_t, CuStream) = nullptr;
  CuResult (*memcpyDtoDAsync)(CuDevicePtr, CuDevicePtr, size_t, CuStream) = nullptr;
  CuResult (*memcpyPeerAsync)(CuDevicePtr, CuContext, CuDevicePtr, CuContext, size_t, CuStream) = nullptr;
  // Optional (CUDA 11.7 and later): dma-buf export for GPUDirect RDMA.
  CuResult (*deviceGetAttribute)(int*, int, int) = nullptr;
  CuResult (*memGetHandleForAddressRange)(void*, CuDevicePtr, size_t, int, unsigned long long) = nullptr;
  // Optional: CUDA IPC between processes of one host (the same-host path's device copies).
  CuResult (*memGetAddressRange)(CuDevicePtr*, size_t*, CuDevicePtr) = nullptr;
  CuResult (*ipcGetMemHandle)(CuIpcMemHandle*, CuDevicePtr) = nullptr;
  CuResult (*ipcOpenMemHandle)(CuDevicePtr*, CuIpcMemHandle, unsigned int) = nullptr;
  CuResult (*ipcCloseMemHandle)(CuDevicePtr) = nullptr;
  CuResult (*deviceGetUuid)(CuUuid*, int) = nullptr;
  // Optional: pinning host memory (the staging buffers).
  CuResult (*memHostRegister)(void*, size_t, unsigned int) = nullptr;
  CuResult (*memHostUnregister)(void*) = nullptr;
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

std::string errorText(const Api& api, CuResult rc) {
  const char* text = nullptr;
  if (api.getErrorString != nullptr && api.getErrorString(rc, &text) == kCudaSuccess && text != nullptr)
    return text;
  return "CUresult " + std::to_string(rc);
}

bool resolveAll(void* library, Loaded* l) {
  Api& a = l->api;
  return resolve(library, "cuInit", &a.init, l) &&
         resolve(library, "cuDriverGetVersion", &a.driverGetVersion, l) &&
         resolve(library, "cuDeviceGetCount", &a.deviceGetCount, l) &&
         resolve(library, "cuPointerGetAttribute", &a.pointerGetAttribute, l) &&
         resolve(library, "cuDeviceGet", &a.deviceGet, l) &&
         resolve(library, "cuDevicePrimaryCtxRetain", &a.primaryCtxRetain, l) &&
         resolve(library, "cuCtxPushCurrent_v2", &a.ctxPushCurrent, l) &&
         resolve(library, "cuCtxPopCurrent_v2", &a.ctxPopCurrent, l) &&
         resolve(library, "cuStreamCreate", &a.streamCreate, l) &&
         resolve(library, "cuStreamSynchronize", &a.streamSynchronize, l) &&
         resolve(library, "cuMemcpyDtoHAsync_v2", &a.memcpyDtoHAsync, l) &&
         resolve(library, "cuMemcpyHtoDAsync_v2", &a.memcpyHtoDAsync, l) &&
         resolve(library, "cuMemcpyDtoDAsync_v2", &a.memcpyDtoDAsync, l) &&
         resolve(library, "cuMemcpyPeerAsync", &a.memcpyPeerAsync, l);
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
  if (!resolveAll(library, &loaded)) return loaded;
  const Api& api = loaded.api;
  (void)resolve(library, "cuGetErrorString", &loaded.api.getErrorString, &loaded);
  (void)resolve(library, "cuDeviceGetAttribute", &loaded.api.deviceGetAttribute, &loaded);
  (void)resolve(library, "cuMemGetHandleForAddressRange", &loaded.api.memGetHandleForAddressRange, &loaded);
  (void)resolve(library, "cuMemGetAddressRange_v2", &loaded.api.memGetAddressRange, &loaded);
  (void)resolve(library, "cuIpcGetMemHandle", &loaded.api.ipcGetMemHandle, &loaded);
  (void)resolve(library, "cuIpcOpenMemHandle_v2", &loaded.api.ipcOpenMemHandle, &loaded);
  (void)resolve(library, "cuIpcCloseMemHandle", &loaded.api.ipcCloseMemHandle, &loaded);
  (void)resolve(library, "cuMemHostRegister_v2", &loaded.api.memHostRegister, &loaded);
  (void)resolve(library, "cuMemHostUnregister", &loaded.api.memHostUnregister, &loaded);
  if (!resolve(library, "cuDeviceGetUuid_v2", &loaded.api.deviceGetUuid, &loaded))
    (void)resolve(library, "cuDeviceGetUuid", &loaded.api.deviceGetUuid, &loaded);
  info.reason.clear();  // these are optional
  if (CuResult rc = api.init(0); rc != kCudaSuccess) {
    info.reason = "cuInit: " + errorText(api, rc);
    return loaded;
  }
  if (CuResult rc = api.driverGetVersion(&info.version); rc != kCudaSuccess) {
    info.reason = "cuDriverGetVersion: " + errorText(api, rc);
    return loaded;
  }
  if (CuResult rc = api.deviceGetCount(&info.devices); rc != kCudaSuccess || info.devices == 0) {
    info.reason = rc != kCudaSuccess ? "cuDeviceGetCount: " + errorText(api, rc) : "no CUDA device";
    return loaded;
  }
  info.usable = true;
  return loaded;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

// A context made current on this thread for one scope (pushed, and popped when the scope ends), so
// that the calling thread's current context is left as it was.
class ScopedContext {
 public:
  explicit ScopedContext(CuContext context) : rc_(loaded().api.ctxPushCurrent(context)) {}
  ~ScopedContext() {
    CuContext popped = nullptr;
    if (rc_ == kCudaSuccess) (void)loaded().api.ctxPopCurrent(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  // cuCtxPushCurrent's result: anything but success and nothing was pushed.
  CuResult result() const { return rc_; }

 private:
  CuResult rc_;
};

// The driver's device memory. Copies run on streams of ferry's own, in the device's primary
// context (pushed for the copy and popped after, so the calling thread's current context is left
// as it was), and are waited for before the call returns.
class DriverMemory final : public DeviceMemory {
 public:
  MemoryLocation locate(const void* addr) override;
  Status copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) override;
  Result<DmaBuf> exportDmaBuf(const void* addr, size_t length, MemoryLocation where) override;
  Result<IpcHandle> exportIpc(const void* addr, MemoryLocation where) override;
  Result<IpcMapping> openIpc(const IpcHandle& handle) override;
  void closeIpc(const IpcMapping& mapping) override;
  bool pinHost(void* addr, size_t length) override;
  void unpinHost(void* addr) override;

 private:
  struct Device {
    CuContext context = nullptr;
    std::vector<CuStream> idleStreams;
  };
  // The device's primary context (retained once, never released: it lives as long as the process).
  Result<CuContext> contextOf(int device);
  // An idle stream of the device (made in the context the caller pushed); given back with giveBack.
  Result<CuStream> takeStream(int device);
  void giveBack(int device, CuStream stream);
  Status failed(const char* call, CuResult rc, size_t n) const;
  // The device's UUID (cuDeviceGetUuid), or why there is none.
  Result<std::array<uint8_t, 16>> uuidOf(int device);

  std::mutex mu_;
  std::map<int, Device> devices_;
};

MemoryLocation DriverMemory::locate(const void* addr) {
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
  out.kind = MemoryKind::kCuda;
  int ordinal = -1;
  if (l.api.pointerGetAttribute(&ordinal, kPointerAttributeDeviceOrdinal, reinterpret_cast<uint64_t>(addr)) ==
      kCudaSuccess) {
    out.device = ordinal;
  }
  return out;
}

Status DriverMemory::failed(const char* call, CuResult rc, size_t n) const {
  return Status(StatusCode::kIoError, std::string("CUDA copy of ") + std::to_string(n) + " bytes: " + call +
                                          ": " + errorText(loaded().api, rc));
}

Result<CuContext> DriverMemory::contextOf(int device) {
  const Api& api = loaded().api;
  std::lock_guard<std::mutex> lock(mu_);
  Device& d = devices_[device];
  if (d.context != nullptr) return d.context;
  int handle = 0;
  if (CuResult rc = api.deviceGet(&handle, device); rc != kCudaSuccess) return failed("cuDeviceGet", rc, 0);
  if (CuResult rc = api.primaryCtxRetain(&d.context, handle); rc != kCudaSuccess) {
    d.context = nullptr;
    return failed("cuDevicePrimaryCtxRetain", rc, 0);
  }
  return d.context;
}

Result<CuStream> DriverMemory::takeStream(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& idle = devices_[device].idleStreams;
    if (!idle.empty()) {
      CuStream stream = idle.back();
      idle.pop_back();
      return stream;
    }
  }
  // One stream per thread copying at once: a handful (the reactor, the stripe and copy threads).
  CuStream stream = nullptr;
  if (CuResult rc = loaded().api.streamCreate(&stream, kStreamDefault); rc != kCudaSuccess)
    return failed("cuStreamCreate", rc, 0);
  return stream;
}

void DriverMemory::giveBack(int device, CuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  devices_[device].idleStreams.push_back(stream);
}

Status DriverMemory::copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) {
  if (n == 0) return Status::ok();
  const Api& api = loaded().api;
  if (!loaded().info.usable)
    return notSupported("CUDA copy: the driver is not usable: " + loaded().info.reason);
  const int device = from.onDevice() ? from.device : to.device;
  FERRY_ASSIGN_OR_RETURN(CuContext context, contextOf(device));
  CuContext peer = context;
  if (from.onDevice() && to.onDevice() && to.device != from.device) {
    FERRY_ASSIGN_OR_RETURN(peer, contextOf(to.device));
  }
  ScopedContext current(context);
  if (current.result() != kCudaSuccess) return failed("cuCtxPushCurrent", current.result(), n);
  Result<CuStream> stream = takeStream(device);
  CuResult rc = kCudaSuccess;
  const char* call = "cuStreamCreate";
  if (stream.isOk()) {
    const auto d = reinterpret_cast<CuDevicePtr>(dst);
    const auto s = reinterpret_cast<CuDevicePtr>(src);
    if (!to.onDevice()) {
      call = "cuMemcpyDtoHAsync";
      rc = api.memcpyDtoHAsync(dst, s, n, *stream);
    } else if (!from.onDevice()) {
      call = "cuMemcpyHtoDAsync";
      rc = api.memcpyHtoDAsync(d, src, n, *stream);
    } else if (to.device == from.device) {
      call = "cuMemcpyDtoDAsync";
      rc = api.memcpyDtoDAsync(d, s, n, *stream);
    } else {
      call = "cuMemcpyPeerAsync";
      rc = api.memcpyPeerAsync(d, peer, s, context, n, *stream);
    }
    if (rc == kCudaSuccess) {
      call = "cuStreamSynchronize";
      rc = api.streamSynchronize(*stream);
    }
    giveBack(device, *stream);
  }
  if (!stream.isOk()) return stream.status();
  return rc == kCudaSuccess ? Status::ok() : failed(call, rc, n);
}

Result<DmaBuf> DriverMemory::exportDmaBuf(const void* addr, size_t length, MemoryLocation where) {
  const Loaded& l = loaded();
  const std::string what =
      "export " + std::to_string(length) + " bytes of " + where.toString() + " as a dma-buf: ";
  if (!l.info.usable) return notSupported(what + "the driver is not usable: " + l.info.reason);
  if (l.api.memGetHandleForAddressRange == nullptr || l.api.deviceGetAttribute == nullptr)
    return notSupported(what + "the driver has no cuMemGetHandleForAddressRange (CUDA 11.7 or later has it)");
  int handle = 0;
  int supported = 0;
  if (CuResult rc = l.api.deviceGet(&handle, where.device); rc != kCudaSuccess)
    return notSupported(what + "cuDeviceGet: " + errorText(l.api, rc));
  if (CuResult rc = l.api.deviceGetAttribute(&supported, kDeviceAttributeDmaBufSupported, handle);
      rc != kCudaSuccess || supported == 0) {
    return notSupported(what + (rc != kCudaSuccess
                                    ? "cuDeviceGetAttribute: " + errorText(l.api, rc)
                                    : "the device or its kernel module does not export dma-bufs"));
  }
  // The driver exports whole host pages: the range widened to them, and where it starts inside.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uint64_t>(addr);
  const uint64_t base = start & ~(page - 1);
  const uint64_t end = (start + length + page - 1) & ~(page - 1);
  FERRY_ASSIGN_OR_RETURN(CuContext context, contextOf(where.device));
  ScopedContext current(context);
  if (current.result() != kCudaSuccess)
    return Status(StatusCode::kIoError, what + "cuCtxPushCurrent: " + errorText(l.api, current.result()));
  int fd = -1;
  const CuResult rc = l.api.memGetHandleForAddressRange(&fd, base, end - base, kRangeHandleTypeDmaBufFd, 0);
  if (rc != kCudaSuccess)
    return notSupported(what + "cuMemGetHandleForAddressRange: " + errorText(l.api, rc));
  return DmaBuf{fd, start - base};
}

Result<std::array<uint8_t, 16>> DriverMemory::uuidOf(int device) {
  const Api& api = loaded().api;
  int handle = 0;
  CuUuid uuid{};
  if (CuResult rc = api.deviceGet(&handle, device); rc != kCudaSuccess) return failed("cuDeviceGet", rc, 0);
  if (CuResult rc = api.deviceGetUuid(&uuid, handle); rc != kCudaSuccess)
    return failed("cuDeviceGetUuid", rc, 0);
  std::array<uint8_t, 16> out{};
  std::memcpy(out.data(), uuid.bytes, out.size());
  return out;
}

Result<IpcHandle> DriverMemory::exportIpc(const void* addr, MemoryLocation where) {
  const Loaded& l = loaded();
  const std::string what = "CUDA IPC of " + where.toString() + " memory: ";
  if (!l.info.usable) return notSupported(what + "the driver is not usable: " + l.info.reason);
  if (l.api.memGetAddressRange == nullptr || l.api.ipcGetMemHandle == nullptr ||
      l.api.deviceGetUuid == nullptr)
    return notSupported(what + "the driver has no cuIpcGetMemHandle");
  FERRY_ASSIGN_OR_RETURN(CuContext context, contextOf(where.device));
  ScopedContext current(context);
  if (current.result() != kCudaSuccess)
    return Status(StatusCode::kIoError, what + "cuCtxPushCurrent: " + errorText(l.api, current.result()));
  IpcHandle out;
  size_t length = 0;
  // The handle names a whole allocation (cudaMalloc's, or a caching allocator's block the range
  // is carved from): the opener adds the range's offset inside it.
  if (CuResult rc = l.api.memGetAddressRange(&out.base, &length, reinterpret_cast<CuDevicePtr>(addr));
      rc != kCudaSuccess) {
    return notSupported(what + "cuMemGetAddressRange: " + errorText(l.api, rc));
  }
  out.length = length;
  CuIpcMemHandle handle{};
  if (CuResult rc = l.api.ipcGetMemHandle(&handle, out.base); rc != kCudaSuccess)
    return notSupported(what + "cuIpcGetMemHandle: " + errorText(l.api, rc));
  std::memcpy(out.bytes.data(), handle.reserved, out.bytes.size());
  FERRY_ASSIGN_OR_RETURN(out.uuid, uuidOf(where.device));
  return out;
}

Result<IpcMapping> DriverMemory::openIpc(const IpcHandle& handle) {
  const Loaded& l = loaded();
  if (!l.info.usable) return notSupported("CUDA IPC: the driver is not usable: " + l.info.reason);
  if (l.api.ipcOpenMemHandle == nullptr || l.api.ipcCloseMemHandle == nullptr ||
      l.api.deviceGetUuid == nullptr)
    return notSupported("CUDA IPC: the driver has no cuIpcOpenMemHandle");
  for (int device = 0; device < l.info.devices; ++device) {
    Result<std::array<uint8_t, 16>> uuid = uuidOf(device);
    if (!uuid.isOk() || *uuid != handle.uuid) continue;
    FERRY_ASSIGN_OR_RETURN(CuContext context, contextOf(device));
    ScopedContext current(context);
    if (current.result() != kCudaSuccess) return failed("cuCtxPushCurrent", current.result(), 0);
    CuIpcMemHandle raw{};
    std::memcpy(raw.reserved, handle.bytes.data(), handle.bytes.size());
    CuDevicePtr base = 0;
    if (CuResult rc = l.api.ipcOpenMemHandle(&base, raw, kIpcLazyEnablePeerAccess); rc != kCudaSuccess)
      return Status(StatusCode::kUnavailable, "CUDA IPC: cuIpcOpenMemHandle: " + errorText(l.api, rc));
    return IpcMapping{reinterpret_cast<void*>(base), MemoryLocation{MemoryKind::kCuda, device}};
  }
  return Status(StatusCode::kNotFound, "CUDA IPC: the exporter's device is not visible to this process");
}

void DriverMemory::closeIpc(const IpcMapping& mapping) {
  const Loaded& l = loaded();
  if (mapping.base == nullptr || l.api.ipcCloseMemHandle == nullptr) return;
  Result<CuContext> context = contextOf(mapping.where.device);
  if (!context.isOk()) return;
  ScopedContext current(*context);
  if (current.result() == kCudaSuccess)
    (void)l.api.ipcCloseMemHandle(reinterpret_cast<CuDevicePtr>(mapping.base));
}

bool DriverMemory::pinHost(void* addr, size_t length) {
  const Loaded& l = loaded();
  if (!l.info.usable || l.api.memHostRegister == nullptr || l.api.memHostUnregister == nullptr) return false;
  Result<CuContext> context = contextOf(0);  // portable: every context sees it pinned
  if (!context.isOk()) return false;
  ScopedContext current(*context);
  return current.result() == kCudaSuccess &&
         l.api.memHostRegister(addr, length, kHostRegisterPortable) == kCudaSuccess;
}

void DriverMemory::unpinHost(void* addr) {
  const Loaded& l = loaded();
  Result<CuContext> context = contextOf(0);
  if (!context.isOk()) return;
  ScopedContext current(*context);
  if (current.result() == kCudaSuccess) (void)l.api.memHostUnregister(addr);
}

DriverMemory& driverMemory() {
  static DriverMemory* memory = new DriverMemory();  // never destroyed: copies may run at exit
  return *memory;
}

std::atomic<DeviceMemory*> installed{nullptr};
std::atomic<bool> registeredDeviceMemory{false};

DeviceMemory& current() {
  DeviceMemory* memory = installed.load(std::memory_order_acquire);
  return memory != nullptr ? *memory : driverMemory();
}

}  // namespace

const DriverInfo& driver() { return loaded().info; }

std::string describe() {
  const DriverInfo& d = driver();
  if (!d.usable) return "not usable: " + d.reason;
  return "usable: driver " + std::to_string(d.version / 1000) + "." + std::to_string(d.version % 1000 / 10) +
         " (" + d.library + "), " + std::to_string(d.devices) + (d.devices == 1 ? " device" : " devices");
}

void installDeviceMemory(DeviceMemory* memory) { installed.store(memory, std::memory_order_release); }

MemoryLocation locate(const void* addr) { return current().locate(addr); }

Status copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) {
  return current().copy(dst, to, src, from, n);
}

Result<DmaBuf> exportDmaBuf(const void* addr, size_t length, MemoryLocation where) {
  return current().exportDmaBuf(addr, length, where);
}

Result<IpcHandle> exportIpc(const void* addr, MemoryLocation where) {
  return current().exportIpc(addr, where);
}
Result<IpcMapping> openIpc(const IpcHandle& handle) { return current().openIpc(handle); }
void closeIpc(const IpcMapping& mapping) { current().closeIpc(mapping); }

PinnedHost::PinnedHost(void* addr, size_t length) {
  if (addr != nullptr && length > 0 && current().pinHost(addr, length)) addr_ = addr;
}

PinnedHost::~PinnedHost() {
  if (addr_ != nullptr) current().unpinHost(addr_);
}

PinnedHost& PinnedHost::operator=(PinnedHost&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) current().unpinHost(addr_);
    addr_ = other.addr_;
    other.addr_ = nullptr;
  }
  return *this;
}

std::string peerMemoryModule(const std::string& sysRoot) {
  // A loaded module has its directory under /sys/module; the older module also registers itself
  // with the kernel's peer memory clients (Mellanox OFED's memory_peers).
  for (const char* module : {"nvidia_peermem", "nv_peer_mem"}) {
    if (::access((sysRoot + "/module/" + module).c_str(), F_OK) == 0) return module;
  }
  if (::access((sysRoot + "/kernel/mm/memory_peers/nv_mem/version").c_str(), F_OK) == 0) return "nv_peer_mem";
  return "";
}

bool deviceMemoryRegistered() { return registeredDeviceMemory.load(std::memory_order_relaxed); }
void noteDeviceMemoryRegistered() { registeredDeviceMemory.store(true, std::memory_order_relaxed); }

}  // namespace ferry::cuda
