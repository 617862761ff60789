// CUDA device memory through the verbs API, over every provider path, on any host: a topic of the
// conformance suite, with a fixture of its own. The device is a HostBackedDevice
// (tests/support/host_backed_device.h), whose memory the host cannot touch: a path that read or
// wrote it in place would fault. Every case checks the bytes the device holds afterwards, and that
// they moved through copies.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/host_backed_device.h"
#include "verbs/conformance.h"

namespace ferry::test {
namespace {

constexpr size_t kDeviceCapacity = 256 * kMiB;
// Small, odd, a whole staging buffer and more, and large enough for the soft TCP stripe (1 MiB).
constexpr size_t kDeviceSizes[] = {1, 4097, 300 * 1000, 4 * kMiB + 13};

// Memory of one kind, registered: on the test device, or host memory.
struct Buffer {
  uint8_t* addr = nullptr;
  size_t size = 0;
  v::MemoryRegion mr;
  bool onDevice = false;
};

class DeviceMemoryTest : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    device_ = std::make_unique<HostBackedDevice>(kDeviceCapacity);
  }
  void TearDown() override {
    pair_.reset();
    host_.clear();
    device_.reset();  // after every region on it is closed
    VerbsTest::TearDown();
  }

  // Both sides connected; skipped where the device does not move device memory.
  void connect() {
    ASSERT_OK_AND_ASSIGN(pair_, makePair());
    if (pair_->a.context->info().deviceMemory.empty()) GTEST_SKIP() << "the device moves host memory only";
  }

  // size bytes on the device (or the host) filled with pattern(seed), registered on side's PD.
  ::testing::AssertionResult make(Side& side, bool onDevice, size_t size, uint64_t seed, Buffer* out) {
    out->size = size;
    out->onDevice = onDevice;
    if (onDevice) {
      out->addr = device_->allocate(size);
      if (out->addr == nullptr) return ::testing::AssertionFailure() << "the test device is full";
    } else {
      host_.emplace_back(size);
      out->addr = host_.back().data();
    }
    fillPattern(bytes(*out), seed);
    auto mr = side.pd.registerMemory(out->addr, size, access::kAll);
    if (!mr.isOk()) return ::testing::AssertionFailure() << mr.status().toString();
    out->mr = std::move(*mr);
    return ::testing::AssertionSuccess();
  }

  // What the buffer holds (the device's bytes for device memory).
  std::span<uint8_t> bytes(const Buffer& b) const {
    return b.onDevice ? device_->held(b.addr, b.size) : std::span<uint8_t>(b.addr, b.size);
  }

  std::unique_ptr<HostBackedDevice> device_;
  std::unique_ptr<ConnectedPair> pair_;
  std::vector<TestBuffer> host_;
};

v::Sge whole(const Buffer& b) {
  return v::Sge{.addr = reinterpret_cast<uint64_t>(b.addr),
                .length = static_cast<uint32_t>(b.size),
                .lkey = b.mr.lkey()};
}

SendOp toRemote(WrOpcode opcode, uint64_t wrId, const Buffer& local, const Buffer& remote) {
  return SendOp{.opcode = opcode,
                .wrId = wrId,
                .sges = {whole(local)},
                .remoteAddr = reinterpret_cast<uint64_t>(remote.addr),
                .rkey = remote.mr.rkey()};
}

// The kinds of the two ends of a transfer: device to host, host to device, device to device.
struct Ends {
  bool source;
  bool destination;
  const char* name;
};
constexpr Ends kEnds[] = {
    {true, false, "device to host"}, {false, true, "host to device"}, {true, true, "device to device"}};

TEST_P(DeviceMemoryTest, RegistersWhereTheDeviceMovesItAndSaysWhere) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  uint8_t* addr = device_->allocate(8192);
  auto mr = pair->a.pd.registerMemory(addr, 8192, access::kAll);
  if (pair->a.context->info().deviceMemory.empty()) {
    ASSERT_TRUE(hasCode(mr.status(), StatusCode::kNotSupported));
    EXPECT_NE(mr.status().message().find("cuda:0"), std::string::npos) << mr.status().toString();
    return;
  }
  ASSERT_OK(mr);
  EXPECT_EQ(mr->location(), (MemoryLocation{MemoryKind::kCuda, 0}));
  EXPECT_EQ(mr->location().toString(), "cuda:0");
  // A range that starts on the device and runs past its memory is refused, whole.
  auto across = pair->a.pd.registerMemory(addr, kDeviceCapacity + 4096, access::kAll);
  EXPECT_TRUE(hasCode(across.status(), StatusCode::kInvalidArgument)) << across.status().toString();
  // A region stays where it is: host memory is no new translation for it, nor it for host memory.
  TestBuffer host(4096);
  EXPECT_TRUE(hasCode(mr->reregister(v::rereg::kChangeTranslation, nullptr, host.data(), 4096, access::kAll),
                      StatusCode::kNotSupported));
  ASSERT_OK_AND_ASSIGN(auto hostMr, pair->a.pd.registerMemory(host.data(), 4096, access::kAll));
  EXPECT_EQ(hostMr.location(), MemoryLocation{});
  EXPECT_TRUE(hasCode(hostMr.reregister(v::rereg::kChangeTranslation, nullptr, addr, 4096, access::kAll),
                      StatusCode::kNotSupported));
  // Another range of the device is a new translation it takes.
  EXPECT_OK(mr->reregister(v::rereg::kChangeTranslation, nullptr, addr + 4096, 4096, access::kAll));
  EXPECT_EQ(mr->location(), (MemoryLocation{MemoryKind::kCuda, 0}));
}

