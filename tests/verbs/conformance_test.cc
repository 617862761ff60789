// The verbs conformance suite: what every ferry device must do, written once against the public
// verbs API and run over every provider path (tests/support/verbs_fixture.h). The expected
// behaviour is libibverbs' (docs: shared notes "verbs semantics"); rxe is the referee.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
namespace access = ferry::verbs::access;
namespace send_flags = ferry::verbs::send_flags;
using std::chrono::milliseconds;
using v::QpState;
using v::WcOpcode;
using v::WcStatus;
using v::WorkCompletion;
using v::WrOpcode;

class VerbsConformance : public VerbsTest {};

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// A fast-failing link for tests that wait for a transport timeout: 4.096 us * 2^12 = 16.8 ms per
// try, 3 tries.
constexpr LinkOptions kShortTimeout{.timeout = 12, .retries = 2};
// Upper bound for "the peer is gone" to surface as a completion.
constexpr milliseconds kPeerLossBound{5000};

std::span<uint8_t> writableBytes(const RegisteredBuffer& buffer, size_t offset, size_t length) {
  return {buffer.data() + offset, length};
}

uint64_t load64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);
  return value;
}
void store64(uint8_t* p, uint64_t value) { std::memcpy(p, &value, 8); }

::testing::AssertionResult succeeded(const WorkCompletion& wc, uint64_t wrId, WcOpcode opcode) {
  if (wc.status == WcStatus::kSuccess && wc.wrId == wrId && wc.opcode == opcode) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected wr_id=" << wrId << " SUCCESS " << v::wcOpcodeName(opcode) << ", got " << describe(wc);
}

::testing::AssertionResult failedWith(const WorkCompletion& wc, uint64_t wrId, WcStatus status) {
  if (wc.status == status && wc.wrId == wrId) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "expected wr_id=" << wrId << " " << v::wcStatusName(status) << ", got " << describe(wc);
}

// Waits for an async event of `type` on context, skipping others (which are listed on failure).
::testing::AssertionResult waitAsyncEvent(v::Context& context, v::AsyncEventType type, v::AsyncEvent* out,
                                          milliseconds timeout = kWaitTimeout) {
  const auto deadline = Clock::now() + timeout;
  std::string seen;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    Result<v::AsyncEvent> event = context.getAsyncEvent(static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (event.isOk()) {
      if (event->type == type) {
        *out = *event;
        return ::testing::AssertionSuccess();
      }
      seen += std::string(" ") + v::asyncEventName(event->type);
      continue;
    }
    if (event.status().code() != StatusCode::kTimedOut) {
      return ::testing::AssertionFailure() << "getAsyncEvent: " << event.status().toString();
    }
    if (Clock::now() >= deadline) {
      return ::testing::AssertionFailure()
             << "no " << v::asyncEventName(type) << " within " << timeout.count()
             << " ms; other events:" << (seen.empty() ? " none" : seen);
    }
  }
}

// Moves both QPs of pair to RESET and connects them again with fresh paths (new PSNs).
::testing::AssertionResult resetAndReconnect(ConnectedPair& pair, const LinkOptions& link = {},
                                             uint32_t accessA = kRemoteAccess,
                                             uint32_t accessB = kRemoteAccess) {
  v::QpAttr attr;
  attr.state = QpState::kReset;
  for (Side* side : {&pair.a, &pair.b}) {
    Status status = side->qp.modify(attr, v::qp_attr_mask::kState);
    if (!status.isOk()) return ::testing::AssertionFailure() << "modify to RESET: " << status.toString();
    Result<v::QpAttr> now = side->qp.query();
    if (!now.isOk() || now->state != QpState::kReset) {
      return ::testing::AssertionFailure() << "QP not in RESET after modify";
    }
  }
  Status status = connectQps(*pair.a.context, pair.a.qp, *pair.b.context, pair.b.qp, link, accessA, accessB,
                             &pair.a.path, &pair.b.path);
  if (!status.isOk()) return ::testing::AssertionFailure() << "reconnect: " << status.toString();
  return ::testing::AssertionSuccess();
}

// What dst looks like after the bytes named by srcSges (in order) are scattered over dstSges.
std::vector<uint8_t> scatterImage(const uint8_t* srcBase,
                                  const std::vector<std::pair<size_t, size_t>>& srcSges,
                                  std::span<const uint8_t> dstBefore,
                                  const std::vector<std::pair<size_t, size_t>>& dstSges) {
  std::vector<uint8_t> stream;
  for (auto [offset, length] : srcSges)
    stream.insert(stream.end(), srcBase + offset, srcBase + offset + length);
  std::vector<uint8_t> image(dstBefore.begin(), dstBefore.end());
  size_t at = 0;
  for (auto [offset, length] : dstSges) {
    const size_t n = std::min(length, stream.size() - at);
    std::copy_n(stream.begin() + static_cast<std::ptrdiff_t>(at), n,
                image.begin() + static_cast<std::ptrdiff_t>(offset));
    at += n;
  }
  return image;
}

std::vector<v::Sge> sgesOf(const RegisteredBuffer& buffer,
                           const std::vector<std::pair<size_t, size_t>>& ranges) {
  std::vector<v::Sge> sges;
  for (auto [offset, length] : ranges) sges.push_back(sgeOf(buffer, offset, length));
  return sges;
}

// ================================ devices ================================

TEST_P(VerbsConformance, DeviceIsListedAndOpens) {
  ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
  std::set<std::string> names;
  const v::DeviceInfo* found = nullptr;
  for (const v::DeviceInfo& device : devices) {
    EXPECT_TRUE(names.insert(device.name).second) << "device listed twice: " << device.name;
    if (device.name == providerPath().device) found = &device;
  }
  ASSERT_NE(found, nullptr);
  EXPECT_FALSE(found->provider.empty());
  EXPECT_FALSE(found->transport.empty());

  bool providerListed = false;
  for (const ProviderInfo& provider : listProviders()) {
    if (provider.name != found->provider) continue;
    providerListed = true;
    EXPECT_TRUE(provider.available) << provider.reason;
    EXPECT_TRUE(provider.reason.empty()) << provider.reason;
  }
  EXPECT_TRUE(providerListed) << "provider " << found->provider << " missing from listProviders()";

  ASSERT_OK_AND_ASSIGN(v::Context context, openDevice(providerPath().device));
  EXPECT_EQ(context.info().name, providerPath().device);
  EXPECT_EQ(context.info().provider, found->provider);
  EXPECT_EQ(context.info().transport, found->transport);
}

TEST_P(VerbsConformance, FerryDevicesFiltersTheList) {
  const std::string device = providerPath().device;
  ScopedEnv env;
  auto listed = [](std::vector<v::DeviceInfo> devices, const std::string& name) {
    return std::any_of(devices.begin(), devices.end(),
                       [&](const v::DeviceInfo& d) { return d.name == name; });
  };

  env.set("FERRY_DEVICES", device);
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0].name, device);
    EXPECT_OK(openDevice(device));
  }
  env.set("FERRY_DEVICES", "ferry_no_such_device," + device);
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_EQ(devices.size(), 1u);
    EXPECT_TRUE(listed(devices, device));
  }
  env.set("FERRY_DEVICES", "ferry_no_such_device");
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_TRUE(devices.empty()) << devices.size() << " devices visible, first " << devices[0].name;
    EXPECT_TRUE(hasCode(openDevice(device).status(), StatusCode::kNotFound))
        << "a hidden device must not open";
  }
  env.set("FERRY_DEVICES", "");
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_TRUE(listed(devices, device)) << "an empty FERRY_DEVICES shows every device";
  }
}

TEST_P(VerbsConformance, OpenUnknownDeviceIsNotFound) {
  EXPECT_TRUE(hasCode(openDevice("ferry_no_such_device").status(), StatusCode::kNotFound));
  EXPECT_TRUE(hasCode(openDevice("").status(), StatusCode::kNotFound));
}

TEST_P(VerbsConformance, QueryDevicePortAndGid) {
  ASSERT_OK_AND_ASSIGN(v::Context context, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, context.queryDevice());
  EXPECT_GE(device.physPortCnt, 1);
  EXPECT_GT(device.maxQp, 0);
  EXPECT_GE(device.maxQpWr, 16);
  EXPECT_GE(device.maxSge, 1);
  EXPECT_GE(device.maxSgeRd, 1);
  EXPECT_GT(device.maxCq, 0);
  EXPECT_GE(device.maxCqe, 16);
  EXPECT_GT(device.maxMr, 0);
  EXPECT_GT(device.maxPd, 0);
  EXPECT_GE(device.maxMrSize, 64 * kMiB);
  EXPECT_GE(device.maxQpRdAtom, 1);
  EXPECT_GE(device.maxQpInitRdAtom, 1);

  ASSERT_OK_AND_ASSIGN(v::PortAttr port, context.queryPort(1));
  EXPECT_EQ(port.state, v::PortState::kActive);
  EXPECT_GE(port.gidTblLen, 1);
  EXPECT_LE(static_cast<int>(port.activeMtu), static_cast<int>(port.maxMtu));
  EXPECT_GE(port.maxMsgSz, 1 * kMiB);  // rxe: 8 MiB; the software devices: 2 GiB
  EXPECT_TRUE(hasCode(context.queryPort(0).status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(hasCode(context.queryPort(device.physPortCnt + 1).status(), StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(v::Gid gid0, context.queryGid(1, 0));
  EXPECT_FALSE(gid0.isZero());
  v::Gid parsed;
  ASSERT_TRUE(v::Gid::parse(gid0.toString(), &parsed)) << gid0.toString();
  EXPECT_EQ(parsed, gid0);
  EXPECT_TRUE(hasCode(context.queryGid(1, port.gidTblLen).status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(hasCode(context.queryGid(1, -1).status(), StatusCode::kInvalidArgument));

  // What the device says it is (DeviceInfo), which the layers above ask instead of its provider.
  const v::DeviceInfo& info = context.info();
  if (info.ports != 0) EXPECT_EQ(info.ports, device.physPortCnt);
  if (info.addressedByContext) {  // one GID per context: its address, IPv4-mapped
    EXPECT_EQ(port.gidTblLen, 1);
    in_addr mapped{};
    ASSERT_EQ(inet_pton(AF_INET, info.address.c_str(), &mapped), 1) << info.address;
    EXPECT_EQ(std::memcmp(gid0.raw.data() + 12, &mapped, 4), 0) << gid0.toString();
  }
  EXPECT_LE(device.localCaAckDelay, 31);  // an IBA timer code

  // A device bound to an IPv4 address carries it as an IPv4-mapped GID.
  in_addr address{};
  if (inet_pton(AF_INET, context.info().address.c_str(), &address) == 1) {
    bool mapped = false;
    for (int i = 0; i < std::min(port.gidTblLen, 16) && !mapped; ++i) {
      Result<v::Gid> gid = context.queryGid(1, i);
      if (!gid.isOk()) continue;
      const auto& raw = gid->raw;
      mapped = raw[10] == 0xff && raw[11] == 0xff && std::memcmp(&raw[12], &address, 4) == 0;
    }
    EXPECT_TRUE(mapped) << "no GID of port 1 holds " << context.info().address;
  }
}

// ============================ object creation ============================

TEST_P(VerbsConformance, CreateCqChecksSizeAndResizes) {
  ASSERT_OK_AND_ASSIGN(v::Context context, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, context.queryDevice());
  EXPECT_TRUE(hasCode(context.createCq({.cqe = 0}).status(), StatusCode::kInvalidArgument, EINVAL));
  EXPECT_TRUE(hasCode(context.createCq({.cqe = -1}).status(), StatusCode::kInvalidArgument, EINVAL));
  if (device.maxCqe < std::numeric_limits<int>::max()) {
    EXPECT_TRUE(
        hasCode(context.createCq({.cqe = device.maxCqe + 1}).status(), StatusCode::kInvalidArgument, EINVAL));
  }
  ASSERT_OK_AND_ASSIGN(v::CompletionQueue cq, context.createCq({.cqe = 100}));
  EXPECT_GE(cq.cqe(), 100);
  WorkCompletion wc;
  ASSERT_OK_AND_ASSIGN(int polled, cq.poll(std::span<WorkCompletion>(&wc, 1)));
  EXPECT_EQ(polled, 0);
  ASSERT_OK(cq.resize(300));
  EXPECT_GE(cq.cqe(), 300);
  if (device.maxCqe < std::numeric_limits<int>::max()) {
    EXPECT_TRUE(hasCode(cq.resize(device.maxCqe + 1), StatusCode::kInvalidArgument, EINVAL));
  }
}

TEST_P(VerbsConformance, ResizingCqDuringTrafficKeepsEveryCompletion) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.cqe = 16}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 1));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 2));
  for (uint64_t id = 1; id <= 8; ++id) {
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                .wrId = id,
                                .sges = {sgeOf(src, 0, 512)},
                                .remoteAddr = dst.address(),
                                .rkey = dst.mr.rkey()}));
  }
  ASSERT_OK(pair->a.sendCq.resize(64));
  EXPECT_GE(pair->a.sendCq.cqe(), 64);
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 8, &completions));
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(succeeded(completions[i], i + 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(20)));
}

