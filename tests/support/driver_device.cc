#include "support/driver_device.h"

#include <dlfcn.h>

#include "common/cuda_driver.h"

namespace ferry::test {

Result<std::unique_ptr<DriverDevice>> DriverDevice::open(size_t capacity) {
  const cuda::DriverInfo& info = cuda::driver();
  if (!info.usable) return notSupported("no usable CUDA driver: " + info.reason);
  // The driver ferry loaded is loaded already: this finds the same library.
  void* library = dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return notSupported("cannot load " + info.library);
  using DeviceGet = int (*)(int*, int);
  using PrimaryCtxRetain = int (*)(void**, int);
  using CtxSetCurrent = int (*)(void*);
  using MemAlloc = int (*)(uint64_t*, size_t);
  auto deviceGet = reinterpret_cast<DeviceGet>(dlsym(library, "cuDeviceGet"));
  auto retain = reinterpret_cast<PrimaryCtxRetain>(dlsym(library, "cuDevicePrimaryCtxRetain"));
  auto setCurrent = reinterpret_cast<CtxSetCurrent>(dlsym(library, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<MemAlloc>(dlsym(library, "cuMemAlloc_v2"));
  auto free = reinterpret_cast<FreeFn>(dlsym(library, "cuMemFree_v2"));
  if (!deviceGet || !retain || !setCurrent || !alloc || !free)
    return notSupported(info.library + " lacks cuMemAlloc");
  int device = 0;
  void* context = nullptr;
  if (deviceGet(&device, 0) != 0 || retain(&context, device) != 0 || setCurrent(context) != 0) {
    return notSupported("cannot make device 0's primary context current");
  }
  std::unique_ptr<DriverDevice> out(new DriverDevice());
  if (int rc = alloc(&out->arena_, capacity); rc != 0) {
    return resourceExhausted("cuMemAlloc of " + std::to_string(capacity) + " bytes: CUresult " +
                             std::to_string(rc));
  }
  out->free_ = free;
  out->capacity_ = capacity;
  return out;
}

DriverDevice::~DriverDevice() {
  if (arena_ != 0) free_(arena_);
}

uint8_t* DriverDevice::allocate(size_t size) {
  const size_t aligned = (size + 4095) & ~size_t{4095};
  if (aligned > capacity_ - used_) return nullptr;
  auto* out = reinterpret_cast<uint8_t*>(arena_ + used_);
  used_ += aligned;
  return out;
}

bool DriverDevice::write(void* at, std::span<const uint8_t> bytes) {
  return cuda::copy(at, cuda::locate(at), bytes.data(), MemoryLocation{}, bytes.size()).isOk();
}

std::vector<uint8_t> DriverDevice::read(const void* at, size_t n) {
  std::vector<uint8_t> out(n);
  if (!cuda::copy(out.data(), MemoryLocation{}, at, cuda::locate(at), n).isOk()) return {};
  return out;
}

}  // namespace ferry::test
