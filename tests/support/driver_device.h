// The memory of a real GPU, for the gpu suite: allocated through the CUDA driver (cuMemAlloc in
// device 0's primary context, one arena freed at the end), written and read back through ferry's
// own copies (cuda::copy). open() says why not where there is no usable driver or device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/common/status.h"
#include "support/test_device.h"

namespace ferry::test {

class DriverDevice final : public TestDevice {
 public:
  static Result<std::unique_ptr<DriverDevice>> open(size_t capacity);
  ~DriverDevice() override;
  DriverDevice(const DriverDevice&) = delete;
  DriverDevice& operator=(const DriverDevice&) = delete;

  uint8_t* allocate(size_t size) override;
  bool write(void* at, std::span<const uint8_t> bytes) override;
  std::vector<uint8_t> read(const void* at, size_t n) override;

 private:
  DriverDevice() = default;
  using FreeFn = int (*)(uint64_t);
  FreeFn free_ = nullptr;
  uint64_t arena_ = 0;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

}  // namespace ferry::test
