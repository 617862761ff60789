// Atomics: compare-and-swap and fetch-and-add return the original value, a misaligned one is
// refused at post, and fetch-and-adds from two QPs on one counter sum exactly.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

uint64_t load64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);
  return value;
}
void store64(uint8_t* p, uint64_t value) { std::memcpy(p, &value, 8); }

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
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(pair->a,
                            {.opcode = step.opcode,
                             .wrId = ++wrId,
                             .sges = {sgeOf(result, 16, 8)},
                             .remoteAddr = target.address(8),
                             .rkey = target.mr.rkey(),
                             .compareAdd = step.compareAdd,
                             .swap = step.swap},
                            &wc));
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
  SendOp misaligned = rdmaRequest(WrOpcode::kAtomicFetchAndAdd, 1, sgeOf(result, 0, 8), target, 4);
  misaligned.compareAdd = 1;
  EXPECT_TRUE(hasCode(post(pair->a.qp, misaligned), StatusCode::kInvalidArgument, EINVAL));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, std::chrono::milliseconds(50)));
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, 64), 24));
  EXPECT_TRUE(matchesPattern(bytesOf(result, 0, 64), 25));
  SendOp aligned = rdmaRequest(WrOpcode::kAtomicFetchAndAdd, 2, sgeOf(result, 0, 8), target, 8);
  aligned.compareAdd = 1;
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a, aligned, &wc));
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

}  // namespace
}  // namespace ferry::test
