// CUDA device memory through the verbs API over every provider path, on any host: the cases of
// device_memory_cases.h on a HostBackedDevice (tests/support/host_backed_device.h), whose memory
// the host cannot touch, so a path that read or wrote it in place would fault; and what only such
// a device can show, a device that stops answering.
#include "support/host_backed_device.h"
#include "verbs/device_memory_cases.h"

namespace ferry::test {
namespace {

FERRY_DEVICE_MEMORY_CASES(DeviceMemoryTest)

TEST_P(DeviceMemoryTest, ADeviceThatStopsAnsweringFailsTheRequestNotTheProcess) {
  ASSERT_NO_FATAL_FAILURE(connect());
  if (IsSkipped()) return;  // the device moves host memory only
  DeviceTestBuffer source, destination;
  ASSERT_TRUE(make(pair_->a, true, 300 * 1000, 7, &source));
  ASSERT_TRUE(make(pair_->b, false, 300 * 1000, 8, &destination));
  hostBacked()->failCopies(true);
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, toRemote(WrOpcode::kRdmaWrite, 1, source, destination), &wc));
  EXPECT_EQ(wc.wrId, 1u);
  EXPECT_NE(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(reachesState(pair_->a.qp, QpState::kErr));
}

TEST_P(DeviceMemoryTest, ALostDeviceAtTheResponderRefusesTheWrite) {
  ASSERT_NO_FATAL_FAILURE(connect());
  if (IsSkipped()) return;  // the device moves host memory only
  DeviceTestBuffer source, destination;
  ASSERT_TRUE(make(pair_->a, false, 300 * 1000, 9, &source));
  ASSERT_TRUE(make(pair_->b, true, 300 * 1000, 10, &destination));
  hostBacked()->failCopies(true);
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, toRemote(WrOpcode::kRdmaWrite, 1, source, destination), &wc));
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr)) << describe(wc);
  hostBacked()->failCopies(false);
  EXPECT_TRUE(matchesPattern(contents(destination), 10)) << "nothing landed";
}

INSTANTIATE_TEST_SUITE_P(Providers, DeviceMemoryTest, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

}  // namespace
}  // namespace ferry::test
