#include "support/host_backed_device.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/device_access.h"

namespace ferry::test {

HostBackedDevice::HostBackedDevice(size_t capacity, int ordinal) : capacity_(capacity), ordinal_(ordinal) {
  void* addresses = mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* backing =
      mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addresses == MAP_FAILED || backing == MAP_FAILED) std::abort();  // a test host out of address space
  addresses_ = static_cast<uint8_t*>(addresses);
  backing_ = static_cast<uint8_t*>(backing);
  cuda::installDeviceMemory(this);
}

HostBackedDevice::~HostBackedDevice() {
  cuda::installDeviceMemory(nullptr);
  munmap(addresses_, capacity_);
  munmap(backing_, capacity_);
}

uint8_t* HostBackedDevice::allocate(size_t size) {
  const size_t aligned = (size + 4095) & ~size_t{4095};
  if (aligned > capacity_ - used_) return nullptr;
  uint8_t* out = addresses_ + used_;
  used_ += aligned;
  return out;
}

bool HostBackedDevice::write(void* at, std::span<const uint8_t> bytes) {
  if (!inside(at, bytes.size())) return false;
  std::memcpy(backingOf(at), bytes.data(), bytes.size());
  return true;
}

std::vector<uint8_t> HostBackedDevice::read(const void* at, size_t n) {
  if (!inside(at, n)) return {};
  const uint8_t* from = backingOf(at);
  return std::vector<uint8_t>(from, from + n);
}

std::span<uint8_t> HostBackedDevice::held(const void* addr, size_t size) const {
  if (!inside(addr, size)) std::abort();  // a test asking for bytes that are not the device's
  return {backingOf(addr), size};
}

bool HostBackedDevice::inside(const void* addr, size_t n) const {
  const auto p = reinterpret_cast<uintptr_t>(addr);
  const auto begin = reinterpret_cast<uintptr_t>(addresses_);
  return p >= begin && p - begin <= capacity_ && n <= capacity_ - (p - begin);
}

uint8_t* HostBackedDevice::backingOf(const void* addr) const {
  return backing_ + (static_cast<const uint8_t*>(addr) - addresses_);
}

MemoryLocation HostBackedDevice::locate(const void* addr) {
  if (addr == nullptr || !inside(addr, 1)) return {};
  return MemoryLocation{MemoryKind::kCuda, ordinal_};
}

Status HostBackedDevice::copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) {
  if (failing_) return Status(StatusCode::kIoError, "CUDA copy: the test device stopped answering");
  if ((to.onDevice() && !inside(dst, n)) || (from.onDevice() && !inside(src, n))) {
    return invalidArgument("CUDA copy of " + std::to_string(n) + " bytes outside the test device's memory");
  }
  if (!to.onDevice() && !from.onDevice()) return invalidArgument("CUDA copy between two host buffers");
  void* target = to.onDevice() ? backingOf(dst) : dst;
  const void* source = from.onDevice() ? backingOf(src) : src;
  {
    // The device's own copy engine, as a GPU's DMA: its order with the application's accesses is
    // the completion's (which ThreadSanitizer cannot see through shared-memory rings).
    DeviceAccess device;
    std::memmove(target, source, n);
  }
  bytesCopied_ += n;
  return Status::ok();
}

}  // namespace ferry::test