TEST_P(VerbsConformance, RegisterMemoryChecksAccessFlags) {
  ASSERT_OK_AND_ASSIGN(v::Context context, openContext());
  ASSERT_OK_AND_ASSIGN(v::ProtectionDomain pd, context.allocPd());
  TestBuffer memory(8192);
  for (uint32_t refused :
       {access::kRemoteWrite, access::kRemoteAtomic, access::kRemoteWrite | access::kRemoteRead,
        access::kRemoteAtomic | access::kRemoteRead}) {
    EXPECT_TRUE(hasCode(pd.registerMemory(memory.data(), 8192, refused).status(),
                        StatusCode::kInvalidArgument, EINVAL))
        << "access " << refused << " lacks LOCAL_WRITE";
  }
  for (uint32_t allowed : {0u, access::kLocalWrite, access::kRemoteRead,
                           access::kLocalWrite | access::kRemoteWrite, access::kAll}) {
    EXPECT_OK(pd.registerMemory(memory.data(), 8192, allowed)) << "access " << allowed;
  }
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion mr, pd.registerMemory(memory.data(), 8192, access::kAll));
  EXPECT_EQ(mr.addr(), memory.data());
  EXPECT_EQ(mr.length(), 8192u);
  EXPECT_EQ(mr.access(), access::kAll);
  const v::Sge part = mr.sge(16, 100);
  EXPECT_EQ(part.addr, memory.address(16));
  EXPECT_EQ(part.length, 100u);
  EXPECT_EQ(part.lkey, mr.lkey());
  EXPECT_EQ(mr.sge().length, 8192u);
  EXPECT_EQ(mr.sge(100).length, 8092u);
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion other, pd.registerMemory(memory.data(), 4096, access::kAll));
  EXPECT_NE(other.lkey(), mr.lkey());
  EXPECT_NE(other.rkey(), mr.rkey());
}

// ProtectionDomain::allocMr: registered memory ferry allocates, zero-filled and page-aligned,
// checked like any registration, and moving WRITE and READ between two QPs on every provider.
TEST_P(VerbsConformance, AllocMrGivesRegisteredMemoryThatMovesBytes) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  EXPECT_TRUE(hasCode(pair->a.pd.allocMr(0, access::kLocalWrite).status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(
      hasCode(pair->a.pd.allocMr(4096, access::kRemoteWrite).status(), StatusCode::kInvalidArgument, EINVAL))
      << "REMOTE_WRITE without LOCAL_WRITE, as for any registration";
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion src, pair->a.pd.allocMr(10000, access::kLocalWrite));
  ASSERT_OK_AND_ASSIGN(v::MemoryRegion dst, pair->b.pd.allocMr(10000, access::kAll));
  EXPECT_EQ(dst.length(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dst.addr()) % 4096, 0u);
  std::span<uint8_t> srcBytes(static_cast<uint8_t*>(src.addr()), src.length());
  std::span<uint8_t> dstBytes(static_cast<uint8_t*>(dst.addr()), dst.length());
  EXPECT_TRUE(std::all_of(dstBytes.begin(), dstBytes.end(), [](uint8_t b) { return b == 0; }));
  fillPattern(srcBytes, 61);
  const auto dstAddr = reinterpret_cast<uintptr_t>(dst.addr());
  for (uint64_t i = 0; i < 3; ++i) {  // the first may go before the same-host path is up
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                .wrId = i,
                                .sges = {src.sge(i * 3000, 3000)},
                                .remoteAddr = dstAddr + i * 3000,
                                .rkey = dst.rkey()}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  }
  EXPECT_TRUE(std::equal(srcBytes.begin(), srcBytes.begin() + 9000, dstBytes.begin()));
  fillPattern(dstBytes, 62);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaRead,
                              .wrId = 9,
                              .sges = {src.sge(0, 10000)},
                              .remoteAddr = dstAddr,
                              .rkey = dst.rkey()}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(std::equal(srcBytes.begin(), srcBytes.end(), dstBytes.begin()));
}

// As ibv_reg_mr refuses them: memory that is not mapped, memory mapped without the access asked
// for (read-only with a write flag, PROT_NONE), and a range that wraps past 2^64. Nothing registers,
// nothing faults, and the same pages register once they are mapped as asked.
TEST_P(VerbsConformance, RegisterMemoryRefusesUnmappedAndWrongAccess) {
  ASSERT_OK_AND_ASSIGN(v::Context context, openContext());
  ASSERT_OK_AND_ASSIGN(v::ProtectionDomain pd, context.allocPd());
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* area = ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(area);
  ASSERT_EQ(::munmap(bytes + 2 * page, page), 0);  // a hole: page 2
  auto refused = [&](void* addr, size_t length, uint32_t flags, const char* why) {
    Result<v::MemoryRegion> mr = pd.registerMemory(addr, length, flags);
    EXPECT_TRUE(hasCode(mr.status(), StatusCode::kInvalidArgument, EINVAL))
        << why << ": " << mr.status().toString();
  };
  refused(bytes + page, 2 * page, access::kLocalWrite, "a range over an unmapped page");
  refused(bytes + 2 * page + 8, 16, 0, "a range inside an unmapped page");
  ASSERT_EQ(::mprotect(bytes, page, PROT_READ), 0);
  refused(bytes, page, access::kLocalWrite, "read-only memory with LOCAL_WRITE");
  refused(bytes, page, access::kLocalWrite | access::kRemoteWrite, "read-only memory with REMOTE_WRITE");
  EXPECT_OK(pd.registerMemory(bytes, page, access::kRemoteRead)) << "read-only memory, read access";
  ASSERT_EQ(::mprotect(bytes + page, page, PROT_NONE), 0);
  refused(bytes + page, page, access::kRemoteRead, "PROT_NONE memory");
  refused(reinterpret_cast<void*>(~uintptr_t{0} - 100), 4096, 0, "a range that wraps past 2^64");
  ASSERT_EQ(::mprotect(bytes, 2 * page, PROT_READ | PROT_WRITE), 0);
  EXPECT_OK(pd.registerMemory(bytes, 2 * page, access::kAll)) << "the same pages, now writable";
  EXPECT_EQ(bytes[0], 0) << "registration changed no byte";
  ASSERT_EQ(::munmap(bytes, 2 * page), 0);
  ASSERT_EQ(::munmap(bytes + 3 * page, page), 0);
}

TEST_P(VerbsConformance, CreateQpChecksCapsAndCqs) {
  Side side;
  ASSERT_OK(openSide(side, nullptr, 64));
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, side.context->queryDevice());
  const v::QpCap cap{.maxSendWr = 32, .maxRecvWr = 16, .maxSendSge = 2, .maxRecvSge = 3, .maxInlineData = 0};
  auto init = [&](v::QpCap c) {
    return v::QpInit{.type = v::QpType::kRc, .sendCq = &side.sendCq, .recvCq = &side.recvCq, .cap = c};
  };
  v::QpCap tooDeep = cap;
  tooDeep.maxSendWr = static_cast<uint32_t>(device.maxQpWr) + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooDeep)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpCap tooWide = cap;
  tooWide.maxSendSge = static_cast<uint32_t>(device.maxSge) + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooWide)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpCap tooMuchInline = cap;
  tooMuchInline.maxInlineData = device.maxInlineData + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooMuchInline)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpInit noCq = init(cap);
  noCq.sendCq = nullptr;
  EXPECT_TRUE(hasCode(side.pd.createQp(noCq).status(), StatusCode::kInvalidArgument, EINVAL));

  ASSERT_OK_AND_ASSIGN(v::Context otherContext, openContext());
  ASSERT_OK_AND_ASSIGN(v::CompletionQueue foreignCq, otherContext.createCq({.cqe = 16}));
  v::QpInit foreign = init(cap);
  foreign.recvCq = &foreignCq;
  EXPECT_TRUE(hasCode(side.pd.createQp(foreign).status(), StatusCode::kInvalidArgument, EINVAL))
      << "a CQ of another context";

  ASSERT_OK_AND_ASSIGN(v::QueuePair qp, side.pd.createQp(init(cap)));
  ASSERT_OK_AND_ASSIGN(v::QueuePair second, side.pd.createQp(init(cap)));
  EXPECT_EQ(qp.type(), v::QpType::kRc);
  EXPECT_NE(qp.qpNum(), 0u);
  EXPECT_LT(qp.qpNum(), 1u << 24);
  EXPECT_NE(qp.qpNum(), second.qpNum());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attr, qp.query());
  EXPECT_EQ(attr.state, QpState::kReset);
  EXPECT_GE(attr.cap.maxSendWr, cap.maxSendWr);
  EXPECT_GE(attr.cap.maxRecvWr, cap.maxRecvWr);
  EXPECT_GE(attr.cap.maxSendSge, cap.maxSendSge);
  EXPECT_GE(attr.cap.maxRecvSge, cap.maxRecvSge);
}

// ============================ QP state machine ============================

TEST_P(VerbsConformance, QpStateMachineFollowsLibibverbs) {
  namespace m = v::qp_attr_mask;
  Side a, b;
  ASSERT_OK(openSide(a, nullptr, 64));
  ASSERT_OK(openSide(b, nullptr, 64));
  ASSERT_OK(createQp(a, {}));
  ASSERT_OK(createQp(b, {}));
  ASSERT_OK_AND_ASSIGN(v::Path localA, makeLocalPath(*a.context, a.qp));
  ASSERT_OK_AND_ASSIGN(v::Path localB, makeLocalPath(*b.context, b.qp));
  ASSERT_OK_AND_ASSIGN(v::Path pathA, pathTowardsPeer(*a.context, a.qp, localA, localB, {}));
  ASSERT_OK_AND_ASSIGN(v::Path pathB, pathTowardsPeer(*b.context, b.qp, localB, localA, {}));
  auto refused = [](const Status& status) { return hasCode(status, StatusCode::kInvalidArgument, EINVAL); };
  auto stateOf = [](const v::QueuePair& qp) {
    Result<v::QpAttr> attr = qp.query();
    return attr.isOk() ? attr->state : QpState::kSqe;
  };
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kLocalWrite, 3));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(b.pd, 4096, access::kAll, 4));
  const SendOp write{.opcode = WrOpcode::kRdmaWrite,
                     .wrId = 1,
                     .sges = {sgeOf(src, 0, 64)},
                     .remoteAddr = dst.address(),
                     .rkey = dst.mr.rkey()};

  // RESET: only INIT (and RESET, ERR) is reachable; posting is refused.
  v::QpAttr attr;
  attr.state = QpState::kRtr;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RESET -> RTR";
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RESET -> RTS";
  attr = {};
  attr.state = QpState::kInit;
  attr.pkeyIndex = 0;
  attr.portNum = 1;
  attr.qpAccessFlags = kRemoteAccess;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort)))
      << "INIT without ACCESS_FLAGS";
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kAccessFlags))) << "INIT without PORT";
  attr.destQpNum = b.qp.qpNum();
  EXPECT_TRUE(
      refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags | m::kDestQpn)))
      << "DEST_QPN is not an attribute of RESET -> INIT";
  EXPECT_EQ(stateOf(a.qp), QpState::kReset) << "a refused modify changes nothing";
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in RESET";
  EXPECT_TRUE(refused(postReceive(a.qp, 1, {sgeOf(src, 0, 64)}))) << "postRecv in RESET";

  ASSERT_OK(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
  ASSERT_OK_AND_ASSIGN(v::QpAttr init, a.qp.query());
  EXPECT_EQ(init.state, QpState::kInit);
  EXPECT_EQ(init.qpAccessFlags, kRemoteAccess);
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in INIT";
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(a.pd, 4096, access::kLocalWrite, 5));
  EXPECT_OK(postReceive(a.qp, 77, {sgeOf(inbox, 0, 256)})) << "postRecv in INIT is allowed";

  // INIT -> RTR needs the address vector, MTU, destination QPN, RQ PSN, responder depth, RNR timer.
  attr = {};
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "INIT -> RTS";
  attr = {};
  attr.state = QpState::kRtr;
  attr.ahAttr = pathA.ahAttr();
  attr.pathMtu = pathA.mtu;
  attr.destQpNum = pathA.dqpn;
  attr.rqPsn = pathA.dqpsn;
  attr.maxDestRdAtomic = pathA.drdatomic;
  attr.minRnrTimer = pathA.minRnrTimer;
  attr.sqPsn = pathA.sqpsn;
  const uint32_t rtrMask =
      m::kState | m::kAv | m::kPathMtu | m::kDestQpn | m::kRqPsn | m::kMaxDestRdAtomic | m::kMinRnrTimer;
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kAv))) << "RTR without AV";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kDestQpn))) << "RTR without DEST_QPN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kRqPsn))) << "RTR without RQ_PSN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask | m::kSqPsn))) << "SQ_PSN is not an attribute of INIT -> RTR";
  EXPECT_EQ(stateOf(a.qp), QpState::kInit);
  ASSERT_OK(a.qp.modify(attr, rtrMask));
  EXPECT_EQ(stateOf(a.qp), QpState::kRtr);
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in RTR";

  // RTR -> RTS needs SQ PSN, initiator depth, retry counts and the timeout.
  attr = {};
  attr.state = QpState::kRts;
  attr.sqPsn = pathA.sqpsn;
  attr.maxRdAtomic = pathA.srdatomic;
  attr.retryCnt = pathA.retries;
  attr.rnrRetry = pathA.rnrRetries;
  attr.timeout = pathA.packetLifeTime;
  const uint32_t rtsMask =
      m::kState | m::kSqPsn | m::kMaxQpRdAtomic | m::kRetryCnt | m::kRnrRetry | m::kTimeout;
  EXPECT_TRUE(refused(a.qp.modify(attr, rtsMask & ~m::kSqPsn))) << "RTS without SQ_PSN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtsMask | m::kDestQpn)))
      << "DEST_QPN is not an attribute of RTR -> RTS";
  EXPECT_EQ(stateOf(a.qp), QpState::kRtr);
  ASSERT_OK(a.qp.modify(attr, rtsMask));
  ASSERT_OK_AND_ASSIGN(v::QpAttr rts, a.qp.query());
  EXPECT_EQ(rts.state, QpState::kRts);
  EXPECT_EQ(rts.destQpNum, b.qp.qpNum());

  // The hand-built side talks to a side built by establish(), both ways.
  ASSERT_OK(b.qp.establish(pathB, kRemoteAccess));
  ASSERT_OK(post(a.qp, write));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 64), bytesOf(src, 0, 64)));
  ASSERT_OK(post(b.qp, {.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(dst, 0, 100)}}));
  ASSERT_TRUE(pollOne(a.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 77, WcOpcode::kRecv)) << "the receive posted in INIT";
  EXPECT_EQ(wc.byteLen, 100u);

  // RTS -> RTR is illegal; any state -> ERR and ERR -> RESET -> INIT are legal.
  attr = {};
  attr.state = QpState::kRtr;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RTS -> RTR";
  attr.state = QpState::kErr;
  ASSERT_OK(a.qp.modify(attr, m::kState));
  EXPECT_EQ(stateOf(a.qp), QpState::kErr);
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "ERR -> RTS";
  attr.state = QpState::kReset;
  ASSERT_OK(a.qp.modify(attr, m::kState));
  EXPECT_EQ(stateOf(a.qp), QpState::kReset);
  attr = {};
  attr.state = QpState::kInit;
  attr.portNum = 1;
  attr.qpAccessFlags = 0;
  EXPECT_OK(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
  EXPECT_EQ(stateOf(a.qp), QpState::kInit);
}

