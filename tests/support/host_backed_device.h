// Device memory for tests on a host without a GPU: a range of addresses the host cannot touch
// (reserved PROT_NONE), whose bytes live in host memory that only copies reach. While one lives it
// is the process's cuda::DeviceMemory (src/common/cuda_driver.h): ferry locates its addresses on
// "cuda:<ordinal>" and must move them through cuda::copy, as it moves a GPU's memory through the
// driver. A path that reads or writes such memory in place faults (SIGSEGV), and the test with it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/cuda_driver.h"
#include "support/test_device.h"

namespace ferry::test {

class HostBackedDevice final : public cuda::DeviceMemory, public TestDevice {
 public:
  // Reserves `capacity` bytes of addresses (and of host memory behind them, touched lazily).
  explicit HostBackedDevice(size_t capacity, int ordinal = 0);
  ~HostBackedDevice() override;
  HostBackedDevice(const HostBackedDevice&) = delete;
  HostBackedDevice& operator=(const HostBackedDevice&) = delete;

  // TestDevice: memory zeroed, never given back before the device goes.
  uint8_t* allocate(size_t size) override;
  bool write(void* at, std::span<const uint8_t> bytes) override;
  std::vector<uint8_t> read(const void* at, size_t n) override;
  // What the device holds at [addr, addr + size): for filling and checking test patterns.
  std::span<uint8_t> held(const void* addr, size_t size) const;
  // Bytes copied to or from the device so far.
  uint64_t bytesCopied() const { return bytesCopied_.load(); }
  // A device that stopped answering: every copy fails from now on (until told otherwise).
  void failCopies(bool fail) { failing_ = fail; }

  MemoryLocation locate(const void* addr) override;
  Status copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) override;

 private:
  bool inside(const void* addr, size_t n) const;
  uint8_t* backingOf(const void* addr) const;

  const size_t capacity_;
  const int ordinal_;
  uint8_t* addresses_ = nullptr;  // PROT_NONE
  uint8_t* backing_ = nullptr;    // what those addresses hold
  size_t used_ = 0;
  std::atomic<uint64_t> bytesCopied_{0};
  std::atomic<bool> failing_{false};
};

}  // namespace ferry::test
