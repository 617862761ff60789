// One-sided operations: RDMA WRITE and READ byte-exact for every size, and WRITE_WITH_IMM,
// which also consumes a receive.
#include <string>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

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

}  // namespace
}  // namespace ferry::test