// ============================ posting refusals ============================

TEST_P(VerbsConformance, PostRefusesTooManySgesAndOversizedInline) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrA, pair->a.qp.query());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrB, pair->b.qp.query());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * kKiB, access::kLocalWrite, 6));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 7));

  std::vector<v::Sge> tooMany(attrA.cap.maxSendSge + 1, sgeOf(src, 0, 8));
  size_t bad = 99;
  EXPECT_TRUE(hasCode(postAll(pair->a.qp, {{.opcode = WrOpcode::kSend, .wrId = 1, .sges = tooMany}}, &bad),
                      StatusCode::kInvalidArgument, EINVAL));
  EXPECT_EQ(bad, 0u);
  std::vector<v::Sge> tooManyRecv(attrB.cap.maxRecvSge + 1, sgeOf(dst, 0, 8));
  EXPECT_TRUE(hasCode(postReceive(pair->b.qp, 1, tooManyRecv), StatusCode::kInvalidArgument, EINVAL));

  std::vector<uint8_t> inlineData(attrA.cap.maxInlineData + 1, 0x5a);
  const v::Sge inlineSge{.addr = reinterpret_cast<uint64_t>(inlineData.data()),
                         .length = static_cast<uint32_t>(inlineData.size()),
                         .lkey = 0};
  EXPECT_TRUE(hasCode(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                        .wrId = 2,
                                        .sges = {inlineSge},
                                        .flags = send_flags::kSignaled | send_flags::kInline,
                                        .remoteAddr = dst.address(),
                                        .rkey = dst.mr.rkey()}),
                      StatusCode::kInvalidArgument, EINVAL))
      << "inline data of " << inlineData.size() << " bytes, cap " << attrA.cap.maxInlineData;

  // A refused request in a list: the ones before it stay posted, the ones after are not posted.
  const SendOp good{.opcode = WrOpcode::kRdmaWrite,
                    .wrId = 10,
                    .sges = {sgeOf(src, 0, 256)},
                    .remoteAddr = dst.address(),
                    .rkey = dst.mr.rkey()};
  SendOp refused = good;
  refused.wrId = 11;
  refused.sges = tooMany;
  SendOp after = good;
  after.wrId = 12;
  bad = 99;
  EXPECT_TRUE(
      hasCode(postAll(pair->a.qp, {good, refused, after}, &bad), StatusCode::kInvalidArgument, EINVAL));
  EXPECT_EQ(bad, 1u);
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 10, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(50)));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kRts, milliseconds(0))) << "a refusal is not a QP error";
}

TEST_P(VerbsConformance, FullQueuesRefuseWithEnomemAndKeepEarlierRequests) {
  const QpOptions small{.cap = {.maxSendWr = 16, .maxRecvWr = 16, .maxSendSge = 1, .maxRecvSge = 1}};
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = small, .qpB = small, .link = {.minRnrTimer = 10}}));
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrA, pair->a.qp.query());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrB, pair->b.qp.query());
  const uint32_t recvDepth = attrB.cap.maxRecvWr;
  const uint32_t sendDepth = attrB.cap.maxSendWr;
  ASSERT_GE(attrA.cap.maxRecvWr, sendDepth);
  ASSERT_OK_AND_ASSIGN(auto bufA, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 8));
  ASSERT_OK_AND_ASSIGN(auto bufB, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 9));

  // Receive queue of B: recvDepth + 1 receives in one list.
  std::vector<std::vector<v::Sge>> recvSges;
  std::vector<v::RecvWr> recvs;
  for (uint32_t i = 0; i <= recvDepth; ++i) recvSges.push_back({sgeOf(bufB, i * 64, 64)});
  for (uint32_t i = 0; i <= recvDepth; ++i) recvs.push_back({.wrId = 100 + i, .sgList = recvSges[i]});
  size_t bad = 0;
  EXPECT_TRUE(hasCode(pair->b.qp.postRecv(recvs, &bad), StatusCode::kResourceExhausted, ENOMEM));
  EXPECT_EQ(bad, recvDepth);

  // Send queue of B: A has no receive posted, so every SEND waits (RNR) and holds its slot.
  std::vector<SendOp> sends;
  for (uint32_t i = 0; i <= sendDepth; ++i) {
    sends.push_back(
        {.opcode = WrOpcode::kSend, .wrId = 200 + i, .sges = {sgeOf(bufB, 32 * kKiB + i * 8, 8)}});
  }
  bad = 0;
  EXPECT_TRUE(hasCode(postAll(pair->b.qp, sends, &bad), StatusCode::kResourceExhausted, ENOMEM));
  EXPECT_EQ(bad, sendDepth);

  // Everything accepted before the refusal is carried out, in order.
  for (uint32_t i = 0; i < sendDepth; ++i)
    ASSERT_OK(postReceive(pair->a.qp, 300 + i, {sgeOf(bufA, i * 8, 8)}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->b.sendCq, sendDepth, &completions));
  for (uint32_t i = 0; i < sendDepth; ++i) EXPECT_TRUE(succeeded(completions[i], 200 + i, WcOpcode::kSend));
  EXPECT_TRUE(bytesEqual(bytesOf(bufA, 0, sendDepth * 8), bytesOf(bufB, 32 * kKiB, sendDepth * 8)));

  for (uint32_t i = 0; i < recvDepth; ++i) {
    ASSERT_OK(
        post(pair->a.qp,
             {.opcode = WrOpcode::kSend, .wrId = 400 + i, .sges = {sgeOf(bufA, 16 * kKiB + i * 64, 64)}}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    ASSERT_TRUE(succeeded(wc, 400 + i, WcOpcode::kSend));
  }
  completions.clear();
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, recvDepth, &completions));
  for (uint32_t i = 0; i < recvDepth; ++i) EXPECT_TRUE(succeeded(completions[i], 100 + i, WcOpcode::kRecv));
  EXPECT_TRUE(bytesEqual(bytesOf(bufB, 0, recvDepth * 64), bytesOf(bufA, 16 * kKiB, recvDepth * 64)));
}

// ============================ data movement ============================

constexpr size_t kSizes[] = {0, 1, 7, 4096, 65537, 1 * kMiB, 64 * kMiB};

// The largest message the device takes (PortAttr::maxMsgSz); sizes above it are not tried.
size_t maxMessage(const v::Context& context) {
  auto port = context.queryPort(1);
  return port.isOk() ? port->maxMsgSz : 0;
}
constexpr size_t kLargest = 64 * kMiB;
// Odd offsets on both sides, and guard bytes after the destination that must stay untouched.
constexpr size_t kSrcOffset = 3;
constexpr size_t kDstOffset = 5;
constexpr size_t kGuard = 61;

// The `size` bytes at kDstOffset of dst equal source, and the guard bytes on both sides still hold
// the pattern `seed` that filled them before the transfer.
::testing::AssertionResult placedWithGuards(const RegisteredBuffer& dst, std::span<const uint8_t> source,
                                            size_t size, uint64_t seed) {
  if (auto r = bytesEqual(bytesOf(dst, kDstOffset, size), source); !r) return r << " (the transferred bytes)";
  if (auto r = matchesPattern(bytesOf(dst, 0, kDstOffset), seed, 0); !r)
    return r << " (bytes before the destination)";
  if (auto r = matchesPattern(bytesOf(dst, kDstOffset + size, kGuard), seed, kDstOffset + size); !r) {
    return r << " (bytes past the destination)";
  }
  return ::testing::AssertionSuccess();
}

TEST_P(VerbsConformance, WriteIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kLargest + 64, access::kLocalWrite, 11));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kLargest + 128, access::kAll, 12));
  uint64_t wrId = 0;
  for (size_t size : kSizes) {
    if (size > maxMessage(*pair->a.context)) continue;  // above the device's max_msg_sz
    SCOPED_TRACE("size " + std::to_string(size));
    const uint64_t seed = 1000 + size;
    fillPattern(writableBytes(dst, 0, kDstOffset + size + kGuard), seed);
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                .wrId = ++wrId,
                                .sges = {sgeOf(src, kSrcOffset, size)},
                                .remoteAddr = dst.address(kDstOffset),
                                .rkey = dst.mr.rkey()}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(succeeded(wc, wrId, WcOpcode::kRdmaWrite));
    EXPECT_TRUE(placedWithGuards(dst, bytesOf(src, kSrcOffset, size), size, seed));
  }
  EXPECT_TRUE(noCompletionFor(pair->b.recvCq, milliseconds(1))) << "a plain WRITE consumes no receive";
}

// UC queue pairs: WRITE, WRITE_WITH_IMM and SEND arrive byte-exact; READ and atomics are refused
// at post; there are no acknowledgements and no retries, so a WRITE the target refuses (a bad
// rkey) and a SEND that finds no receive posted still complete at the requester, are dropped at
// the target without a word, and the connection goes on.
TEST_P(VerbsConformance, UcCarriesWritesAndSendsAndDropsWhatTheTargetRefuses) {
  PairOptions options;
  options.qpA.type = options.qpB.type = v::QpType::kUc;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair(options));
  constexpr size_t kSize = 64 * 1024;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, access::kLocalWrite, 41));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 2 * kSize, access::kAll, 42));
  WorkCompletion wc;
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, kSize)},
                              .remoteAddr = dst.address(0),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  // The requester's completion says the WRITE left, not that it landed: poll the target.
  auto landed = [&](size_t offset, size_t length, uint64_t seed, uint64_t position) {
    for (auto until = Clock::now() + kWaitTimeout; Clock::now() < until;) {
      if (firstPatternMismatch(bytesOf(dst, offset, length), seed, position) == length) return true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return false;
  };
  EXPECT_TRUE(landed(0, kSize, 41, 0)) << "the WRITE arrived byte-exact";
  // WRITE_WITH_IMM and SEND consume receives, as on RC.
  ASSERT_OK(postReceive(pair->b.qp, 10, {sgeOf(dst, kSize, kSize)}));
  ASSERT_OK(postReceive(pair->b.qp, 11, {sgeOf(dst, kSize, kSize)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWriteWithImm,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = dst.address(0),
                              .rkey = dst.mr.rkey(),
                              .imm = 0x5151}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 100, 1000)}}));
  std::vector<WorkCompletion> got;
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &got));
  EXPECT_EQ(got[0].wrId, 10u);
  EXPECT_EQ(got[0].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(got[0].immData, 0x5151u);
  EXPECT_EQ(got[1].wrId, 11u);
  EXPECT_EQ(got[1].opcode, WcOpcode::kRecv);
  EXPECT_EQ(got[1].byteLen, 1000u);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, kSize, 1000), 41, 100));
  std::vector<WorkCompletion> sent;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(succeeded(sent[0], 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(sent[1], 3, WcOpcode::kSend));
  // No READ, no atomics.
  EXPECT_TRUE(hasCode(post(pair->a.qp, {.opcode = WrOpcode::kRdmaRead,
                                        .wrId = 4,
                                        .sges = {sgeOf(src, 0, 8)},
                                        .remoteAddr = dst.address(0),
                                        .rkey = dst.mr.rkey()}),
                      StatusCode::kInvalidArgument, EINVAL));
  EXPECT_TRUE(hasCode(post(pair->a.qp, {.opcode = WrOpcode::kAtomicFetchAndAdd,
                                        .wrId = 5,
                                        .sges = {sgeOf(src, 0, 8)},
                                        .remoteAddr = dst.address(0),
                                        .rkey = dst.mr.rkey(),
                                        .compareAdd = 1}),
                      StatusCode::kInvalidArgument, EINVAL));
  // A WRITE with a bad rkey and a SEND that finds no receive: both complete here, neither changes
  // the target, and the QPs stay RTS.
  fillPattern(writableBytes(dst, 0, 2 * kSize), 43);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 6,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = dst.address(0),
                              .rkey = corruptKey(dst.mr.rkey())}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 7, .sges = {sgeOf(src, 0, 64)}}));
  sent.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(succeeded(sent[0], 6, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(sent[1], 7, WcOpcode::kSend));
  EXPECT_TRUE(noCompletionFor(pair->b.recvCq, milliseconds(50)));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 2 * kSize), 43)) << "nothing refused was placed";
  EXPECT_TRUE(reachesState(pair->a.qp, v::QpState::kRts));
  EXPECT_TRUE(reachesState(pair->b.qp, v::QpState::kRts));
  // And the next message arrives.
  ASSERT_OK(postReceive(pair->b.qp, 12, {sgeOf(dst, kSize, kSize)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 8, .sges = {sgeOf(src, 0, 512)}}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.wrId, 12u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_EQ(wc.byteLen, 512u);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, kSize, 512), 41, 0));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 8, WcOpcode::kSend));
  // UC's transitions take no READ/atomic resources, RNR timer, timeout or retry counts.
  v::QpAttr attr;
  attr.state = v::QpState::kRts;
  attr.timeout = 14;
  EXPECT_TRUE(hasCode(pair->a.qp.modify(attr, v::qp_attr_mask::kState | v::qp_attr_mask::kTimeout),
                      StatusCode::kInvalidArgument, EINVAL));
}

