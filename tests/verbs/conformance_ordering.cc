// Ordering on one QP: WRITEs placed before a later SEND arrives, a READ sees an earlier WRITE,
// and completions come in post order across every opcode.
#include <iterator>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

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
                                 rdmaRequest(WrOpcode::kRdmaRead, 2, sgeOf(back, 0, 4 * kMiB), dst)}));
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

}  // namespace
}  // namespace ferry::test
