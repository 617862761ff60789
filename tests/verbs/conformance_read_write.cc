// One-sided operations: RDMA WRITE and READ byte-exact for every size, and WRITE_WITH_IMM,
// which also consumes a receive.
#include "verbs/conformance.h"

namespace ferry::test {
namespace {

TEST_P(VerbsConformance, WriteIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kLargest + 64, access::kLocalWrite, 11));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kLargest + 128, access::kAll, 12));
  ASSERT_NO_FATAL_FAILURE(forEachSize(*pair->a.context, dst, 1000, [&](const SweepStep& step) {
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(
        pair->a,
        rdmaRequest(WrOpcode::kRdmaWrite, step.wrId, sgeOf(src, kSrcOffset, step.size), dst, kDstOffset),
        &wc));
    EXPECT_TRUE(succeeded(wc, step.wrId, WcOpcode::kRdmaWrite));
    EXPECT_TRUE(placedWithGuards(dst, bytesOf(src, kSrcOffset, step.size), step.size, step.seed));
  }));
  EXPECT_TRUE(noCompletionFor(pair->b.recvCq, milliseconds(1))) << "a plain WRITE consumes no receive";
}

TEST_P(VerbsConformance, ReadIsByteExactForEverySize) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kLargest + 64, access::kAll, 13));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kLargest + 128, access::kLocalWrite, 14));
  ASSERT_NO_FATAL_FAILURE(forEachSize(*pair->a.context, local, 2000, [&](const SweepStep& step) {
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(
        pair->a,
        rdmaRequest(WrOpcode::kRdmaRead, step.wrId, sgeOf(local, kDstOffset, step.size), remote, kSrcOffset),
        &wc));
    EXPECT_TRUE(succeeded(wc, step.wrId, WcOpcode::kRdmaRead));
    EXPECT_EQ(wc.byteLen, step.size) << "a READ completion reports the bytes read";
    EXPECT_TRUE(placedWithGuards(local, bytesOf(remote, kSrcOffset, step.size), step.size, step.seed));
  }));
}

TEST_P(VerbsConformance, WriteWithImmediateConsumesAReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 19));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 20));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 21));
  ASSERT_OK(postReceive(pair->b.qp, 7, {sgeOf(inbox, 0, 256)}));
  SendOp writeWithImm = rdmaRequest(WrOpcode::kRdmaWriteWithImm, 1, sgeOf(src, 0, 4096), dst, 128);
  writeWithImm.imm = 0xa1b2c3d4;
  ASSERT_OK(post(pair->a.qp, writeWithImm));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(expectDelivered(
      *pair, {.sendId = 1, .sent = WcOpcode::kRdmaWrite, .recvId = 7, .received = WcOpcode::kRecvRdmaWithImm},
      &wc));
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
  ASSERT_NO_FATAL_FAILURE(expectDelivered(
      *pair, {.sendId = 2, .sent = WcOpcode::kRdmaWrite, .recvId = 8, .received = WcOpcode::kRecvRdmaWithImm},
      &wc));
  EXPECT_EQ(wc.byteLen, 0u);
  EXPECT_EQ(wc.immData, 42u);
}

}  // namespace
}  // namespace ferry::test