TEST_P(VerbsConformance, ReadIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kLargest + 64, access::kAll, 13));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kLargest + 128, access::kLocalWrite, 14));
  uint64_t wrId = 0;
  for (size_t size : kSizes) {
    if (size > maxMessage(*pair->a.context)) continue;  // above the device's max_msg_sz
    SCOPED_TRACE("size " + std::to_string(size));
    const uint64_t seed = 2000 + size;
    fillPattern(writableBytes(local, 0, kDstOffset + size + kGuard), seed);
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaRead,
                                .wrId = ++wrId,
                                .sges = {sgeOf(local, kDstOffset, size)},
                                .remoteAddr = remote.address(kSrcOffset),
                                .rkey = remote.mr.rkey()}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(succeeded(wc, wrId, WcOpcode::kRdmaRead));
    EXPECT_EQ(wc.byteLen, size) << "a READ completion reports the bytes read";
    EXPECT_TRUE(placedWithGuards(local, bytesOf(remote, kSrcOffset, size), size, seed));
  }
}

TEST_P(VerbsConformance, SendIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kLargest + 64, access::kLocalWrite, 15));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kLargest + 128, access::kLocalWrite, 16));
  uint64_t wrId = 0;
  for (size_t size : kSizes) {
    if (size > maxMessage(*pair->a.context)) continue;  // above the device's max_msg_sz
    SCOPED_TRACE("size " + std::to_string(size));
    const uint64_t seed = 3000 + size;
    fillPattern(writableBytes(dst, 0, kDstOffset + size + kGuard), seed);
    ++wrId;
    ASSERT_OK(postReceive(pair->b.qp, 500 + wrId, {sgeOf(dst, kDstOffset, size + kGuard)}));
    std::vector<v::Sge> sges;
    if (size > 0) sges.push_back(sgeOf(src, kSrcOffset, size));
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = wrId, .sges = sges}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(succeeded(wc, wrId, WcOpcode::kSend));
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
    EXPECT_TRUE(succeeded(wc, 500 + wrId, WcOpcode::kRecv));
    EXPECT_EQ(wc.byteLen, size);
    EXPECT_EQ(wc.qpNum, pair->b.qp.qpNum());
    EXPECT_EQ(wc.wcFlags & v::wc_flags::kWithImm, 0u);
    EXPECT_TRUE(placedWithGuards(dst, bytesOf(src, kSrcOffset, size), size, seed));
  }
}

TEST_P(VerbsConformance, SendWithImmediateCarriesTheImmediate) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 17));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 18));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 1024)}));
  ASSERT_OK(
      post(pair->a.qp,
           {.opcode = WrOpcode::kSendWithImm, .wrId = 2, .sges = {sgeOf(src, 0, 100)}, .imm = 0x12345678}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, 100u);
  EXPECT_NE(wc.wcFlags & v::wc_flags::kWithImm, 0u);
  EXPECT_EQ(wc.immData, 0x12345678u);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 100), bytesOf(src, 0, 100)));
}

TEST_P(VerbsConformance, WriteWithImmediateConsumesAReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 19));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 20));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 21));
  ASSERT_OK(postReceive(pair->b.qp, 7, {sgeOf(inbox, 0, 256)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWriteWithImm,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = dst.address(128),
                              .rkey = dst.mr.rkey(),
                              .imm = 0xa1b2c3d4}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 7, WcOpcode::kRecvRdmaWithImm));
  EXPECT_EQ(wc.byteLen, 4096u);
  EXPECT_EQ(wc.immData, 0xa1b2c3d4u);
  EXPECT_NE(wc.wcFlags & v::wc_flags::kWithImm, 0u);
  EXPECT_EQ(wc.qpNum, pair->b.qp.qpNum());
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 128, 4096), bytesOf(src, 0, 4096)));
  EXPECT_TRUE(matchesPattern(bytesOf(inbox, 0, 4096), 21)) << "the receive's buffer is not written";

  // Zero bytes into a receive without SGEs: the immediate alone.
  ASSERT_OK(postReceive(pair->b.qp, 8, {}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWriteWithImm,
                              .wrId = 2,
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey(),
                              .imm = 42}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaWrite));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 8, WcOpcode::kRecvRdmaWithImm));
  EXPECT_EQ(wc.byteLen, 0u);
  EXPECT_EQ(wc.immData, 42u);
}

TEST_P(VerbsConformance, AtomicsReturnTheOriginalValue) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(pair->b.pd, 64, access::kAll, 22));
  ASSERT_OK_AND_ASSIGN(auto result, registerBuffer(pair->a.pd, 64, access::kLocalWrite, 23));
  store64(target.data() + 8, 0x1111);
  struct Step {
    WrOpcode opcode;
    uint64_t compareAdd;
    uint64_t swap;
    uint64_t before;
    uint64_t after;
  };
  const Step steps[] = {
      {WrOpcode::kAtomicCmpAndSwp, 0x1111, 0x2222, 0x1111, 0x2222},  // compare matches: swapped
      {WrOpcode::kAtomicCmpAndSwp, 0x1111, 0x3333, 0x2222, 0x2222},  // no match: unchanged
      {WrOpcode::kAtomicFetchAndAdd, 5, 0, 0x2222, 0x2227},
      {WrOpcode::kAtomicFetchAndAdd, ~uint64_t{0} - 0x2226, 0, 0x2227, 0},  // wraps around
      {WrOpcode::kAtomicCmpAndSwp, 0, 0xfedcba9876543210ull, 0, 0xfedcba9876543210ull},
  };
  uint64_t wrId = 0;
  for (const Step& step : steps) {
    SCOPED_TRACE("step " + std::to_string(wrId + 1));
    store64(result.data() + 16, 0xdeaddeaddeaddeadull);
    ASSERT_OK(post(pair->a.qp, {.opcode = step.opcode,
                                .wrId = ++wrId,
                                .sges = {sgeOf(result, 16, 8)},
                                .remoteAddr = target.address(8),
                                .rkey = target.mr.rkey(),
                                .compareAdd = step.compareAdd,
                                .swap = step.swap}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(succeeded(
        wc, wrId, step.opcode == WrOpcode::kAtomicCmpAndSwp ? WcOpcode::kCompSwap : WcOpcode::kFetchAdd));
    EXPECT_EQ(load64(result.data() + 16), step.before);
    EXPECT_EQ(load64(target.data() + 8), step.after);
  }
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 8), 22, 0));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 16, 48), 22, 16));
  EXPECT_TRUE(matchesPattern(bytesOf(result, 0, 16), 23, 0));
  EXPECT_TRUE(matchesPattern(bytesOf(result, 24, 40), 23, 24));
}

TEST_P(VerbsConformance, MisalignedAtomicIsRefusedAtPost) {
  // As the kernel's rxe: an atomic whose remote address is not 8-byte aligned is refused by
  // post_send (EINVAL); nothing completes and the QP keeps working.
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(pair->b.pd, 64, access::kAll, 24));
  ASSERT_OK_AND_ASSIGN(auto result, registerBuffer(pair->a.pd, 64, access::kLocalWrite, 25));
  EXPECT_TRUE(hasCode(post(pair->a.qp, {.opcode = WrOpcode::kAtomicFetchAndAdd,
                                        .wrId = 1,
                                        .sges = {sgeOf(result, 0, 8)},
                                        .remoteAddr = target.address(4),
                                        .rkey = target.mr.rkey(),
                                        .compareAdd = 1}),
                      StatusCode::kInvalidArgument, EINVAL));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, std::chrono::milliseconds(50)));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 64), 24));
  EXPECT_TRUE(matchesPattern(bytesOf(result, 0, 64), 25));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kAtomicFetchAndAdd,
                              .wrId = 2,
                              .sges = {sgeOf(result, 0, 8)},
                              .remoteAddr = target.address(8),
                              .rkey = target.mr.rkey(),
                              .compareAdd = 1}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
}

TEST_P(VerbsConformance, ConcurrentFetchAddsFromTwoQpsSumExactly) {
  // B: one context, one region, two QPs; A1 and A2: separate contexts.
  Side b, a1, a2;
  ASSERT_OK(openSide(b, nullptr, 1024));
  ASSERT_OK(openSide(a1, nullptr, 1024));
  ASSERT_OK(openSide(a2, nullptr, 1024));
  ASSERT_OK(createQp(b, {}));
  ASSERT_OK_AND_ASSIGN(v::QueuePair b2,
                       b.pd.createQp({.sendCq = &b.sendCq, .recvCq = &b.recvCq, .cap = QpOptions{}.cap}));
  ASSERT_OK(createQp(a1, {}));
  ASSERT_OK(createQp(a2, {}));
  ASSERT_OK(connectQps(*a1.context, a1.qp, *b.context, b.qp));
  ASSERT_OK(connectQps(*a2.context, a2.qp, *b.context, b2));
  ASSERT_OK_AND_ASSIGN(auto counter, registerBuffer(b.pd, 64, access::kAll, 26));
  store64(counter.data() + 32, 0);
  constexpr uint64_t kPerQp = 256;
  constexpr uint64_t kBatch = 64;
  ASSERT_OK_AND_ASSIGN(auto results1, registerBuffer(a1.pd, kPerQp * 8, access::kLocalWrite, 27));
  ASSERT_OK_AND_ASSIGN(auto results2, registerBuffer(a2.pd, kPerQp * 8, access::kLocalWrite, 28));
  auto batch = [&](v::QueuePair& qp, const RegisteredBuffer& results, uint64_t first) {
    std::vector<SendOp> ops;
    for (uint64_t i = first; i < first + kBatch; ++i) {
      ops.push_back({.opcode = WrOpcode::kAtomicFetchAndAdd,
                     .wrId = i,
                     .sges = {sgeOf(results, i * 8, 8)},
                     .remoteAddr = counter.address(32),
                     .rkey = counter.mr.rkey(),
                     .compareAdd = 1});
    }
    return postAll(qp, ops);
  };
  for (uint64_t first = 0; first < kPerQp; first += kBatch) {
    ASSERT_OK(batch(a1.qp, results1, first));
    ASSERT_OK(batch(a2.qp, results2, first));
    std::vector<WorkCompletion> c1, c2;
    ASSERT_TRUE(pollCompletions(a1.sendCq, kBatch, &c1));
    ASSERT_TRUE(pollCompletions(a2.sendCq, kBatch, &c2));
    for (uint64_t i = 0; i < kBatch; ++i) {
      ASSERT_TRUE(succeeded(c1[i], first + i, WcOpcode::kFetchAdd));
      ASSERT_TRUE(succeeded(c2[i], first + i, WcOpcode::kFetchAdd));
    }
  }
  EXPECT_EQ(load64(counter.data() + 32), 2 * kPerQp);
  // Every original value 0 .. 2N-1 was returned exactly once.
  std::vector<uint64_t> originals;
  for (uint64_t i = 0; i < kPerQp; ++i) {
    originals.push_back(load64(results1.data() + i * 8));
    originals.push_back(load64(results2.data() + i * 8));
  }
  std::sort(originals.begin(), originals.end());
  std::vector<uint64_t> expected(2 * kPerQp);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(originals, expected);
  // Each QP's own results increase in post order.
  for (uint64_t i = 1; i < kPerQp; ++i) {
    EXPECT_LT(load64(results1.data() + (i - 1) * 8), load64(results1.data() + i * 8));
    EXPECT_LT(load64(results2.data() + (i - 1) * 8), load64(results2.data() + i * 8));
  }
}

TEST_P(VerbsConformance, GatherOnSendAndScatterOnReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 29));
  ASSERT_OK_AND_ASSIGN(auto src2, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 30));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 31));
  // 100 + 300 (one region) + 7 (another region) bytes into 50 + 300 + 100 bytes of receive.
  std::vector<uint8_t> before(dst.data(), dst.data() + dst.size());
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 50), sgeOf(dst, 200, 300), sgeOf(dst, 600, 100)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 100), sgeOf(src, 1000, 300), sgeOf(src2, 5, 7)}}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, 407u);
  std::vector<uint8_t> stream(src.data(), src.data() + 100);
  stream.insert(stream.end(), src.data() + 1000, src.data() + 1300);
  stream.insert(stream.end(), src2.data() + 5, src2.data() + 12);
  std::vector<uint8_t> expected = before;
  std::copy_n(stream.begin(), 50, expected.begin());
  std::copy_n(stream.begin() + 50, 300, expected.begin() + 200);
  std::copy_n(stream.begin() + 350, 57, expected.begin() + 600);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, dst.size()), expected));

  // WRITE gathers the same way into one remote range.
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 3,
                              .sges = {sgeOf(src, 0, 100), sgeOf(src, 1000, 300), sgeOf(src2, 5, 7)},
                              .remoteAddr = dst.address(4096),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 4096, 407), stream));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 4096 + 407, 100), 31, 4096 + 407));

  // READ scatters one remote range over several local SGEs.
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 32));
  std::vector<uint8_t> localBefore(local.data(), local.data() + local.size());
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaRead,
                              .wrId = 4,
                              .sges = {sgeOf(local, 10, 20), sgeOf(local, 100, 30)},
                              .remoteAddr = dst.address(4096),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 4, WcOpcode::kRdmaRead));
  std::vector<uint8_t> localExpected =
      scatterImage(dst.data(), {{4096, 50}}, localBefore, {{10, 20}, {100, 30}});
  EXPECT_TRUE(bytesEqual(bytesOf(local, 0, local.size()), localExpected));
}