TEST_P(DeviceMemoryTest, WriteAndReadMoveEveryByteBetweenEitherKind) {
  ASSERT_NO_FATAL_FAILURE(connect());
  uint64_t wrId = 0;
  for (const Ends& ends : kEnds) {
    for (size_t size : kDeviceSizes) {
      for (WrOpcode opcode : {WrOpcode::kRdmaWrite, WrOpcode::kRdmaRead}) {
        const bool write = opcode == WrOpcode::kRdmaWrite;
        SCOPED_TRACE(std::string(ends.name) + (write ? ", WRITE of " : ", READ of ") + std::to_string(size));
        // WRITE: a's buffer is the source; READ: b's buffer is.
        Buffer local, remote;
        const bool localOnDevice = write ? ends.source : ends.destination;
        const bool remoteOnDevice = write ? ends.destination : ends.source;
        ASSERT_TRUE(make(pair_->a, localOnDevice, size, 100 + wrId, &local));
        ASSERT_TRUE(make(pair_->b, remoteOnDevice, size, 200 + wrId, &remote));
        const uint64_t copiedBefore = device_->bytesCopied();
        WorkCompletion wc;
        ASSERT_TRUE(postAndWait(pair_->a, toRemote(opcode, ++wrId, local, remote), &wc));
        ASSERT_TRUE(succeeded(wc, wrId, write ? WcOpcode::kRdmaWrite : WcOpcode::kRdmaRead));
        const Buffer& source = write ? local : remote;
        const Buffer& destination = write ? remote : local;
        EXPECT_TRUE(matchesPattern(bytes(destination), write ? 100 + wrId - 1 : 200 + wrId - 1));
        EXPECT_TRUE(matchesPattern(bytes(source), write ? 100 + wrId - 1 : 200 + wrId - 1));
        const uint64_t ends_on_device = (ends.source ? 1 : 0) + (ends.destination ? 1 : 0);
        EXPECT_GE(device_->bytesCopied() - copiedBefore, ends_on_device * size) << "staged through copies";
      }
    }
  }
}

TEST_P(DeviceMemoryTest, SendAndWriteWithImmediateLandInDeviceReceives) {
  ASSERT_NO_FATAL_FAILURE(connect());
  uint64_t wrId = 0;
  for (const Ends& ends : kEnds) {
    for (WrOpcode opcode : {WrOpcode::kSend, WrOpcode::kRdmaWriteWithImm}) {
      const size_t size = 300 * 1000;
      SCOPED_TRACE(std::string(ends.name) + (opcode == WrOpcode::kSend ? ", SEND" : ", WRITE_WITH_IMM"));
      Buffer source, destination;
      ASSERT_TRUE(make(pair_->a, ends.source, size, 300 + wrId, &source));
      ASSERT_TRUE(make(pair_->b, ends.destination, size, 400 + wrId, &destination));
      const uint64_t recvId = 1000 + wrId;
      ASSERT_OK(postReceive(pair_->b.qp, recvId, {whole(destination)}));
      SendOp op = toRemote(opcode, ++wrId, source, destination);
      op.imm = 0x5eed0000u + static_cast<uint32_t>(wrId);
      ASSERT_OK(post(pair_->a.qp, op));
      WorkCompletion wc;
      const bool send = opcode == WrOpcode::kSend;
      ASSERT_NO_FATAL_FAILURE(
          expectDelivered(*pair_,
                          {.sendId = wrId,
                           .sent = send ? WcOpcode::kSend : WcOpcode::kRdmaWrite,
                           .recvId = recvId,
                           .received = send ? WcOpcode::kRecv : WcOpcode::kRecvRdmaWithImm},
                          &wc));
      if (send) EXPECT_EQ(wc.byteLen, size);
      EXPECT_TRUE(matchesPattern(bytes(destination), 300 + wrId - 1));
    }
  }
}

