// Device memory through the verbs API: the cases, written once against a TestDevice
// (tests/support/test_device.h) and run twice: in the conformance suite over every provider path on
// HostBackedDevice, memory the host cannot touch (conformance_device_memory.cc, any host), and in
// the gpu suite over the soft paths on a GPU's memory (gpu_memory_test.cc). Each case checks the
// bytes the device holds afterwards, read back through the device.
#pragma once

#include <memory>
#include <vector>

#include "support/test_device.h"
#include "verbs/conformance.h"

namespace ferry::test {

class HostBackedDevice;

// Memory of one kind, registered: on the device, or host memory.
struct DeviceTestBuffer {
  uint8_t* addr = nullptr;
  size_t size = 0;
  v::MemoryRegion mr;
  bool onDevice = false;
};

class DeviceMemoryTest : public VerbsTest {
 protected:
  static constexpr size_t kCapacity = 256 * kMiB;

  void SetUp() override;
  void TearDown() override;
  // The device of the cases: a HostBackedDevice of kCapacity bytes (the gpu suite: a GPU's).
  virtual Result<std::unique_ptr<TestDevice>> makeDevice();
  // The HostBackedDevice when that is the device (its copy count and failures), else nullptr.
  HostBackedDevice* hostBacked() const;

  // Both sides connected; the test skipped where the device does not move device memory (a case
  // returns when IsSkipped() after it).
  void connect(const PairOptions& options = {});
  // size bytes on the device (or the host) filled with pattern(seed), registered on side's PD.
  ::testing::AssertionResult make(Side& side, bool onDevice, size_t size, uint64_t seed,
                                  DeviceTestBuffer* out);
  // What the buffer holds now (read back from the device for device memory).
  std::vector<uint8_t> contents(const DeviceTestBuffer& b);
  // Writes bytes at offset into the buffer.
  bool store(const DeviceTestBuffer& b, size_t offset, std::span<const uint8_t> bytes);
  // A signaled request of `opcode` from all of local to the start of remote.
  static SendOp toRemote(WrOpcode opcode, uint64_t wrId, const DeviceTestBuffer& local,
                         const DeviceTestBuffer& remote);

  // The cases (FERRY_DEVICE_MEMORY_CASES).
  void registersWhereTheDeviceMovesIt();
  void writeAndReadMoveEveryByte();
  void sendAndWriteWithImmediateLand();
  void atomicsReturnTheOriginalValue();
  void inlineDataIsRefusedAtThePost();

  std::unique_ptr<TestDevice> device_;
  std::unique_ptr<ConnectedPair> pair_;
  std::vector<TestBuffer> host_;
};

// The cases as tests of Fixture (DeviceMemoryTest or a fixture derived from it).
#define FERRY_DEVICE_MEMORY_CASES(Fixture)                                                            \
  TEST_P(Fixture, RegistersWhereTheDeviceMovesItAndSaysWhere) { registersWhereTheDeviceMovesIt(); }   \
  TEST_P(Fixture, WriteAndReadMoveEveryByteBetweenEitherKind) { writeAndReadMoveEveryByte(); }        \
  TEST_P(Fixture, SendAndWriteWithImmediateLandInDeviceReceives) { sendAndWriteWithImmediateLand(); } \
  TEST_P(Fixture, AtomicsOnDeviceMemoryReturnTheOriginalValue) { atomicsReturnTheOriginalValue(); }   \
  TEST_P(Fixture, InlineDataFromDeviceMemoryIsRefusedAtThePost) { inlineDataIsRefusedAtThePost(); }

}  // namespace ferry::test