TEST_P(VerbsConformance, MaximumSgeCountsWork) {
  ASSERT_OK_AND_ASSIGN(v::Context probe, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, probe.queryDevice());
  const uint32_t k = static_cast<uint32_t>(std::min(device.maxSge, 16));
  const uint32_t kRead = static_cast<uint32_t>(std::min({device.maxSgeRd, device.maxSge, 16}));
  const QpOptions wide{.cap = {.maxSendWr = 16, .maxRecvWr = 16, .maxSendSge = k, .maxRecvSge = k}};
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = wide, .qpB = wide}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 33));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 34));

  std::vector<std::pair<size_t, size_t>> gather, scatter;
  size_t total = 0;
  for (uint32_t i = 0; i < k; ++i) {
    gather.push_back({i * 1000 + i, (i + 1) * 7});
    total += (i + 1) * 7;
  }
  for (uint32_t i = 0; i < k; ++i) scatter.push_back({i * 2000 + 3, total / k + 1});
  std::vector<uint8_t> before(dst.data(), dst.data() + dst.size());
  ASSERT_OK(postReceive(pair->b.qp, 1, sgesOf(dst, scatter)));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 2, .sges = sgesOf(src, gather)}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, total);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, dst.size()), scatterImage(src.data(), gather, before, scatter)));

  // READ into kRead local SGEs.
  std::vector<std::pair<size_t, size_t>> readScatter;
  size_t readTotal = 0;
  for (uint32_t i = 0; i < kRead; ++i) {
    readScatter.push_back({32 * kKiB + i * 500, 11 + i});
    readTotal += 11 + i;
  }
  std::vector<uint8_t> srcBefore(src.data(), src.data() + src.size());
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaRead,
                              .wrId = 3,
                              .sges = sgesOf(src, readScatter),
                              .remoteAddr = dst.address(40 * kKiB),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kRdmaRead));
  EXPECT_TRUE(bytesEqual(bytesOf(src, 0, src.size()),
                         scatterImage(dst.data(), {{40 * kKiB, readTotal}}, srcBefore, readScatter)));
}

TEST_P(VerbsConformance, InlineDataIsCopiedAtPostTime) {
  ASSERT_OK_AND_ASSIGN(v::Context probe, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, probe.queryDevice());
  if (device.maxInlineData == 0) GTEST_SKIP() << providerPath().device << " offers no inline data";
  const uint32_t inlineCap = std::min<uint32_t>(device.maxInlineData, 64);
  QpOptions withInline;
  withInline.cap.maxInlineData = inlineCap;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = withInline}));
  ASSERT_OK_AND_ASSIGN(v::QpAttr attr, pair->a.qp.query());
  EXPECT_GE(attr.cap.maxInlineData, inlineCap);
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 35));

  // Unregistered memory (lkey 0), overwritten as soon as postSend returns.
  std::vector<uint8_t> scratch(inlineCap);
  fillPattern(scratch, 36);
  const v::Sge sge{.addr = reinterpret_cast<uint64_t>(scratch.data()), .length = inlineCap, .lkey = 0};
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 1024)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend,
                              .wrId = 2,
                              .sges = {sge},
                              .flags = send_flags::kSignaled | send_flags::kInline}));
  std::fill(scratch.begin(), scratch.end(), 0);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 3,
                              .sges = {sge},
                              .flags = send_flags::kSignaled | send_flags::kInline,
                              .remoteAddr = dst.address(2048),
                              .rkey = dst.mr.rkey()}));
  fillPattern(scratch, 37);
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_TRUE(succeeded(completions[0], 2, WcOpcode::kSend));
  EXPECT_TRUE(succeeded(completions[1], 3, WcOpcode::kRdmaWrite));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, inlineCap);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, inlineCap), 36));
  EXPECT_TRUE(std::all_of(dst.data() + 2048, dst.data() + 2048 + inlineCap, [](uint8_t x) { return x == 0; }))
      << "the inline WRITE carries the bytes as they were at post time";
}

// ============================ completions and ordering ============================

TEST_P(VerbsConformance, UnsignaledRequestsProduceNoCompletion) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 38));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 39));
  std::vector<SendOp> ops;
  for (uint64_t id = 1; id <= 4; ++id) {
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = id,
                   .sges = {sgeOf(src, id * 512, 512)},
                   .flags = id == 4 ? send_flags::kSignaled : 0u,
                   .remoteAddr = dst.address(id * 512),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 4, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(50)));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 512, 2048), bytesOf(src, 512, 2048)))
      << "unsignaled writes were carried out";
}

TEST_P(VerbsConformance, SqSigAllSignalsEveryRequest) {
  QpOptions sigAll;
  sigAll.sqSigAll = true;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = sigAll}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 40));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 41));
  std::vector<SendOp> ops;
  for (uint64_t id = 1; id <= 4; ++id) {
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = id,
                   .sges = {sgeOf(src, 0, 64)},
                   .flags = 0,
                   .remoteAddr = dst.address(),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &completions));
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(succeeded(completions[i], i + 1, WcOpcode::kRdmaWrite));
}

TEST_P(VerbsConformance, UnsignaledErrorStillCompletes) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 42));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 43));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 9,
                              .sges = {sgeOf(src, 0, 64)},
                              .flags = 0,
                              .remoteAddr = dst.address(),
                              .rkey = corruptKey(dst.mr.rkey())}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(failedWith(wc, 9, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 43));
}

TEST_P(VerbsConformance, WritesBeforeASendAreVisibleWhenItArrives) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  constexpr size_t kChunk = 256 * kKiB;
  constexpr size_t kChunks = 64;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kChunk * kChunks, access::kLocalWrite, 44));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kChunk * kChunks, access::kAll, 45));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 46));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(inbox, 0, 64)}));
  std::vector<SendOp> ops;
  for (size_t i = 0; i < kChunks; ++i) {
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = 100 + i,
                   .sges = {sgeOf(src, i * kChunk, kChunk)},
                   .flags = 0,
                   .remoteAddr = dst.address(i * kChunk),
                   .rkey = dst.mr.rkey()});
  }
  ops.push_back({.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 8)}});
  ASSERT_OK(postAll(pair->a.qp, ops));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  // Checked at once, before A's completion: the SEND arrived, so every earlier WRITE is placed.
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, dst.size()), bytesOf(src, 0, src.size())));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kSend));
}

TEST_P(VerbsConformance, ReadAfterWriteSeesTheWrite) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4 * kMiB, access::kLocalWrite, 47));
  ASSERT_OK_AND_ASSIGN(auto back, registerBuffer(pair->a.pd, 4 * kMiB, access::kLocalWrite, 48));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4 * kMiB, access::kAll, 49));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 1,
                                  .sges = {sgeOf(src, 0, 4 * kMiB)},
                                  .flags = 0,
                                  .remoteAddr = dst.address(),
                                  .rkey = dst.mr.rkey()},
                                 {.opcode = WrOpcode::kRdmaRead,
                                  .wrId = 2,
                                  .sges = {sgeOf(back, 0, 4 * kMiB)},
                                  .remoteAddr = dst.address(),
                                  .rkey = dst.mr.rkey()}}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaRead));
  EXPECT_TRUE(bytesEqual(bytesOf(back, 0, 4 * kMiB), bytesOf(src, 0, 4 * kMiB)));
}

TEST_P(VerbsConformance, CompletionsComeInPostOrderAcrossOpcodes) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 * kMiB, access::kLocalWrite, 50));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 * kMiB, access::kAll, 51));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 64 * kKiB, access::kLocalWrite, 52));
  struct Kind {
    WrOpcode opcode;
    WcOpcode completes;
    size_t length;
    bool consumesReceive;
  };
  const Kind kinds[] = {
      {WrOpcode::kRdmaWrite, WcOpcode::kRdmaWrite, 64 * kKiB, false},
      {WrOpcode::kRdmaRead, WcOpcode::kRdmaRead, 16 * kKiB, false},
      {WrOpcode::kSend, WcOpcode::kSend, 100, true},
      {WrOpcode::kAtomicFetchAndAdd, WcOpcode::kFetchAdd, 8, false},
      {WrOpcode::kRdmaWriteWithImm, WcOpcode::kRdmaWrite, 1000, true},
      {WrOpcode::kAtomicCmpAndSwp, WcOpcode::kCompSwap, 8, false},
      {WrOpcode::kSendWithImm, WcOpcode::kSend, 3, true},
      {WrOpcode::kRdmaWrite, WcOpcode::kRdmaWrite, 1, false},
  };
  constexpr int kRounds = 8;
  std::vector<SendOp> ops;
  std::vector<WcOpcode> expectedRecv;
  uint64_t recvId = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (const Kind& kind : kinds) {
      const uint64_t id = ops.size() + 1;
      const size_t slot = (id % 8) * 64 * kKiB;
      SendOp op{.opcode = kind.opcode,
                .wrId = id,
                .sges = {sgeOf(src, slot, kind.length)},
                .remoteAddr = dst.address(slot),
                .rkey = dst.mr.rkey(),
                .imm = static_cast<uint32_t>(id),
                .compareAdd = 1};
      if (kind.opcode == WrOpcode::kAtomicCmpAndSwp || kind.opcode == WrOpcode::kAtomicFetchAndAdd) {
        op.sges = {sgeOf(src, 512 * kKiB + id * 8, 8)};
        op.remoteAddr = dst.address(1 * kMiB - 8);
      }
      ops.push_back(op);
      if (kind.consumesReceive) {
        ASSERT_OK(postReceive(pair->b.qp, ++recvId, {sgeOf(inbox, 0, 4096)}));
        expectedRecv.push_back(kind.opcode == WrOpcode::kRdmaWriteWithImm ? WcOpcode::kRecvRdmaWithImm
                                                                          : WcOpcode::kRecv);
      }
    }
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, ops.size(), &completions));
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_TRUE(succeeded(completions[i], i + 1, kinds[i % std::size(kinds)].completes)) << "position " << i;
  }
  std::vector<WorkCompletion> received;
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, expectedRecv.size(), &received));
  for (size_t i = 0; i < received.size(); ++i) {
    EXPECT_TRUE(succeeded(received[i], i + 1, expectedRecv[i])) << "receive " << i;
  }
}

// ============================ receiver not ready ============================

TEST_P(VerbsConformance, SendWaitsForALateReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = {.rnrRetries = 7, .minRnrTimer = 1}}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 53));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kLocalWrite, 54));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 4096)}}));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(200))) << "no receive is posted yet";
  ASSERT_OK(postReceive(pair->b.qp, 2, {sgeOf(dst, 0, 8192)}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, 4096u);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 4096), bytesOf(src, 0, 4096)));
}

TEST_P(VerbsConformance, RnrRetriesRunOut) {
  for (WrOpcode opcode : {WrOpcode::kSend, WrOpcode::kRdmaWriteWithImm}) {
    SCOPED_TRACE(opcode == WrOpcode::kSend ? "SEND" : "RDMA_WRITE_WITH_IMM");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = {.rnrRetries = 1, .minRnrTimer = 5}}));
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 55));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 56));
    const auto start = Clock::now();
    ASSERT_OK(postAll(pair->a.qp, {{.opcode = opcode,
                                    .wrId = 1,
                                    .sges = {sgeOf(src, 0, 64)},
                                    .remoteAddr = dst.address(),
                                    .rkey = dst.mr.rkey()},
                                   {.opcode = WrOpcode::kRdmaWrite,
                                    .wrId = 2,
                                    .sges = {sgeOf(src, 0, 64)},
                                    .remoteAddr = dst.address(1024),
                                    .rkey = dst.mr.rkey()}}));
    std::vector<WorkCompletion> completions;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
    EXPECT_LT(Clock::now() - start, kPeerLossBound);
    EXPECT_TRUE(failedWith(completions[0], 1, WcStatus::kRnrRetryExcErr));
    EXPECT_TRUE(failedWith(completions[1], 2, WcStatus::kWrFlushErr));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
    EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024, 64), 56, 1024)) << "flushed WRITE was not carried out";
  }
}

// ============================ error completions ============================

struct AccessCase {
  const char* name;
  WrOpcode opcode;
  uint32_t targetMrAccess = access::kAll;
  uint32_t targetQpAccess = kRemoteAccess;
  bool badRkey = false;
  int64_t offset = 0;  // of the remote address from the start of the region
  uint32_t length = 64;
  bool signaled = true;
  bool otherPd = false;  // the region belongs to another PD than the responder's QP
  // What the requester sees. A QP whose access flags refuse the operation answers "invalid
  // request", as the kernel's rxe does; a region that refuses it answers "remote access".
  WcStatus expected = WcStatus::kRemAccessErr;
};

