// The same-host path with device memory (share_test's part for it): a region of device memory is
// published with its device and IPC handle, an accessor's copies with it are the driver's (one copy,
// device to device or between the device and host memory, nothing staged), and an accessor closes
// the allocations it opened once no record names them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "common/cuda_driver.h"
#include "providers/soft/same_host/share.h"
#include "support/host_backed_device.h"
#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
using soft::SharePeer;
using soft::ShareTable;

constexpr uint32_t kOwner = 0x4321;
constexpr uint32_t kAccessor = 0x8765;
constexpr uint32_t kAll = v::access::kRemoteWrite | v::access::kRemoteRead | v::access::kLocalWrite;

// Device memory that only opens and closes IPC handles: how many of each, and which are open.
class HandleCounter final : public cuda::DeviceMemory {
 public:
  HandleCounter() { cuda::installDeviceMemory(this); }
  ~HandleCounter() override { cuda::installDeviceMemory(nullptr); }
  HandleCounter(const HandleCounter&) = delete;
  HandleCounter& operator=(const HandleCounter&) = delete;

  MemoryLocation locate(const void*) override { return {}; }
  Status copy(void*, MemoryLocation, const void*, MemoryLocation, size_t) override {
    return Status(StatusCode::kIoError, "no copies here");
  }
  Result<cuda::IpcMapping> openIpc(const cuda::IpcHandle& handle) override {
    ++opened;
    open.insert(handle.base);
    return cuda::IpcMapping{reinterpret_cast<void*>(handle.base + 0x100000),
                            MemoryLocation{MemoryKind::kCuda, 0}};
  }
  void closeIpc(const cuda::IpcMapping& mapping) override {
    ++closed;
    open.erase(reinterpret_cast<uintptr_t>(mapping.base) - 0x100000);
  }

  int opened = 0, closed = 0;
  std::set<uint64_t> open;  // by the allocation's base in the exporter
};

cuda::IpcHandle handleFor(uint64_t base, uint8_t tag) {
  cuda::IpcHandle h;
  h.bytes.fill(tag);
  h.uuid.fill(0x42);
  h.base = base;
  h.length = 1 << 20;
  return h;
}

TEST(ShareTableDevice, AnAccessorClosesTheAllocationsNoRecordNames) {
  HandleCounter driver;
  ASSERT_OK_AND_ASSIGN(auto table, ShareTable::create());
  int pd = 0;
  const cuda::IpcHandle named = handleFor(0x7f0000000000, 1), unnamed = handleFor(0x7f0000200000, 2);
  const MemoryLocation gpu{MemoryKind::kCuda, 0};
  table->publishMr(0x00aa0001, reinterpret_cast<void*>(named.base + 4096), 8192, kAll, &pd, gpu, &named);
  ASSERT_OK_AND_ASSIGN(auto peer, SharePeer::open(table->info()));
  std::weak_ptr<SharePeer::DeviceMapping> kept = peer->deviceMapping(named);
  std::weak_ptr<SharePeer::DeviceMapping> dropped = peer->deviceMapping(unnamed);
  ASSERT_FALSE(kept.expired());
  ASSERT_FALSE(dropped.expired());
  EXPECT_EQ(peer->deviceMapping(named), kept.lock()) << "a handle is opened once";
  EXPECT_EQ(driver.opened, 2);
  EXPECT_EQ(peer->deviceMappings(), 2u);

  peer->sweepMappings(/*now=*/true);
  EXPECT_TRUE(dropped.expired()) << "no record names it: closed";
  EXPECT_FALSE(kept.expired()) << "a record still names it";
  EXPECT_EQ(driver.closed, 1);
  EXPECT_EQ(driver.open.count(named.base), 1u);

  table->withdrawMr(0x00aa0001);
  peer->sweepMappings(/*now=*/true);
  EXPECT_TRUE(kept.expired()) << "the region was deregistered: its allocation is closed here too";
  EXPECT_EQ(driver.closed, 2);
  EXPECT_EQ(peer->deviceMappings(), 0u);
}

