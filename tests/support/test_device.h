// Device memory a test allocates, fills and reads back: a GPU's through its driver (DriverDevice,
// on a machine with one) or HostBackedDevice's (any host). A test sees its bytes only through
// write() and read(), as a test of GPU memory must.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::test {

class TestDevice {
 public:
  virtual ~TestDevice() = default;
  // `size` bytes of the device's memory (4 KiB aligned), nullptr when it has no more for tests.
  virtual uint8_t* allocate(size_t size) = 0;
  // Copies bytes to device memory at `at`, and n bytes from there back; false (read: an empty
  // vector) when the device refused.
  virtual bool write(void* at, std::span<const uint8_t> bytes) = 0;
  virtual std::vector<uint8_t> read(const void* at, size_t n) = 0;
};

}  // namespace ferry::test