TEST_P(VerbsConformance, RemoteAccessViolationsFailWithoutTouchingMemory) {
  constexpr uint32_t noRemoteWrite = access::kLocalWrite | access::kRemoteRead | access::kRemoteAtomic;
  constexpr uint32_t noRemoteRead = access::kLocalWrite | access::kRemoteWrite | access::kRemoteAtomic;
  constexpr uint32_t noRemoteAtomic = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;
  constexpr uint32_t qpNoWrite = access::kRemoteRead | access::kRemoteAtomic;
  constexpr uint32_t qpNoRead = access::kRemoteWrite | access::kRemoteAtomic;
  constexpr uint32_t qpNoAtomic = access::kRemoteWrite | access::kRemoteRead;
  const AccessCase cases[] = {
      {.name = "WRITE, bad rkey", .opcode = WrOpcode::kRdmaWrite, .badRkey = true},
      {.name = "WRITE, bad rkey, unsignaled",
       .opcode = WrOpcode::kRdmaWrite,
       .badRkey = true,
       .signaled = false},
      {.name = "WRITE past the end", .opcode = WrOpcode::kRdmaWrite, .offset = 4096 - 32},
      {.name = "WRITE before the start", .opcode = WrOpcode::kRdmaWrite, .offset = -8, .length = 16},
      {.name = "WRITE, region without REMOTE_WRITE",
       .opcode = WrOpcode::kRdmaWrite,
       .targetMrAccess = noRemoteWrite},
      {.name = "WRITE, QP without REMOTE_WRITE",
       .opcode = WrOpcode::kRdmaWrite,
       .targetQpAccess = qpNoWrite,
       .expected = WcStatus::kRemInvReqErr},
      {.name = "WRITE, region of another PD", .opcode = WrOpcode::kRdmaWrite, .otherPd = true},
      {.name = "READ, region of another PD", .opcode = WrOpcode::kRdmaRead, .otherPd = true},
      {.name = "WRITE_WITH_IMM, bad rkey", .opcode = WrOpcode::kRdmaWriteWithImm, .badRkey = true},
      {.name = "READ, bad rkey", .opcode = WrOpcode::kRdmaRead, .badRkey = true},
      {.name = "READ past the end", .opcode = WrOpcode::kRdmaRead, .offset = 4096 - 8},
      {.name = "READ, region without REMOTE_READ",
       .opcode = WrOpcode::kRdmaRead,
       .targetMrAccess = noRemoteRead},
      {.name = "READ, QP without REMOTE_READ",
       .opcode = WrOpcode::kRdmaRead,
       .targetQpAccess = qpNoRead,
       .expected = WcStatus::kRemInvReqErr},
      {.name = "FETCH_ADD, bad rkey", .opcode = WrOpcode::kAtomicFetchAndAdd, .badRkey = true, .length = 8},
      {.name = "FETCH_ADD past the end", .opcode = WrOpcode::kAtomicFetchAndAdd, .offset = 4096, .length = 8},
      {.name = "FETCH_ADD, region without REMOTE_ATOMIC",
       .opcode = WrOpcode::kAtomicFetchAndAdd,
       .targetMrAccess = noRemoteAtomic,
       .length = 8},
      {.name = "CMP_SWAP, QP without REMOTE_ATOMIC",
       .opcode = WrOpcode::kAtomicCmpAndSwp,
       .targetQpAccess = qpNoAtomic,
       .length = 8,
       .expected = WcStatus::kRemInvReqErr},
  };
  for (const AccessCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout, .accessB = c.targetQpAccess}));
    // The region is the middle page of three, so stray accesses on either side show up.
    TestBuffer memory(3 * 4096);
    fillPattern(memory.bytes(), 57);
    v::ProtectionDomain otherPd;
    if (c.otherPd) {
      ASSERT_OK_AND_ASSIGN(otherPd, pair->b.context->allocPd());
    }
    v::ProtectionDomain& regionPd = c.otherPd ? otherPd : pair->b.pd;
    ASSERT_OK_AND_ASSIGN(v::MemoryRegion region,
                         regionPd.registerMemory(memory.data() + 4096, 4096, c.targetMrAccess));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 58));
    ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 59));
    ASSERT_OK(postReceive(pair->b.qp, 900, {sgeOf(inbox, 0, 256)}));

    const uint64_t remote = memory.address(4096) + static_cast<uint64_t>(c.offset);
    ASSERT_OK(postAll(pair->a.qp, {{.opcode = c.opcode,
                                    .wrId = 1,
                                    .sges = {sgeOf(local, 0, c.length)},
                                    .flags = c.signaled ? send_flags::kSignaled : 0u,
                                    .remoteAddr = remote,
                                    .rkey = c.badRkey ? corruptKey(region.rkey()) : region.rkey(),
                                    .imm = 5,
                                    .compareAdd = 1},
                                   {.opcode = WrOpcode::kRdmaWrite,
                                    .wrId = 2,
                                    .sges = {sgeOf(local, 0, 8)},
                                    .remoteAddr = memory.address(4096),
                                    .rkey = region.rkey()}}));
    std::vector<WorkCompletion> completions;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
    EXPECT_TRUE(failedWith(completions[0], 1, c.expected));
    EXPECT_TRUE(failedWith(completions[1], 2, WcStatus::kWrFlushErr));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
    EXPECT_TRUE(reachesState(pair->b.qp, QpState::kErr));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
    EXPECT_EQ(wc.wrId, 900u);
    if (c.opcode == WrOpcode::kRdmaWriteWithImm) {
      // The responder may have taken the receive for this request before the check failed.
      EXPECT_NE(wc.status, WcStatus::kSuccess) << describe(wc);
    } else {
      EXPECT_EQ(wc.status, WcStatus::kWrFlushErr) << describe(wc);
    }
    EXPECT_TRUE(matchesPattern(memory.bytes(), 57)) << "target memory";
    EXPECT_TRUE(matchesPattern(bytesOf(local, 0, local.size()), 58)) << "requester memory";
    EXPECT_TRUE(matchesPattern(bytesOf(inbox, 0, inbox.size()), 59)) << "responder's receive buffer";
  }
}

// As the kernel's rxe: the responder cannot place the message in its receive (a malformed receive
// work request): LOC_QP_OP_ERR there, REM_OP_ERR at the requester.
TEST_P(VerbsConformance, MessageLongerThanTheReceiveIsARemoteOperationError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 60));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 61));
  ASSERT_OK(postReceive(pair->b.qp, 5, {sgeOf(dst, 0, 16)}));
  ASSERT_OK(postReceive(pair->b.qp, 6, {sgeOf(dst, 1024, 16)}));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 32)}},
                                 {.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 8)}}}));
  std::vector<WorkCompletion> sent, received;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(failedWith(sent[0], 1, WcStatus::kRemOpErr));
  EXPECT_TRUE(failedWith(sent[1], 2, WcStatus::kWrFlushErr));
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &received));
  EXPECT_TRUE(failedWith(received[0], 5, WcStatus::kLocQpOpErr));
  EXPECT_TRUE(failedWith(received[1], 6, WcStatus::kWrFlushErr));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  EXPECT_TRUE(reachesState(pair->b.qp, QpState::kErr));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024, 3072), 61, 1024));
}

TEST_P(VerbsConformance, BadLocalKeyFailsLocally) {
  struct LocalCase {
    const char* name;
    WrOpcode opcode;
    bool badLkey;
    size_t offset;
    size_t length;
    WcStatus expected;
  };
  // As the kernel's rxe: a source key that names no region fails the request as a local QP
  // operation error; a range outside the region, or a bad key for a READ's destination, as a
  // local protection error.
  const LocalCase cases[] = {
      {"WRITE, bad lkey", WrOpcode::kRdmaWrite, true, 0, 64, WcStatus::kLocQpOpErr},
      {"WRITE, SGE past the region", WrOpcode::kRdmaWrite, false, 4096 - 16, 64, WcStatus::kLocProtErr},
      {"SEND, bad lkey", WrOpcode::kSend, true, 0, 64, WcStatus::kLocQpOpErr},
      {"READ into a bad lkey", WrOpcode::kRdmaRead, true, 0, 64, WcStatus::kLocProtErr},
  };
  for (const LocalCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 62));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 63));
    ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 64));
    ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(inbox, 0, 4096)}));
    v::Sge sge = sgeOf(local, c.offset, c.length);
    if (c.badLkey) sge.lkey = corruptKey(sge.lkey);
    ASSERT_OK(post(
        pair->a.qp,
        {.opcode = c.opcode, .wrId = 7, .sges = {sge}, .remoteAddr = dst.address(), .rkey = dst.mr.rkey()}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(failedWith(wc, 7, c.expected));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
    EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 63));
    EXPECT_TRUE(matchesPattern(bytesOf(inbox, 0, 4096), 64));
    EXPECT_TRUE(matchesPattern(bytesOf(local, 0, 4096), 62));
  }
}

// One post of several WRITEs naming the same lkey: a later one whose range runs past the region
// fails with a local protection error, though an earlier one of the same key passed (a check made
// once for the key must still be made for each range); the ones before it land, it and what
// follows move nothing.
TEST_P(VerbsConformance, ABatchChecksEachRangeOfARepeatedLocalKey) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 67));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 68));
  // One WRITE first, so the connection is up and a provider's batch path (if any) is ready.
  WorkCompletion first;
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 9,
                              .sges = {sgeOf(local, 0, 64)},
                              .remoteAddr = dst.address(0),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &first));
  ASSERT_EQ(first.status, WcStatus::kSuccess);
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 4; ++i) {
    const size_t offset = i == 2 ? 4096 - 16 : i * 64;  // the third runs 48 bytes past the region
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = 10 + i,
                   .sges = {sgeOf(local, offset, 64)},
                   .remoteAddr = dst.address(1024 + i * 64),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<WorkCompletion> wcs;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &wcs));
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wcs[1].status, WcStatus::kSuccess);
  EXPECT_TRUE(failedWith(wcs[2], 12, WcStatus::kLocProtErr));
  EXPECT_TRUE(failedWith(wcs[3], 13, WcStatus::kWrFlushErr));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 1024, 128), bytesOf(local, 0, 128)));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 64, 1024 - 64), 68, 64));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024 + 128, 4096 - 1024 - 128), 68, 1024 + 128))
      << "the failed WRITE or the one after it moved bytes";
}

TEST_P(VerbsConformance, BadKeyInTheResponderReceiveIsARemoteOperationError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 65));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 66));
  v::Sge sge = sgeOf(dst, 0, 256);
  sge.lkey = corruptKey(sge.lkey);
  ASSERT_OK(postReceive(pair->b.qp, 3, {sge}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 4, .sges = {sgeOf(src, 0, 32)}}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(failedWith(wc, 4, WcStatus::kRemOpErr));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(failedWith(wc, 3, WcStatus::kLocQpOpErr));  // as the kernel's rxe
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 66));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
}

TEST_P(VerbsConformance, ResultIntoRegionWithoutLocalWriteIsALocalProtectionError) {
  for (WrOpcode opcode : {WrOpcode::kRdmaRead, WrOpcode::kAtomicFetchAndAdd}) {
    SCOPED_TRACE(opcode == WrOpcode::kRdmaRead ? "READ" : "FETCH_ADD");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
    ASSERT_OK_AND_ASSIGN(auto readOnly, registerBuffer(pair->a.pd, 4096, access::kRemoteRead, 67));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, 4096, access::kAll, 68));
    ASSERT_OK(post(pair->a.qp, {.opcode = opcode,
                                .wrId = 1,
                                .sges = {sgeOf(readOnly, 0, 8)},
                                .remoteAddr = remote.address(),
                                .rkey = remote.mr.rkey(),
                                .compareAdd = 1}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(failedWith(wc, 1, WcStatus::kLocProtErr));
    EXPECT_TRUE(matchesPattern(bytesOf(readOnly, 0, 4096), 67));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  }
}

TEST_P(VerbsConformance, ErrorFlushesEverythingOutstandingAndLater) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto bufA, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 69));
  ASSERT_OK_AND_ASSIGN(auto bufB, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 70));
  for (uint64_t id = 50; id < 53; ++id) ASSERT_OK(postReceive(pair->a.qp, id, {sgeOf(bufA, 32 * kKiB, 64)}));
  for (uint64_t id = 60; id < 62; ++id) ASSERT_OK(postReceive(pair->b.qp, id, {sgeOf(bufB, 32 * kKiB, 64)}));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 1,
                                  .sges = {sgeOf(bufA, 0, 1024)},
                                  .remoteAddr = bufB.address(0),
                                  .rkey = bufB.mr.rkey()},
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 2,
                                  .sges = {sgeOf(bufA, 0, 1024)},
                                  .remoteAddr = bufB.address(4096),
                                  .rkey = corruptKey(bufB.mr.rkey())},
                                 {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(bufA, 0, 16)}},
                                 {.opcode = WrOpcode::kRdmaRead,
                                  .wrId = 4,
                                  .sges = {sgeOf(bufA, 8192, 1024)},
                                  .remoteAddr = bufB.address(0),
                                  .rkey = bufB.mr.rkey()},
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 5,
                                  .sges = {sgeOf(bufA, 0, 1024)},
                                  .flags = 0,
                                  .remoteAddr = bufB.address(8192),
                                  .rkey = bufB.mr.rkey()}}));
  std::vector<WorkCompletion> sent;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &sent));
  EXPECT_TRUE(succeeded(sent[0], 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(failedWith(sent[1], 2, WcStatus::kRemAccessErr));
  EXPECT_TRUE(failedWith(sent[2], 3, WcStatus::kWrFlushErr));
  EXPECT_TRUE(failedWith(sent[3], 4, WcStatus::kWrFlushErr));
  // WR 5 is unsignaled: flushed requests complete even so (libibverbs flushes every WR).
  sent.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 1, &sent));
  EXPECT_TRUE(failedWith(sent[0], 5, WcStatus::kWrFlushErr));

  std::vector<WorkCompletion> received;
  ASSERT_TRUE(pollCompletions(pair->a.recvCq, 3, &received));
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(failedWith(received[i], 50 + i, WcStatus::kWrFlushErr));
  received.clear();
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &received));
  for (uint64_t i = 0; i < 2; ++i) EXPECT_TRUE(failedWith(received[i], 60 + i, WcStatus::kWrFlushErr));

  // Work posted to a QP in ERR completes at once with WR_FLUSH_ERR.
  ASSERT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 6,
                              .sges = {sgeOf(bufA, 0, 8)},
                              .remoteAddr = bufB.address(),
                              .rkey = bufB.mr.rkey()}));
  ASSERT_OK(postReceive(pair->a.qp, 53, {sgeOf(bufA, 32 * kKiB, 64)}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(failedWith(wc, 6, WcStatus::kWrFlushErr));
  ASSERT_TRUE(pollOne(pair->a.recvCq, &wc));
  EXPECT_TRUE(failedWith(wc, 53, WcStatus::kWrFlushErr));

  EXPECT_TRUE(bytesEqual(bytesOf(bufB, 0, 1024), bytesOf(bufA, 0, 1024)))
      << "WR 1 completed before the error";
  EXPECT_TRUE(matchesPattern(bytesOf(bufB, 1024, 31 * kKiB), 70, 1024)) << "nothing after WR 1 was written";
  EXPECT_TRUE(matchesPattern(bytesOf(bufA, 8192, 1024), 69, 8192)) << "the flushed READ wrote nothing";
}

// ============================ peer loss ============================

TEST_P(VerbsConformance, ClosedPeerContextGivesRetryExceeded) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 71));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 72));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 1024)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));

  pair->b.ownContext.close();
  const auto start = Clock::now();
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 2,
                                  .sges = {sgeOf(src, 0, 1024)},
                                  .remoteAddr = dst.address(4096),
                                  .rkey = dst.mr.rkey()},
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 3,
                                  .sges = {sgeOf(src, 0, 1024)},
                                  .remoteAddr = dst.address(4096),
                                  .rkey = dst.mr.rkey()}}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_LT(Clock::now() - start, kPeerLossBound);
  EXPECT_TRUE(failedWith(completions[0], 2, WcStatus::kRetryExcErr));
  EXPECT_TRUE(failedWith(completions[1], 3, WcStatus::kWrFlushErr));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 4096, 4096), 72, 4096))
      << "a closed context's memory is not written";
}

