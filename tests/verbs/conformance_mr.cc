// Memory regions: registration and its access checks, allocMr, zero-length requests and keys,
// deregistration and reregistration (old keys revoked, new access and translation at once).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

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
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(pair->a,
                            {.opcode = WrOpcode::kRdmaWrite,
                             .wrId = i,
                             .sges = {src.sge(i * 3000, 3000)},
                             .remoteAddr = dstAddr + i * 3000,
                             .rkey = dst.rkey()},
                            &wc));
    EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  }
  EXPECT_TRUE(std::equal(srcBytes.begin(), srcBytes.begin() + 9000, dstBytes.begin()));
  fillPattern(dstBytes, 62);
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaRead,
                           .wrId = 9,
                           .sges = {src.sge(0, 10000)},
                           .remoteAddr = dstAddr,
                           .rkey = dst.rkey()},
                          &wc));
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
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(pair->a,
                            {.opcode = opcode,
                             .wrId = 1,
                             .sges = {sgeOf(local, 0, 8)},
                             .remoteAddr = target.address(),
                             .rkey = rkey,
                             .compareAdd = 1},
                            &wc));
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
                                 rdmaRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 4096), target)}));
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
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 1,
                           .sges = {sgeOf(src, 0, 64)},
                           .remoteAddr = target.address(),
                           .rkey = oldRkey},
                          &wc));
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 8192), 83));

  // The new key works.
  ASSERT_TRUE(resetAndReconnect(*pair, kShortTimeout));
  ASSERT_TRUE(postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 64), target), &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(target, 0, 64), bytesOf(src, 0, 64)));

  // Dropping REMOTE_WRITE: READ still works, WRITE is refused from the next request on.
  ASSERT_OK(target.mr.reregister(v::rereg::kChangeAccess, nullptr, target.data(), 8192,
                                 access::kLocalWrite | access::kRemoteRead));
  ASSERT_OK(postAll(pair->a.qp, {rdmaRequest(WrOpcode::kRdmaRead, 3, sgeOf(src, 4096, 64), target),
                                 rdmaRequest(WrOpcode::kRdmaWrite, 4, sgeOf(src, 0, 64), target, 1024)}));
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
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 5,
                           .sges = {sgeOf(src, 0, 4096)},
                           .remoteAddr = moved.address(2048),
                           .rkey = target.mr.rkey()},
                          &wc));
  EXPECT_TRUE(succeeded(wc, 5, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(moved, 2048, 4096), bytesOf(src, 0, 4096)));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 64, 8192 - 64), 83, 64)) << "the old translation";
}

}  // namespace
}  // namespace ferry::test
