// The gpu suite's device memory cases (device_memory_cases.h) on a GPU's memory, over the soft
// provider paths: what scripts/gpu-check.sh runs on a machine with an NVIDIA GPU. Without a usable
// driver every case skips with the reason, and fails instead under FERRY_REQUIRE_CUDA=1.
#include <algorithm>
#include <iterator>
#include <vector>

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

}  // namespace
}  // namespace ferry::test
