// A peer that goes away: its context closed before or during a transfer, or never reached; the
// requester gets RETRY_EXC_ERR within kPeerLossBound and its later requests are flushed.
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

TEST_P(VerbsConformance, ClosedPeerContextGivesRetryExceeded) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 71));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 72));
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 1024), dst), &wc));
  ASSERT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));

  pair->b.ownContext.close();
  const auto start = Clock::now();
  ASSERT_OK(postAll(pair->a.qp, {rdmaRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 1024), dst, 4096),
                                 rdmaRequest(WrOpcode::kRdmaWrite, 3, sgeOf(src, 0, 1024), dst, 4096)}));
  ASSERT_NO_FATAL_FAILURE(expectFailedThenFlushed(
      pair->a, start, {.failedId = 2, .status = WcStatus::kRetryExcErr, .flushedId = 3}));
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
    ops.push_back(rdmaRequest(WrOpcode::kRdmaWrite, id, sgeOf(src, 0, kChunk), dst));
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
    WorkCompletion wc;
    ASSERT_TRUE(
        postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, kCount + 1, sgeOf(src, 0, kChunk), dst), &wc));
    EXPECT_TRUE(failedWith(wc, kCount + 1, WcStatus::kRetryExcErr));
    return;
  }
  EXPECT_TRUE(failedWith(completions[i], i + 1, WcStatus::kRetryExcErr));
  for (++i; i < kCount; ++i) EXPECT_TRUE(failedWith(completions[i], i + 1, WcStatus::kWrFlushErr));
}

TEST_P(VerbsConformance, UnreachablePeerGivesRetryExceeded) {
  Side a, b;
  v::Path localA, localB;
  ASSERT_OK(openUnconnected(a, b, &localA, &localB));
  ASSERT_OK_AND_ASSIGN(v::Path pathA, pathTowardsPeer(*a.context, a.qp, localA, localB, kShortTimeout));
  // The peer disappears before A ever reaches it: nothing listens at its address any more.
  b.ownContext.close();
  ASSERT_OK(a.qp.establish(pathA, kRemoteAccess));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kLocalWrite, 75));
  const auto start = Clock::now();
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 1,
                           .sges = {sgeOf(src, 0, 64)},
                           .remoteAddr = 0x10000,
                           .rkey = 0x1234},
                          &wc));
  EXPECT_LT(Clock::now() - start, kPeerLossBound);
  EXPECT_TRUE(failedWith(wc, 1, WcStatus::kRetryExcErr));
  EXPECT_TRUE(reachesState(a.qp, QpState::kErr));
}

}  // namespace
}  // namespace ferry::test