TEST_P(VerbsConformance, PeerClosedMidTransferFailsTheRestInOrder) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  constexpr size_t kChunk = 4 * kMiB;
  constexpr uint64_t kCount = 48;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kChunk, access::kLocalWrite, 73));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kChunk, access::kAll, 74));
  std::vector<SendOp> ops;
  for (uint64_t id = 1; id <= kCount; ++id) {
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = id,
                   .sges = {sgeOf(src, 0, kChunk)},
                   .remoteAddr = dst.address(),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  const auto start = Clock::now();
  pair->b.ownContext.close();
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, kCount, &completions));
  EXPECT_LT(Clock::now() - start, kPeerLossBound);
  size_t i = 0;
  while (i < kCount && completions[i].status == WcStatus::kSuccess) {
    EXPECT_TRUE(succeeded(completions[i], i + 1, WcOpcode::kRdmaWrite));
    ++i;
  }
  if (i == kCount) {
    // Only a path whose posting thread carries WRITEs out (the soft provider's) finishes them all
    // before the close. A WRITE posted now meets the closed peer: it must fail with the transport
    // error, never succeed or hang.
    ASSERT_TRUE(mayFinishBeforeAPeerLeaves(GetParam()))
        << "all " << kCount << " writes finished before the close";
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                .wrId = kCount + 1,
                                .sges = {sgeOf(src, 0, kChunk)},
                                .remoteAddr = dst.address(),
                                .rkey = dst.mr.rkey()}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(failedWith(wc, kCount + 1, WcStatus::kRetryExcErr));
    return;
  }
  EXPECT_TRUE(failedWith(completions[i], i + 1, WcStatus::kRetryExcErr));
  for (++i; i < kCount; ++i) EXPECT_TRUE(failedWith(completions[i], i + 1, WcStatus::kWrFlushErr));
}

TEST_P(VerbsConformance, UnreachablePeerGivesRetryExceeded) {
  Side a, b;
  ASSERT_OK(openSide(a, nullptr, 64));
  ASSERT_OK(openSide(b, nullptr, 64));
  ASSERT_OK(createQp(a, {}));
  ASSERT_OK(createQp(b, {}));
  ASSERT_OK_AND_ASSIGN(v::Path localA, makeLocalPath(*a.context, a.qp));
  ASSERT_OK_AND_ASSIGN(v::Path localB, makeLocalPath(*b.context, b.qp));
  ASSERT_OK_AND_ASSIGN(v::Path pathA, pathTowardsPeer(*a.context, a.qp, localA, localB, kShortTimeout));
  // The peer disappears before A ever reaches it: nothing listens at its address any more.
  b.ownContext.close();
  ASSERT_OK(a.qp.establish(pathA, kRemoteAccess));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kLocalWrite, 75));
  const auto start = Clock::now();
  ASSERT_OK(post(a.qp, {.opcode = WrOpcode::kRdmaWrite,
                        .wrId = 1,
                        .sges = {sgeOf(src, 0, 64)},
                        .remoteAddr = 0x10000,
                        .rkey = 0x1234}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(a.sendCq, &wc));
  EXPECT_LT(Clock::now() - start, kPeerLossBound);
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRetryExcErr));
  EXPECT_TRUE(reachesState(a.qp, QpState::kErr));
}

// ============================ memory registration lifetime ============================

TEST_P(VerbsConformance, ZeroLengthWriteAndReadIgnoreTheKey) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 76));
  ASSERT_OK(
      postAll(pair->a.qp, {{.opcode = WrOpcode::kRdmaWrite, .wrId = 1, .remoteAddr = 0, .rkey = 0xdeadbeef},
                           {.opcode = WrOpcode::kRdmaRead, .wrId = 2, .remoteAddr = 8, .rkey = 0},
                           {.opcode = WrOpcode::kRdmaWrite,
                            .wrId = 3,
                            .sges = {sgeOf(local, 0, 0)},
                            .remoteAddr = 0x1000,
                            .rkey = 0x77}}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 3, &completions));
  EXPECT_TRUE(succeeded(completions[0], 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(completions[1], 2, WcOpcode::kRdmaRead));
  EXPECT_TRUE(succeeded(completions[2], 3, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kRts, milliseconds(0)));
  EXPECT_TRUE(matchesPattern(bytesOf(local, 0, 4096), 76));
}

TEST_P(VerbsConformance, DeregisteredRegionIsNeverAccessedAgain) {
  for (WrOpcode opcode : {WrOpcode::kRdmaWrite, WrOpcode::kRdmaRead, WrOpcode::kAtomicFetchAndAdd}) {
    SCOPED_TRACE(std::to_string(static_cast<int>(opcode)));
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 77));
    ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(pair->b.pd, 4096, access::kAll, 78));
    const uint32_t rkey = target.mr.rkey();
    target.mr.close();  // the key was handed out; the memory stays allocated
    ASSERT_OK(post(pair->a.qp, {.opcode = opcode,
                                .wrId = 1,
                                .sges = {sgeOf(local, 0, 8)},
                                .remoteAddr = target.address(),
                                .rkey = rkey,
                                .compareAdd = 1}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr));
    EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 4096), 78));
    EXPECT_TRUE(matchesPattern(bytesOf(local, 0, 4096), 77));
  }
}

TEST_P(VerbsConformance, DeregistrationStopsARequestAlreadyPosted) {
  // The WRITE is queued behind a SEND that waits for a receive (RNR), so it is certainly not served
  // before the region is closed; once the receive comes, the WRITE reaches a closed region.
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = {.rnrRetries = 7, .minRnrTimer = 5}}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 79));
  ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(pair->b.pd, 8192, access::kAll, 80));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 81));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 64)}},
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 2,
                                  .sges = {sgeOf(src, 0, 4096)},
                                  .remoteAddr = target.address(),
                                  .rkey = target.mr.rkey()}}));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(50)));
  target.mr.close();
  ASSERT_OK(postReceive(pair->b.qp, 3, {sgeOf(inbox, 0, 4096)}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_TRUE(succeeded(completions[0], 1, WcOpcode::kSend));
  EXPECT_TRUE(failedWith(completions[1], 2, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 8192), 80));
}

TEST_P(VerbsConformance, ReregistrationRevokesOldKeysAndTakesEffectAtOnce) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kAll, 82));
  ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(pair->b.pd, 8192, access::kAll, 83));
  TestBuffer moved(8192);
  fillPattern(moved.bytes(), 84);
  WorkCompletion wc;

  // Same access, new keys: the old rkey is refused.
  const uint32_t oldRkey = target.mr.rkey();
  ASSERT_OK(target.mr.reregister(v::rereg::kChangeAccess, nullptr, target.data(), 8192, access::kAll));
  EXPECT_NE(target.mr.rkey(), oldRkey);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = target.address(),
                              .rkey = oldRkey}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 8192), 83));

  // The new key works.
  ASSERT_TRUE(resetAndReconnect(*pair, kShortTimeout));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = target.address(),
                              .rkey = target.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(target, 0, 64), bytesOf(src, 0, 64)));

  // Dropping REMOTE_WRITE: READ still works, WRITE is refused from the next request on.
  ASSERT_OK(target.mr.reregister(v::rereg::kChangeAccess, nullptr, target.data(), 8192,
                                 access::kLocalWrite | access::kRemoteRead));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kRdmaRead,
                                  .wrId = 3,
                                  .sges = {sgeOf(src, 4096, 64)},
                                  .remoteAddr = target.address(),
                                  .rkey = target.mr.rkey()},
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 4,
                                  .sges = {sgeOf(src, 0, 64)},
                                  .remoteAddr = target.address(1024),
                                  .rkey = target.mr.rkey()}}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_TRUE(succeeded(completions[0], 3, WcOpcode::kRdmaRead));
  EXPECT_TRUE(failedWith(completions[1], 4, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 1024, 1024), 83, 1024));

  // A new translation: the region now covers other memory; the old memory is left alone.
  ASSERT_OK(target.mr.reregister(v::rereg::kChangeTranslation | v::rereg::kChangeAccess, nullptr,
                                 moved.data(), 8192, access::kAll));
  EXPECT_EQ(target.mr.addr(), moved.data());
  ASSERT_TRUE(resetAndReconnect(*pair, kShortTimeout));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 5,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = moved.address(2048),
                              .rkey = target.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 5, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(moved, 2048, 4096), bytesOf(src, 0, 4096)));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 64, 8192 - 64), 83, 64)) << "the old translation";
}

// ============================ completion queues and events ============================

TEST_P(VerbsConformance, CqOverflowIsReportedAndPollFails) {
  Side a, b;
  ASSERT_OK(openSide(a, nullptr, 4));
  ASSERT_OK(openSide(b, nullptr, 64));
  const int capacity = a.sendCq.cqe();
  ASSERT_GE(capacity, 4);
  ASSERT_LE(capacity, 4096) << "this test needs a small CQ";
  QpOptions deep;
  deep.cap.maxSendWr = static_cast<uint32_t>(capacity) + 8;
  ASSERT_OK(createQp(a, deep));
  ASSERT_OK(createQp(b, {}));
  ASSERT_OK(connectQps(*a.context, a.qp, *b.context, b.qp));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kLocalWrite, 85));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(b.pd, 4096, access::kAll, 86));
  std::vector<SendOp> ops;
  for (int i = 0; i <= capacity; ++i) {
    ops.push_back({.opcode = WrOpcode::kRdmaWrite,
                   .wrId = static_cast<uint64_t>(i),
                   .sges = {sgeOf(src, 0, 8)},
                   .remoteAddr = dst.address(),
                   .rkey = dst.mr.rkey()});
  }
  ASSERT_OK(postAll(a.qp, ops));
  v::AsyncEvent event;
  ASSERT_TRUE(waitAsyncEvent(*a.context, v::AsyncEventType::kCqErr, &event));
  EXPECT_EQ(event.cqId, a.sendCq.id());
  WorkCompletion wc[8];
  Result<int> polled = a.sendCq.poll(wc);
  EXPECT_TRUE(hasCode(polled.status(), StatusCode::kIoError)) << "an overflowed CQ";
  if (!polled.isOk()) {
    EXPECT_EQ(polled.status().cause(), EOVERFLOW);
  }
}

