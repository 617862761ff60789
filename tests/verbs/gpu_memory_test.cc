// The gpu suite's device memory cases (device_memory_cases.h) on a GPU's memory, over the soft
// provider paths: what scripts/gpu-check.sh runs on a machine with an NVIDIA GPU. Without a usable
// driver every case skips with the reason, and fails instead under FERRY_REQUIRE_CUDA=1.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "support/driver_device.h"
#include "verbs/device_memory_cases.h"

namespace ferry::test {
namespace {

class GpuMemoryTest : public DeviceMemoryTest {
 protected:
  Result<std::unique_ptr<TestDevice>> makeDevice() override {
    FERRY_ASSIGN_OR_RETURN(auto device, DriverDevice::open(kCapacity));
    return std::unique_ptr<TestDevice>(std::move(device));
  }
};

FERRY_DEVICE_MEMORY_CASES(GpuMemoryTest)

// The soft paths: the ones a GPU machine runs (no RDMA device there).
std::vector<ProviderPath> softPaths() {
  std::vector<ProviderPath> out;
  std::copy_if(providerPaths().begin(), providerPaths().end(), std::back_inserter(out),
               [](const ProviderPath& p) { return p.device.rfind("soft", 0) == 0; });
  return out;
}

INSTANTIATE_TEST_SUITE_P(Providers, GpuMemoryTest, ::testing::ValuesIn(softPaths()), providerPathTestName);

// GPUDirect RDMA's first step on this GPU: its memory exported as a dma-buf a NIC can register
// (what the ibverbs provider's registerDeviceMemory asks), or the reason it cannot be.
TEST(GpuDmaBuf, DeviceMemoryExportsAsADmaBufOrSaysWhyNot) {
  auto device = DriverDevice::open(1 << 20);
  if (!device.isOk()) {
    const char* required = std::getenv("FERRY_REQUIRE_CUDA");
    if (required != nullptr && std::string(required) == "1") FAIL() << device.status().toString();
    GTEST_SKIP() << device.status().toString();
  }
  uint8_t* base = (*device)->allocate(8192);
  ASSERT_NE(base, nullptr);
  uint8_t* addr = base + 100;  // a range that starts inside a page
  const MemoryLocation where = cuda::locate(addr);
  ASSERT_TRUE(where.onDevice());
  auto exported = cuda::exportDmaBuf(addr, 4000, where);
  if (!exported.isOk()) {
    EXPECT_EQ(exported.status().code(), StatusCode::kNotSupported) << exported.status().toString();
    EXPECT_NE(exported.status().message().find("as a dma-buf: "), std::string::npos)
        << exported.status().toString();
    GTEST_SKIP() << "no dma-buf here: " << exported.status().toString();
  }
  EXPECT_GE(exported->fd, 0);
  EXPECT_EQ(exported->offset,
            reinterpret_cast<uint64_t>(addr) % static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(::close(exported->fd), 0);
}

}  // namespace
}  // namespace ferry::test
