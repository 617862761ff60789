// The device memory cases (device_memory_cases.h), for the conformance suite and the gpu suite.
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/host_backed_device.h"
#include "verbs/device_memory_cases.h"

namespace ferry::test {
namespace {

// Small, odd, a whole staging buffer and more, and large enough for the soft TCP stripe (1 MiB).
constexpr size_t kDeviceSizes[] = {1, 4097, 300 * 1000, 4 * kMiB + 13};

v::Sge whole(const DeviceTestBuffer& b) {
  return v::Sge{.addr = reinterpret_cast<uint64_t>(b.addr),
                .length = static_cast<uint32_t>(b.size),
                .lkey = b.mr.lkey()};
}

// The kinds of the two ends of a transfer: device to host, host to device, device to device.
struct Ends {
  bool source;
  bool destination;
  const char* name;
};
constexpr Ends kEnds[] = {
    {true, false, "device to host"}, {false, true, "host to device"}, {true, true, "device to device"}};

// Whether a device's NIC reads and writes device memory itself (no staging).
bool readsInPlace(const std::string& moves) { return moves == "dma-buf" || moves == "peer-memory"; }

uint64_t wordAt(const std::vector<uint8_t>& bytes, size_t offset) {
  uint64_t v = 0;
  if (bytes.size() >= offset + 8) std::memcpy(&v, bytes.data() + offset, 8);
  return v;
}

}  // namespace

SendOp DeviceMemoryTest::toRemote(WrOpcode opcode, uint64_t wrId, const DeviceTestBuffer& local,
                                  const DeviceTestBuffer& remote) {
  return SendOp{.opcode = opcode,
                .wrId = wrId,
                .sges = {whole(local)},
                .remoteAddr = reinterpret_cast<uint64_t>(remote.addr),
                .rkey = remote.mr.rkey()};
}

void DeviceMemoryTest::SetUp() {
  VerbsTest::SetUp();
  if (IsSkipped() || HasFatalFailure()) return;
  auto device = makeDevice();
  if (!device.isOk()) {
    if (std::getenv("FERRY_REQUIRE_CUDA") != nullptr &&
        std::string(std::getenv("FERRY_REQUIRE_CUDA")) == "1") {
      FAIL() << "FERRY_REQUIRE_CUDA=1: " << device.status().toString();
    }
    GTEST_SKIP() << device.status().toString();
  }
  device_ = std::move(*device);
}

void DeviceMemoryTest::TearDown() {
  pair_.reset();
  host_.clear();
  device_.reset();  // after every region on it is closed
  VerbsTest::TearDown();
}

Result<std::unique_ptr<TestDevice>> DeviceMemoryTest::makeDevice() {
  return std::unique_ptr<TestDevice>(std::make_unique<HostBackedDevice>(kCapacity));
}

HostBackedDevice* DeviceMemoryTest::hostBacked() const {
  return dynamic_cast<HostBackedDevice*>(device_.get());
}

void DeviceMemoryTest::connect(const PairOptions& options) {
  ASSERT_OK_AND_ASSIGN(pair_, makePair(options));
  if (pair_->a.context->info().deviceMemory.empty()) GTEST_SKIP() << "the device moves host memory only";
  if (readsInPlace(pair_->a.context->info().deviceMemory) && hostBacked() != nullptr)
    GTEST_SKIP() << "the NIC reads device memory in place (dma-bufs or peer memory), which the host-backed "
                    "test device has none of";
}

::testing::AssertionResult DeviceMemoryTest::make(Side& side, bool onDevice, size_t size, uint64_t seed,
                                                  DeviceTestBuffer* out) {
  out->size = size;
  out->onDevice = onDevice;
  std::vector<uint8_t> pattern(size);
  fillPattern(pattern, seed);
  if (onDevice) {
    out->addr = device_->allocate(size);
    if (out->addr == nullptr) return ::testing::AssertionFailure() << "the test device is full";
  } else {
    host_.emplace_back(size);
    out->addr = host_.back().data();
  }
  if (!store(*out, 0, pattern)) return ::testing::AssertionFailure() << "the device refused the pattern";
  auto mr = side.pd.registerMemory(out->addr, size, access::kAll);
  if (!mr.isOk()) return ::testing::AssertionFailure() << mr.status().toString();
  out->mr = std::move(*mr);
  return ::testing::AssertionSuccess();
}

std::vector<uint8_t> DeviceMemoryTest::contents(const DeviceTestBuffer& b) {
  if (b.onDevice) return device_->read(b.addr, b.size);
  return std::vector<uint8_t>(b.addr, b.addr + b.size);
}

bool DeviceMemoryTest::store(const DeviceTestBuffer& b, size_t offset, std::span<const uint8_t> bytes) {
  if (b.onDevice) return device_->write(b.addr + offset, bytes);
  std::memcpy(b.addr + offset, bytes.data(), bytes.size());
  return true;
}

void DeviceMemoryTest::registersWhereTheDeviceMovesIt() {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  uint8_t* addr = device_->allocate(8192);
  ASSERT_NE(addr, nullptr);
  auto mr = pair->a.pd.registerMemory(addr, 8192, access::kAll);
  const std::string& moves = pair->a.context->info().deviceMemory;
  if (moves == "peer-memory" && hostBacked() != nullptr) {
    // ibv_reg_mr pins the range: the peer memory module knows no test device, the kernel no such pages.
    EXPECT_FALSE(mr.isOk());
    return;
  }
  if (moves.empty() || (moves == "dma-buf" && hostBacked() != nullptr)) {
    ASSERT_TRUE(hasCode(mr.status(), StatusCode::kNotSupported));
    EXPECT_NE(mr.status().message().find("cuda:0"), std::string::npos) << mr.status().toString();
    // A NIC says why: it (or libibverbs) takes no dma-bufs, or the memory cannot be one.
    if (pair->a.context->info().provider == "ibverbs")
      EXPECT_NE(mr.status().message().find("dma-buf"), std::string::npos) << mr.status().toString();
    return;
  }
  ASSERT_OK(mr);
  EXPECT_EQ(mr->location(), (MemoryLocation{MemoryKind::kCuda, 0}));
  EXPECT_EQ(mr->location().toString(), "cuda:0");
  // A range that starts on the device and runs past its memory is refused, whole.
  auto across = pair->a.pd.registerMemory(addr, kCapacity + 4096, access::kAll);
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

void DeviceMemoryTest::writeAndReadMoveEveryByte() {
  ASSERT_NO_FATAL_FAILURE(connect());
  if (IsSkipped()) return;  // the device moves host memory only
  uint64_t wrId = 0;
  for (const Ends& ends : kEnds) {
    for (size_t size : kDeviceSizes) {
      for (WrOpcode opcode : {WrOpcode::kRdmaWrite, WrOpcode::kRdmaRead}) {
        const bool write = opcode == WrOpcode::kRdmaWrite;
        SCOPED_TRACE(std::string(ends.name) + (write ? ", WRITE of " : ", READ of ") + std::to_string(size));
        // WRITE: a's buffer is the source; READ: b's buffer is.
        DeviceTestBuffer local, remote;
        const uint64_t localSeed = 100 + wrId, remoteSeed = 200 + wrId;
        ASSERT_TRUE(make(pair_->a, write ? ends.source : ends.destination, size, localSeed, &local));
        ASSERT_TRUE(make(pair_->b, write ? ends.destination : ends.source, size, remoteSeed, &remote));
        const uint64_t copiedBefore = hostBacked() ? hostBacked()->bytesCopied() : 0;
        WorkCompletion wc;
        ASSERT_TRUE(postAndWait(pair_->a, toRemote(opcode, ++wrId, local, remote), &wc));
        ASSERT_TRUE(succeeded(wc, wrId, write ? WcOpcode::kRdmaWrite : WcOpcode::kRdmaRead));
        const uint64_t sourceSeed = write ? localSeed : remoteSeed;
        EXPECT_TRUE(matchesPattern(contents(write ? remote : local), sourceSeed)) << "the destination";
        EXPECT_TRUE(matchesPattern(contents(write ? local : remote), sourceSeed)) << "the source, untouched";
        if (hostBacked()) {
          // Every byte of device memory passes through the device's copies: staged, one copy per
          // end on the device; device to device on the same-host path, one copy by the device.
          const bool oneCopy = ends.source && ends.destination && carriesOutInThePost(providerPath());
          const uint64_t copies = oneCopy ? 1 : (ends.source ? 1 : 0) + (ends.destination ? 1 : 0);
          EXPECT_GE(hostBacked()->bytesCopied() - copiedBefore, copies * size) << "moved through copies";
        }
      }
    }
  }
}

void DeviceMemoryTest::sendAndWriteWithImmediateLand() {
  ASSERT_NO_FATAL_FAILURE(connect());
  if (IsSkipped()) return;  // the device moves host memory only
  uint64_t wrId = 0;
  for (const Ends& ends : kEnds) {
    for (WrOpcode opcode : {WrOpcode::kSend, WrOpcode::kRdmaWriteWithImm}) {
      const size_t size = 300 * 1000;
      const bool send = opcode == WrOpcode::kSend;
      SCOPED_TRACE(std::string(ends.name) + (send ? ", SEND" : ", WRITE_WITH_IMM"));
      DeviceTestBuffer source, destination;
      const uint64_t seed = 300 + wrId;
      ASSERT_TRUE(make(pair_->a, ends.source, size, seed, &source));
      ASSERT_TRUE(make(pair_->b, ends.destination, size, 400 + wrId, &destination));
      const uint64_t recvId = 1000 + wrId;
      ASSERT_OK(postReceive(pair_->b.qp, recvId, {whole(destination)}));
      SendOp op = toRemote(opcode, ++wrId, source, destination);
      op.imm = 0x5eed0000u + static_cast<uint32_t>(wrId);
      ASSERT_OK(post(pair_->a.qp, op));
      WorkCompletion wc;
      ASSERT_NO_FATAL_FAILURE(
          expectDelivered(*pair_,
                          {.sendId = wrId,
                           .sent = send ? WcOpcode::kSend : WcOpcode::kRdmaWrite,
                           .recvId = recvId,
                           .received = send ? WcOpcode::kRecv : WcOpcode::kRecvRdmaWithImm},
                          &wc));
      if (send) EXPECT_EQ(wc.byteLen, size);
      if (!send) EXPECT_EQ(wc.immData, op.imm);
      EXPECT_TRUE(matchesPattern(contents(destination), seed));
    }
  }
}

void DeviceMemoryTest::atomicsReturnTheOriginalValue() {
  ASSERT_NO_FATAL_FAILURE(connect());
  if (IsSkipped()) return;  // the device moves host memory only
  DeviceTestBuffer target, result;
  ASSERT_TRUE(make(pair_->b, true, 64, 1, &target));
  ASSERT_TRUE(make(pair_->a, true, 64, 2, &result));
  const uint64_t start = 0x1111;
  ASSERT_TRUE(store(target, 8, {reinterpret_cast<const uint8_t*>(&start), 8}));
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
    EXPECT_EQ(wordAt(contents(result), 16), step.before);
    EXPECT_EQ(wordAt(contents(target), 8), step.after);
  }
  // The bytes around the target are as they were.
  const std::vector<uint8_t> after = contents(target);
  EXPECT_TRUE(matchesPattern(std::span<const uint8_t>(after).subspan(0, 8), 1));
  EXPECT_TRUE(matchesPattern(std::span<const uint8_t>(after).subspan(16), 1, 16));
}

void DeviceMemoryTest::inlineDataIsRefusedAtThePost() {
  PairOptions options;
  options.qpA.cap.maxInlineData = 64;
  ASSERT_NO_FATAL_FAILURE(connect(options));
  if (IsSkipped()) return;
  DeviceTestBuffer source, destination;
  ASSERT_TRUE(make(pair_->a, true, 64, 5, &source));
  ASSERT_TRUE(make(pair_->b, false, 64, 6, &destination));
  SendOp op = toRemote(WrOpcode::kRdmaWrite, 1, source, destination);
  op.flags |= send_flags::kInline;
  const Status refused = post(pair_->a.qp, op);
  EXPECT_TRUE(hasCode(refused, StatusCode::kInvalidArgument)) << refused.toString();
  EXPECT_NE(refused.message().find("CUDA device memory"), std::string::npos) << refused.toString();
  EXPECT_TRUE(noCompletionFor(pair_->a.sendCq, milliseconds(50)));
  EXPECT_TRUE(matchesPattern(contents(destination), 6)) << "nothing moved";
  // The QP still works: the same bytes go from the region.
  op.flags &= ~send_flags::kInline;
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair_->a, op, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(matchesPattern(contents(destination), 5));
}

}  // namespace ferry::test