TEST(ShareTableDevice, InTheOwnersProcessDeviceMemoryIsReachedByItsOwnPointers) {
  HostBackedDevice device(1 << 20);
  ASSERT_OK_AND_ASSIGN(auto table, ShareTable::create());
  int pd = 0;
  uint8_t* region = device.allocate(8192);
  table->publishQp(kOwner, v::QpState::kRts, kAll, &pd, kAccessor);
  table->publishMr(0x00bb0001, region, 8192, kAll, &pd, device.locate(region), nullptr);
  ASSERT_OK_AND_ASSIGN(auto peer, SharePeer::open(table->info()));
  ASSERT_OK_AND_ASSIGN(auto slot, SharePeer::claim(peer));
  const auto at = reinterpret_cast<uintptr_t>(region);
  ASSERT_TRUE(slot->begin(kOwner, kAccessor, 0x00bb0001, at + 100, 1000, v::access::kRemoteWrite));
  EXPECT_TRUE(slot->onDevice());
  EXPECT_FALSE(slot->mapped());
  std::vector<uint8_t> bytes(1000);
  fillPattern(bytes, 7);
  const iovec local{bytes.data(), bytes.size()};
  const iovec remote{reinterpret_cast<void*>(at + 100), bytes.size()};
  const uint64_t copied = device.bytesCopied();
  EXPECT_TRUE(slot->copyThroughDriver(true, {&local, 1}, nullptr, {&remote, 1}));
  slot->end();
  EXPECT_EQ(device.bytesCopied() - copied, 1000u) << "one copy by the device";
  EXPECT_TRUE(matchesPattern(device.held(region + 100, 1000), 7));
  // The record is still checked: past the region's end is refused.
  EXPECT_FALSE(slot->begin(kOwner, kAccessor, 0x00bb0001, at + 8000, 1000, v::access::kRemoteWrite));
}

TEST(ShareTableDevice, AHandleThatCannotBeOpenedOrARegionOutsideItsAllocationIsRefused) {
  // The owner is another process (a child: this one may read its memory), so its pointers are not
  // ours: the handle is what would open them.
  HandleCounter driver;
  const cuda::IpcHandle ipc = handleFor(0x7f0000400000, 3);
  int toParent[2], toChild[2];
  ASSERT_EQ(pipe(toParent), 0);
  ASSERT_EQ(pipe(toChild), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto table = ShareTable::create();
    if (!table.isOk()) _exit(1);
    int pd = 0;
    const MemoryLocation gpu{MemoryKind::kCuda, 0};
    (*table)->publishQp(kOwner, v::QpState::kRts, kAll, &pd, kAccessor);
    // A region the handle's allocation does not hold, and one published with no handle at all.
    (*table)->publishMr(0x00cc0001, reinterpret_cast<void*>(ipc.base + ipc.length - 4096), 8192, kAll, &pd,
                        gpu, &ipc);
    (*table)->publishMr(0x00cc0101, reinterpret_cast<void*>(ipc.base), 4096, kAll, &pd, gpu, nullptr);
    const soft::ShareInfo info = (*table)->info();
    char done = 0;
    if (write(toParent[1], &info, sizeof info) != sizeof info || read(toChild[0], &done, 1) != 1) _exit(2);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  soft::ShareInfo info;
  ASSERT_EQ(read(toParent[0], &info, sizeof info), static_cast<ssize_t>(sizeof info));
  auto peer = SharePeer::open(info);
  EXPECT_TRUE(isOk(peer.status()));
  if (peer.isOk()) {
    ASSERT_OK_AND_ASSIGN(auto slot, SharePeer::claim(*peer));
    EXPECT_FALSE(
        slot->begin(kOwner, kAccessor, 0x00cc0001, ipc.base + ipc.length - 4096, 64, v::access::kRemoteWrite))
        << "the region runs past the allocation the handle opens";
    EXPECT_FALSE(slot->begin(kOwner, kAccessor, 0x00cc0101, ipc.base, 64, v::access::kRemoteWrite))
        << "no handle: only the owner's process reaches it";
    EXPECT_EQ(driver.opened, 0) << "neither was opened";
  }
  const char done = 1;
  EXPECT_EQ(write(toChild[1], &done, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int fd : {toParent[0], toParent[1], toChild[0], toChild[1]}) close(fd);
}

// Through the verbs API, on the paths that carry requests out in the post.
class SameHostDevicePath : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    if (!carriesOutInThePost(providerPath())) GTEST_SKIP() << "the same-host path is the soft provider's";
    if (!soft::sameHostAllowed()) GTEST_SKIP() << "this kernel refuses process_vm_readv here";
  }
};