TEST_P(DeviceMemoryTest, AtomicsOnDeviceMemoryReturnTheOriginalValue) {
  ASSERT_NO_FATAL_FAILURE(connect());
  Buffer target, result;
  ASSERT_TRUE(make(pair_->b, true, 64, 1, &target));
  ASSERT_TRUE(make(pair_->a, true, 64, 2, &result));
  const uint64_t start = 0x1111;
  std::memcpy(bytes(target).data() + 8, &start, 8);
  struct Step {
    WrOpcode opcode;
    uint64_t compareAdd, swap, before, after;
  };
  const Step steps[] = {
      {WrOpcode::kAtomicCmpAndSwp, 0x1111, 0x2222, 0x1111, 0x2222},  // compare matches: swapped
      {WrOpcode::kAtomicCmpAndSwp, 0x1111, 0x3333, 0x2222, 0x2222},  // no match: unchanged
      {WrOpcode::kAtomicFetchAndAdd, 5, 0, 0x2222, 0x2227},
  };
  uint64_t wrId = 0;
  for (const Step& step : steps) {
    SCOPED_TRACE("step " + std::to_string(wrId + 1));
    SendOp op = toRemote(step.opcode, ++wrId, result, target);
    op.sges = {
        v::Sge{.addr = reinterpret_cast<uint64_t>(result.addr) + 16, .length = 8, .lkey = result.mr.lkey()}};
    op.remoteAddr = reinterpret_cast<uint64_t>(target.addr) + 8;
    op.compareAdd = step.compareAdd;
    op.swap = step.swap;
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(pair_->a, op, &wc));
    ASSERT_TRUE(succeeded(
        wc, wrId, step.opcode == WrOpcode::kAtomicCmpAndSwp ? WcOpcode::kCompSwap : WcOpcode::kFetchAdd));
    uint64_t returned = 0, now = 0;
    std::memcpy(&returned, bytes(result).data() + 16, 8);
    std::memcpy(&now, bytes(target).data() + 8, 8);
    EXPECT_EQ(returned, step.before);
    EXPECT_EQ(now, step.after);
  }
  // The bytes around the target are as they were.
  EXPECT_TRUE(matchesPattern(bytes(target).subspan(0, 8), 1));
  EXPECT_TRUE(matchesPattern(bytes(target).subspan(16), 1, 16));
}

TEST_P(DeviceMemoryTest, InlineDataFromDeviceMemoryIsRefusedAtThePost) {
  ASSERT_OK_AND_ASSIGN(pair_, makePair({.qpA = {.cap = {.maxSendWr = 16,
                                                        .maxRecvWr = 16,
                                                        .maxSendSge = 2,
                                                        .maxRecvSge = 2,
                                                        .maxInlineData = 64}}}));
  if (pair_->a.context->info().deviceMemory.empty()) GTEST_SKIP() << "the device moves host memory only";
  Buffer source, destination;
  ASSERT_TRUE(make(pair_->a, true, 64, 5, &source));
  ASSERT_TRUE(make(pair_->b, false, 64, 6, &destination));
  SendOp op = toRemote(WrOpcode::kRdmaWrite, 1, source, destination);
  op.flags |= send_flags::kInline;
  const Status refused = post(pair_->a.qp, op);
  EXPECT_TRUE(hasCode(refused, StatusCode::kInvalidArgument)) << refused.toString();
  EXPECT_NE(refused.message().find("CUDA device memory"), std::string::npos) << refused.toString();
  EXPECT_TRUE(noCompletionFor(pair_->a.sendCq, milliseconds(50)));
  EXPECT_TRUE(matchesPattern(bytes(destination), 6)) << "nothing moved";
  // The QP still works: the same bytes go from the region.
  op.flags &= ~send_flags::kInline;
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, op, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(matchesPattern(bytes(destination), 5));
}

TEST_P(DeviceMemoryTest, ADeviceThatStopsAnsweringFailsTheRequestNotTheProcess) {
  ASSERT_NO_FATAL_FAILURE(connect());
  Buffer source, destination;
  ASSERT_TRUE(make(pair_->a, true, 300 * 1000, 7, &source));
  ASSERT_TRUE(make(pair_->b, false, 300 * 1000, 8, &destination));
  device_->failCopies(true);
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, toRemote(WrOpcode::kRdmaWrite, 1, source, destination), &wc));
  EXPECT_EQ(wc.wrId, 1u);
  EXPECT_NE(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(reachesState(pair_->a.qp, QpState::kErr));
}

TEST_P(DeviceMemoryTest, ALostDeviceAtTheResponderRefusesTheWrite) {
  ASSERT_NO_FATAL_FAILURE(connect());
  Buffer source, destination;
  ASSERT_TRUE(make(pair_->a, false, 300 * 1000, 9, &source));
  ASSERT_TRUE(make(pair_->b, true, 300 * 1000, 10, &destination));
  device_->failCopies(true);
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, toRemote(WrOpcode::kRdmaWrite, 1, source, destination), &wc));
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr)) << describe(wc);
  device_->failCopies(false);
  EXPECT_TRUE(matchesPattern(bytes(destination), 10)) << "nothing landed";
}

INSTANTIATE_TEST_SUITE_P(Providers, DeviceMemoryTest, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

}  // namespace
}  // namespace ferry::test