TEST_P(VerbsConformance, CompletionChannelSignalsArmedCqs) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  // Replace A's CQs by ones bound to a channel before creating a new QP on them.
  ASSERT_OK_AND_ASSIGN(v::CompletionChannel channel, pair->a.context->createCompChannel());
  int sendTag = 1, recvTag = 2;
  Side a;
  a.context = pair->a.context;
  ASSERT_OK_AND_ASSIGN(a.pd, a.context->allocPd());
  ASSERT_OK_AND_ASSIGN(a.sendCq,
                       a.context->createCq({.cqe = 64, .channel = &channel, .userContext = &sendTag}));
  ASSERT_OK_AND_ASSIGN(a.recvCq,
                       a.context->createCq({.cqe = 64, .channel = &channel, .userContext = &recvTag}));
  ASSERT_OK(createQp(a, {}));
  Side& b = pair->b;
  ASSERT_OK_AND_ASSIGN(v::QueuePair qpB,
                       b.pd.createQp({.sendCq = &b.sendCq, .recvCq = &b.recvCq, .cap = QpOptions{}.cap}));
  ASSERT_OK(connectQps(*a.context, a.qp, *b.context, qpB));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kAll, 87));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(b.pd, 4096, access::kAll, 88));
  const int fd = channel.fd();
  ASSERT_GE(fd, 0);
  auto readable = [fd](int timeoutMs) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    return ::poll(&p, 1, timeoutMs) == 1 && (p.revents & POLLIN) != 0;
  };
  const SendOp write{.opcode = WrOpcode::kRdmaWrite,
                     .wrId = 1,
                     .sges = {sgeOf(src, 0, 64)},
                     .remoteAddr = dst.address(),
                     .rkey = dst.mr.rkey()};
  WorkCompletion wc;

  // Armed: the completion makes the fd readable and yields one event naming the CQ.
  ASSERT_OK(a.sendCq.reqNotify());
  EXPECT_FALSE(readable(0));
  ASSERT_OK(post(a.qp, write));
  ASSERT_TRUE(readable(static_cast<int>(kWaitTimeout.count())));
  ASSERT_OK_AND_ASSIGN(v::CqEvent event, channel.getEvent(0));
  EXPECT_EQ(event.cqId, a.sendCq.id());
  EXPECT_EQ(event.cqContext, &sendTag);
  ASSERT_TRUE(pollOne(a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  EXPECT_FALSE(readable(0)) << "the event was consumed";

  // Not armed: no event.
  ASSERT_OK(post(a.qp, write));
  ASSERT_TRUE(pollOne(a.sendCq, &wc));
  EXPECT_FALSE(readable(100));
  EXPECT_TRUE(hasCode(channel.getEvent(0).status(), StatusCode::kTimedOut));
  EXPECT_TRUE(hasCode(channel.getEvent(-1).status(), StatusCode::kInvalidArgument));

  // Solicited only: an ordinary SEND does not fire, a solicited one does.
  ASSERT_OK(postReceive(a.qp, 10, {sgeOf(src, 1024, 256)}));
  ASSERT_OK(postReceive(a.qp, 11, {sgeOf(src, 2048, 256)}));
  ASSERT_OK(a.recvCq.reqNotify(/*solicitedOnly=*/true));
  ASSERT_OK(post(qpB, {.opcode = WrOpcode::kSend, .wrId = 20, .sges = {sgeOf(dst, 0, 16)}}));
  ASSERT_TRUE(pollOne(a.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 10, WcOpcode::kRecv));
  EXPECT_FALSE(readable(100)) << "an unsolicited completion under solicited-only arming";
  ASSERT_OK(post(qpB, {.opcode = WrOpcode::kSend,
                       .wrId = 21,
                       .sges = {sgeOf(dst, 0, 16)},
                       .flags = send_flags::kSignaled | send_flags::kSolicited}));
  ASSERT_TRUE(readable(static_cast<int>(kWaitTimeout.count())));
  ASSERT_OK_AND_ASSIGN(event, channel.getEvent(0));
  EXPECT_EQ(event.cqId, a.recvCq.id());
  EXPECT_EQ(event.cqContext, &recvTag);
  ASSERT_TRUE(pollOne(a.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 11, WcOpcode::kRecv));
  std::vector<WorkCompletion> sent;
  ASSERT_TRUE(pollCompletions(b.sendCq, 2, &sent));

  // getEvent with a timeout waits that long and no longer.
  const auto start = Clock::now();
  EXPECT_TRUE(hasCode(channel.getEvent(50).status(), StatusCode::kTimedOut));
  EXPECT_GE(Clock::now() - start, milliseconds(40));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  // Even the shortest timeout is waited out, never cut short by rounding.
  for (int i = 0; i < 20; ++i) {
    const auto shortStart = Clock::now();
    EXPECT_TRUE(hasCode(channel.getEvent(1).status(), StatusCode::kTimedOut));
    EXPECT_GE(Clock::now() - shortStart, std::chrono::microseconds(1000)) << "getEvent(1) returned early";
  }
}

TEST_P(VerbsConformance, SharedReceiveQueueServesTwoQps) {
  Side a1, a2, b;
  ASSERT_OK(openSide(a1, nullptr, 64));
  ASSERT_OK(openSide(a2, a1.context, 64));
  ASSERT_OK(openSide(b, nullptr, 64));
  ASSERT_OK_AND_ASSIGN(v::SharedReceiveQueue srq, b.pd.createSrq({.maxWr = 64, .maxSge = 2}));
  ASSERT_OK_AND_ASSIGN(v::SrqInit srqAttr, srq.query());
  EXPECT_GE(srqAttr.maxWr, 64u);
  EXPECT_GE(srqAttr.maxSge, 2u);
  const v::QpCap cap = QpOptions{}.cap;
  ASSERT_OK_AND_ASSIGN(v::QueuePair b1,
                       b.pd.createQp({.sendCq = &b.sendCq, .recvCq = &b.recvCq, .srq = &srq, .cap = cap}));
  ASSERT_OK_AND_ASSIGN(v::QueuePair b2,
                       b.pd.createQp({.sendCq = &b.sendCq, .recvCq = &b.recvCq, .srq = &srq, .cap = cap}));
  ASSERT_OK(createQp(a1, {}));
  ASSERT_OK(createQp(a2, {}));
  ASSERT_OK(connectQps(*a1.context, a1.qp, *b.context, b1));
  ASSERT_OK(connectQps(*a2.context, a2.qp, *b.context, b2));
  ASSERT_OK_AND_ASSIGN(auto src1, registerBuffer(a1.pd, 4096, access::kLocalWrite, 89));
  ASSERT_OK_AND_ASSIGN(auto src2, registerBuffer(a2.pd, 4096, access::kLocalWrite, 90));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(b.pd, 4 * 4096, access::kLocalWrite, 91));

  std::vector<v::Sge> tooMany(srqAttr.maxSge + 1, sgeOf(inbox, 0, 8));
  EXPECT_TRUE(hasCode(postReceive(srq, 99, tooMany), StatusCode::kInvalidArgument, EINVAL));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_OK(postReceive(srq, i, {sgeOf(inbox, i * 4096, 4096)}));
  ASSERT_OK(srq.armLimit(3));

  auto receiveFrom = [&](v::QueuePair& qp, v::CompletionQueue& sendCq, const RegisteredBuffer& src,
                         const v::QueuePair& expectedQp) {
    ASSERT_OK(post(qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 1000)}}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(sendCq, &wc));
    EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kSend));
    ASSERT_TRUE(pollOne(b.recvCq, &wc));
    EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
    EXPECT_EQ(wc.opcode, WcOpcode::kRecv);
    EXPECT_EQ(wc.qpNum, expectedQp.qpNum());
    EXPECT_EQ(wc.byteLen, 1000u);
    ASSERT_LT(wc.wrId, 4u);
    EXPECT_TRUE(bytesEqual(bytesOf(inbox, wc.wrId * 4096, 1000), bytesOf(src, 0, 1000)));
  };
  receiveFrom(a1.qp, a1.sendCq, src1, b1);
  // Three receives remain: not below the limit of 3 yet.
  Result<v::AsyncEvent> early = b.context->getAsyncEvent(100);
  EXPECT_FALSE(early.isOk() && early->type == v::AsyncEventType::kSrqLimitReached)
      << "limit event with 3 receives left and a limit of 3";
  receiveFrom(a2.qp, a2.sendCq, src2, b2);
  v::AsyncEvent event;
  ASSERT_TRUE(waitAsyncEvent(*b.context, v::AsyncEventType::kSrqLimitReached, &event));
  EXPECT_EQ(event.srqId, srq.id());
}

// ============================ recovery and lifetime ============================

TEST_P(VerbsConformance, ResetAndReconnectRecoversAfterAnError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 * kMiB, access::kLocalWrite, 92));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 * kMiB, access::kAll, 93));
  WorkCompletion wc;
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = dst.address(),
                              .rkey = corruptKey(dst.mr.rkey())}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr));
  ASSERT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  ASSERT_TRUE(reachesState(pair->b.qp, QpState::kErr));

  ASSERT_TRUE(resetAndReconnect(*pair));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kRts, milliseconds(0)));
  EXPECT_TRUE(reachesState(pair->b.qp, QpState::kRts, milliseconds(0)));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 1 * kMiB)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 1 * kMiB), bytesOf(src, 0, 1 * kMiB)));

  // RESET from RTS drops queued receives without completing them.
  ASSERT_OK(postReceive(pair->b.qp, 70, {sgeOf(dst, 0, 4096)}));
  ASSERT_TRUE(resetAndReconnect(*pair));
  ASSERT_OK(postReceive(pair->b.qp, 71, {sgeOf(dst, 4096, 4096)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 0, 100)}}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 71, WcOpcode::kRecv)) << "the receive posted before RESET is gone";
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 4096, 100), bytesOf(src, 0, 100)));
}

TEST_P(VerbsConformance, QpsOfOneContextTalkToEachOther) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.sameContext = true}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 256 * kKiB, access::kAll, 94));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 256 * kKiB, access::kAll, 95));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 128 * kKiB, 64 * kKiB)}));
  ASSERT_OK(postAll(pair->a.qp,
                    {{.opcode = WrOpcode::kRdmaWrite,
                      .wrId = 1,
                      .sges = {sgeOf(src, 0, 64 * kKiB)},
                      .remoteAddr = dst.address(),
                      .rkey = dst.mr.rkey()},
                     {.opcode = WrOpcode::kRdmaRead,
                      .wrId = 2,
                      .sges = {sgeOf(src, 64 * kKiB, 64 * kKiB)},
                      .remoteAddr = dst.address(64 * kKiB),
                      .rkey = dst.mr.rkey()},
                     {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 192 * kKiB, 64 * kKiB)}}}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 3, &completions));
  EXPECT_TRUE(succeeded(completions[0], 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(completions[1], 2, WcOpcode::kRdmaRead));
  EXPECT_TRUE(succeeded(completions[2], 3, WcOpcode::kSend));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 64 * kKiB), bytesOf(src, 0, 64 * kKiB)));
  EXPECT_TRUE(bytesEqual(bytesOf(src, 64 * kKiB, 64 * kKiB), bytesOf(dst, 64 * kKiB, 64 * kKiB)));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 128 * kKiB, 64 * kKiB), bytesOf(src, 192 * kKiB, 64 * kKiB)));
}

TEST_P(VerbsConformance, ClosingAContextClosesItsChildren) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto buffer, registerBuffer(pair->a.pd, 4096, access::kAll, 96));
  ASSERT_OK(postReceive(pair->a.qp, 1, {sgeOf(buffer, 0, 64)}));
  pair->a.ownContext.close();
  auto closed = [](const Status& status) { return hasCode(status, StatusCode::kClosed); };
  TestBuffer other(4096);
  EXPECT_TRUE(closed(pair->a.pd.registerMemory(other.data(), 4096, access::kLocalWrite).status()));
  EXPECT_TRUE(closed(
      pair->a.pd.createQp({.sendCq = &pair->a.sendCq, .recvCq = &pair->a.recvCq, .cap = QpOptions{}.cap})
          .status()));
  EXPECT_TRUE(closed(pair->a.pd.createSrq({.maxWr = 4}).status()));
  EXPECT_TRUE(
      closed(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(buffer, 0, 8)}})));
  EXPECT_TRUE(closed(postReceive(pair->a.qp, 3, {sgeOf(buffer, 0, 8)})));
  EXPECT_TRUE(closed(pair->a.qp.query().status()));
  v::QpAttr attr;
  attr.state = QpState::kErr;
  EXPECT_TRUE(closed(pair->a.qp.modify(attr, v::qp_attr_mask::kState)));
  WorkCompletion wc;
  EXPECT_TRUE(closed(pair->a.sendCq.poll(std::span<WorkCompletion>(&wc, 1)).status()));
  EXPECT_TRUE(closed(pair->a.sendCq.reqNotify()));
  EXPECT_TRUE(
      closed(buffer.mr.reregister(v::rereg::kChangeAccess, nullptr, buffer.data(), 4096, access::kAll)));
  EXPECT_TRUE(closed(pair->a.context->queryDevice().status()));
  EXPECT_TRUE(closed(pair->a.context->allocPd().status()));
  // Closing again, through any handle, is harmless.
  buffer.mr.close();
  pair->a.qp.close();
  pair->a.qp.close();
  pair->a.pd.close();
  pair->a.ownContext.close();
  // The other context is unaffected.
  EXPECT_OK(pair->b.context->queryDevice());
  EXPECT_OK(pair->b.qp.query());
}

TEST_P(VerbsConformance, EmptyAndMovedFromHandlesReturnClosed) {
  auto closed = [](const Status& status) { return hasCode(status, StatusCode::kClosed); };
  v::Context context;
  EXPECT_FALSE(context.valid());
  EXPECT_TRUE(closed(context.queryDevice().status()));
  EXPECT_TRUE(closed(context.allocPd().status()));
  EXPECT_TRUE(closed(context.createCq({.cqe = 4}).status()));
  v::QueuePair qp;
  EXPECT_TRUE(closed(qp.query().status()));
  EXPECT_TRUE(closed(post(qp, {.opcode = WrOpcode::kSend})));
  v::CompletionQueue cq;
  WorkCompletion wc;
  EXPECT_TRUE(closed(cq.poll(std::span<WorkCompletion>(&wc, 1)).status()));
  v::MemoryRegion mr;
  EXPECT_TRUE(closed(mr.reregister(v::rereg::kChangeAccess, nullptr, nullptr, 0, 0)));
  v::CompletionChannel channel;
  EXPECT_TRUE(closed(channel.getEvent(0).status()));

  ASSERT_OK_AND_ASSIGN(v::Context opened, openContext());
  v::Context movedTo = std::move(opened);
  EXPECT_TRUE(closed(opened.queryDevice().status()));  // NOLINT(bugprone-use-after-move)
  EXPECT_OK(movedTo.queryDevice());
  ASSERT_OK_AND_ASSIGN(v::ProtectionDomain pd, movedTo.allocPd());
  ASSERT_OK_AND_ASSIGN(v::CompletionQueue pdCq, movedTo.createCq({.cqe = 16}));
  ASSERT_OK_AND_ASSIGN(v::QueuePair pdQp,
                       pd.createQp({.sendCq = &pdCq, .recvCq = &pdCq, .cap = QpOptions{}.cap}));
  pd.close();
  pd.close();
  TestBuffer memory(4096);
  EXPECT_TRUE(closed(pd.registerMemory(memory.data(), 4096, 0).status()));
  EXPECT_TRUE(closed(pdQp.query().status())) << "closing a PD closes its QPs";
}

TEST_P(VerbsConformance, PostingToAQpWhoseCqIsClosedIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 97));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 98));
  pair->a.sendCq.close();
  const Status status = post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                          .wrId = 1,
                                          .sges = {sgeOf(src, 0, 64)},
                                          .remoteAddr = dst.address(),
                                          .rkey = dst.mr.rkey()});
  EXPECT_FALSE(status.isOk()) << "a request whose completion has nowhere to go";
  EXPECT_TRUE(status.code() == StatusCode::kClosed || status.code() == StatusCode::kInvalidArgument)
      << status.toString();
  // The QP can still be queried and closed, and the peer is unaffected.
  EXPECT_TRUE(pair->a.qp.query().isOk() || pair->a.qp.query().status().code() == StatusCode::kClosed);
  EXPECT_OK(pair->b.qp.query());
  pair->a.qp.close();
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 98));
}

TEST_P(VerbsConformance, IdleConnectionsCostNoCpu) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto pair2, makePair({.sameContext = true}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 99));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 100));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 1,
                              .sges = {sgeOf(src, 0, 64)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  // Receives posted and waiting are idle too.
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 64)}));
  auto cpuSeconds = [] {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  };
  const double before = cpuSeconds();
  std::this_thread::sleep_for(milliseconds(500));
  const double used = cpuSeconds() - before;
  EXPECT_LT(used, 0.05) << "three idle contexts used " << used * 1000 << " ms of CPU in 500 ms";
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Providers, VerbsConformance, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

}  // namespace ferry::test