TEST_P(SameHostDevicePath, DeviceMemoryMovesByOneDeviceCopyNotStaged) {
  HostBackedDevice device(16 << 20);
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  constexpr size_t kSize = (1 << 20) + 13;
  uint8_t* src = device.allocate(kSize);
  uint8_t* dst = device.allocate(kSize);
  fillPattern(device.held(src, kSize), 61);
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion srcMr, pair->a.pd.registerMemory(src, kSize, v::access::kAll));
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion dstMr, pair->b.pd.registerMemory(dst, kSize, v::access::kAll));
  ASSERT_OK_AND_ASSIGN(auto host, registerBuffer(pair->a.pd, kSize, v::access::kAll, 62));
  ASSERT_OK_AND_ASSIGN(auto remoteHost, registerBuffer(pair->b.pd, kSize, v::access::kAll, 63));
  auto request = [&](v::WrOpcode opcode, uint64_t wrId, v::Sge sge, const void* remote, uint32_t rkey) {
    v::WorkCompletion wc;
    EXPECT_TRUE(isOk(post(pair->a.qp, {.opcode = opcode,
                                       .wrId = wrId,
                                       .sges = {sge},
                                       .remoteAddr = reinterpret_cast<uintptr_t>(remote),
                                       .rkey = rkey})));
    EXPECT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess) << "request " << wrId;
  };
  // The first request may go over TCP while the requester connection comes up.
  request(v::WrOpcode::kRdmaWrite, 1, sgeOf(host, 0, 64), remoteHost.data(), remoteHost.mr.rkey());

  const uint64_t ops = soft::sameHostDeviceOpsDone(), copied = device.bytesCopied();
  request(v::WrOpcode::kRdmaWrite, 2, sgeOf(srcMr, 0, kSize), dst, dstMr.rkey());
  EXPECT_TRUE(matchesPattern(device.held(dst, kSize), 61)) << "WRITE: device to device";
  request(v::WrOpcode::kRdmaRead, 3, sgeOf(host.mr, 0, kSize), dst, dstMr.rkey());
  EXPECT_TRUE(matchesPattern(bytesOf(host), 61)) << "READ: device to host";
  fillPattern(host.memory.bytes(), 64);
  request(v::WrOpcode::kRdmaWrite, 4, sgeOf(host.mr, 0, kSize), dst, dstMr.rkey());
  EXPECT_TRUE(matchesPattern(device.held(dst, kSize), 64)) << "WRITE: host to device";
  EXPECT_EQ(soft::sameHostDeviceOpsDone(), ops + 3) << "each took the same-host path's device copies";
  EXPECT_EQ(device.bytesCopied() - copied, 3 * kSize) << "one copy each: nothing staged through a buffer";

  // Device memory to the peer's host memory: the peer's memory is mapped here only on soft_mapped
  // (where the device writes into the mapping); elsewhere the request is staged over the
  // connection, as before there was a same-host path.
  const bool mapped = providerPath().name == "soft_mapped";
  request(v::WrOpcode::kRdmaWrite, 5, sgeOf(srcMr, 0, kSize), remoteHost.data(), remoteHost.mr.rkey());
  EXPECT_TRUE(matchesPattern(bytesOf(remoteHost), 61)) << "WRITE: device to the peer's host memory";
  EXPECT_EQ(soft::sameHostDeviceOpsDone(), ops + 3 + (mapped ? 1 : 0));

  // A device that stopped answering: the request goes the ordinary way, and fails there as ever.
  device.failCopies(true);
  v::WorkCompletion wc;
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 6,
                              .sges = {sgeOf(srcMr, 0, 4096)},
                              .remoteAddr = reinterpret_cast<uintptr_t>(dst),
                              .rkey = dstMr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_NE(wc.status, v::WcStatus::kSuccess);
  device.failCopies(false);
  EXPECT_TRUE(matchesPattern(device.held(dst, kSize), 64)) << "nothing moved";
}

INSTANTIATE_TEST_SUITE_P(Providers, SameHostDevicePath, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

}  // namespace
}  // namespace ferry::test
