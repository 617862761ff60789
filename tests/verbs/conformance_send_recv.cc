// Two-sided messages: SEND and SEND_WITH_IMM into posted receives, a receiver not ready (RNR
// waits and runs out), and a shared receive queue serving two QPs with its limit event.
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

TEST_P(VerbsConformance, SendIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kLargest + 64, access::kLocalWrite, 15));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kLargest + 128, access::kLocalWrite, 16));
  ASSERT_NO_FATAL_FAILURE(forEachSize(*pair->a.context, dst, 3000, [&](const SweepStep& step) {
    ASSERT_OK(postReceive(pair->b.qp, 500 + step.wrId, {sgeOf(dst, kDstOffset, step.size + kGuard)}));
    std::vector<v::Sge> sges;
    if (step.size > 0) sges.push_back(sgeOf(src, kSrcOffset, step.size));
    ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = step.wrId, .sges = sges}));
    WorkCompletion wc;
    ASSERT_NO_FATAL_FAILURE(expectDelivered(*pair, {.sendId = step.wrId, .recvId = 500 + step.wrId}, &wc));
    EXPECT_EQ(wc.byteLen, step.size);
    EXPECT_EQ(wc.qpNum, pair->b.qp.qpNum());
    EXPECT_EQ(wc.wcFlags & v::wc_flags::kWithImm, 0u);
    EXPECT_TRUE(placedWithGuards(dst, bytesOf(src, kSrcOffset, step.size), step.size, step.seed));
  }));
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
  ASSERT_NO_FATAL_FAILURE(expectDelivered(*pair, {.sendId = 2, .recvId = 1}, &wc));
  EXPECT_EQ(wc.byteLen, 100u);
  EXPECT_NE(wc.wcFlags & v::wc_flags::kWithImm, 0u);
  EXPECT_EQ(wc.immData, 0x12345678u);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 100), bytesOf(src, 0, 100)));
}

TEST_P(VerbsConformance, SendWaitsForALateReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = {.rnrRetries = 7, .minRnrTimer = 1}}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 53));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kLocalWrite, 54));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 4096)}}));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(200))) << "no receive is posted yet";
  ASSERT_OK(postReceive(pair->b.qp, 2, {sgeOf(dst, 0, 8192)}));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(expectDelivered(*pair, {.sendId = 1, .recvId = 2}, &wc));
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
    ASSERT_OK(postAll(pair->a.qp, {rdmaRequest(opcode, 1, sgeOf(src, 0, 64), dst),
                                   rdmaRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 64), dst, 1024)}));
    ASSERT_NO_FATAL_FAILURE(expectFailedThenFlushed(
        pair->a, start, {.failedId = 1, .status = WcStatus::kRnrRetryExcErr, .flushedId = 2}));
    EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024, 64), 56, 1024)) << "flushed WRITE was not carried out";
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

}  // namespace
}  // namespace ferry::test
