// A QP's stripe (FERRY_SOFT_TCP_STRIPE, stripe.h): large WRITEs and READs share their bytes with a second
// connection, yet every rule of the QP holds as on one connection. WRITEs land whole and in post
// order (a later WRITE's bytes over an earlier one's where they overlap), a SEND after them finds
// them in place, a WRITE refused by the responder fails as on one connection and its half on the
// stripe lands nowhere, and the stripe's bytes are counted where they land, so the test knows the stripe
// carried them (and that the responder's stripe thread placed them). WRITEs clear of a half still on
// the stripe go on meanwhile, but nothing is acknowledged, and nothing refused, before that half has
// landed; a region deregistered while halves are on their way fails the WRITE and takes no byte
// after. READs come back whole in two parts, see the WRITEs before them, fail as on one connection
// when refused or when a region goes, and take no byte after their completion. The suite's other
// tests run over the stripe too, on the soft_tcp_stripe path.
#include "providers/soft/stripe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "providers/soft/soft.h"
#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;

class StripePath : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    if (providerPath().name != "soft_tcp_stripe") GTEST_SKIP() << "stripes run on the soft_tcp_stripe path";
  }
};

// A striped WRITE's first half goes once the stripe is up: wait for the first WRITE whose bytes the
// stripe carried (the stripe connects just after the QP's own connection).
::testing::AssertionResult stripeCarries(ConnectedPair& pair, RegisteredBuffer& src, RegisteredBuffer& dst) {
  const auto deadline = Clock::now() + kWaitTimeout;
  uint64_t id = 1000;
  while (Clock::now() < deadline) {
    const uint64_t before = soft::stripeBytesPlaced();
    Status st = post(pair.a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                                 .wrId = ++id,
                                 .sges = {sgeOf(src, 0, 8192)},
                                 .remoteAddr = dst.address(),
                                 .rkey = dst.mr.rkey()});
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
    v::WorkCompletion wc;
    if (!pollOne(pair.a.sendCq, &wc) || wc.status != v::WcStatus::kSuccess) {
      return ::testing::AssertionFailure() << "a WRITE failed: " << describe(wc);
    }
    if (soft::stripeBytesPlaced() > before) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no WRITE went over the stripe";
}

TEST_P(StripePath, WritesLandWholeAndInPostOrderAndASendAfterThemFindsThem) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  constexpr size_t kSize = 4 << 20;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 1));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kSize, v::access::kAll, 2));
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, v::access::kLocalWrite, 3));
  ASSERT_TRUE(stripeCarries(*pair, src, dst));

  // Three WRITEs, each over the one before: [0, 4 MiB) from pattern 11, [1 MiB, 3 MiB) from
  // pattern 12, [1.5 MiB, 2.5 MiB) + 5 bytes from pattern 13; then a SEND.
  RegisteredBuffer* bufs[3] = {nullptr, nullptr, nullptr};
  std::vector<RegisteredBuffer> sources;
  for (uint64_t seed : {11, 12, 13}) {
    ASSERT_OK_AND_ASSIGN(auto b, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, seed));
    sources.push_back(std::move(b));
  }
  for (int i = 0; i < 3; ++i) bufs[i] = &sources[i];
  const size_t offsets[3] = {0, 1 << 20, 3 << 19};
  const size_t lengths[3] = {kSize, 2 << 20, (1 << 20) + 5};
  ASSERT_OK(postReceive(pair->b.qp, 20, {sgeOf(inbox, 0, 4096)}));
  const uint64_t placedBefore = soft::stripeBytesPlaced();
  const uint64_t byStripeThreadBefore = soft::stripeBytesPlacedByStripeThread();
  std::vector<SendOp> ops;
  for (int i = 0; i < 3; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = static_cast<uint64_t>(i + 1),
                   .sges = {sgeOf(*bufs[i], offsets[i], static_cast<uint32_t>(lengths[i]))},
                   .remoteAddr = dst.address(offsets[i]),
                   .rkey = dst.mr.rkey()});
  }
  ops.push_back({.opcode = v::WrOpcode::kSend, .wrId = 4, .sges = {sgeOf(src, 0, 64)}});
  ASSERT_OK(postAll(pair->a.qp, ops));
  // When the SEND's receive completes, every WRITE before it has landed.
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  ASSERT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
  std::vector<uint8_t> expected(kSize);
  for (int i = 0; i < 3; ++i) {
    std::memcpy(expected.data() + offsets[i], bufs[i]->data() + offsets[i], lengths[i]);
  }
  EXPECT_TRUE(bytesEqual(bytesOf(dst), expected));
  std::vector<v::WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &completions));
  for (size_t i = 0; i < completions.size(); ++i) {
    EXPECT_EQ(completions[i].wrId, i + 1);
    EXPECT_EQ(completions[i].status, v::WcStatus::kSuccess) << describe(completions[i]);
  }
  // Each WRITE's second half (from its 4 KiB boundary below the middle) came over the stripe.
  uint64_t striped = 0;
  for (size_t len : lengths) striped += len - ((len / 2) & ~size_t{0xfff});
  EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, striped);
  // The responder's stripe thread read the stripe and placed them, not its progress thread (which
  // read the QP's own connection meanwhile).
  EXPECT_EQ(soft::stripeBytesPlacedByStripeThread() - byStripeThreadBefore, striped);
}

TEST_P(StripePath, ARefusedWriteFailsAsOnOneConnectionAndItsStripeHalfLandsNowhere) {
  constexpr size_t kSize = 1 << 20;
  // A region without remote write; then, on a fresh pair, a range one byte past a region's end.
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE(attempt == 0 ? "no remote write" : "past the end");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 30));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kSize, v::access::kAll, 31));
    ASSERT_OK_AND_ASSIGN(
        auto target,
        registerBuffer(pair->b.pd, kSize,
                       attempt == 0 ? v::access::kLocalWrite | v::access::kRemoteRead : v::access::kAll, 32));
    ASSERT_TRUE(stripeCarries(*pair, src, dst));
    fillPattern(src.memory.bytes(), 33);
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    const uint64_t at = attempt == 0 ? target.address() : target.address(4097);
    ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                                .wrId = 1,
                                .sges = {sgeOf(src, 0, kSize - 4096)},
                                .remoteAddr = at,
                                .rkey = target.mr.rkey()}));
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_EQ(wc.wrId, 1u);
    EXPECT_EQ(wc.status, v::WcStatus::kRemAccessErr) << describe(wc);
    EXPECT_TRUE(matchesPattern(bytesOf(target), 32)) << "not a byte of either half landed";
    EXPECT_EQ(soft::stripeBytesPlaced(), placedBefore);
  }
}

// WRITEs clear of an earlier WRITE's half still on the stripe are carried out meanwhile, yet none is
// acknowledged before that half landed: when a WRITE's completion is seen, all of its bytes, both
// halves, are in place, whatever came after it.
TEST_P(StripePath, AWriteCompletesOnlyOnceBothHalvesLandedWhateverPassedIt) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  constexpr size_t kSize = 4 << 20;
  constexpr size_t kSmall = 4096;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize + 8 * kSmall, v::access::kLocalWrite, 40));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kSize + 8 * kSmall, v::access::kAll, 41));
  ASSERT_TRUE(stripeCarries(*pair, src, dst));
  for (int round = 0; round < 16; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    fillPattern(src.memory.bytes(), 50 + round);
    std::vector<SendOp> ops;
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 1,
                   .sges = {sgeOf(src, 0, kSize)},
                   .remoteAddr = dst.address(),
                   .rkey = dst.mr.rkey()});
    for (size_t i = 0; i < 8; ++i) {  // small WRITEs past its end: clear of its stripe half
      ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                     .wrId = 2 + i,
                     .sges = {sgeOf(src, kSize + i * kSmall, kSmall)},
                     .remoteAddr = dst.address(kSize + i * kSmall),
                     .rkey = dst.mr.rkey()});
    }
    ASSERT_OK(postAll(pair->a.qp, ops));
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    ASSERT_EQ(wc.wrId, 1u);
    ASSERT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
    // Read at once: the large WRITE completed, so both its halves are there.
    EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, kSize), bytesOf(src, 0, kSize)));
    std::vector<v::WorkCompletion> rest;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 8, &rest));
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].wrId, 2 + i);
      EXPECT_EQ(rest[i].status, v::WcStatus::kSuccess) << describe(rest[i]);
    }
    EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  }
}

// A request refused while earlier WRITEs still have halves on the stripe: those WRITEs complete
// whole (the refusal acknowledges everything before it), the refused one fails, and what was
// posted after it is flushed.
TEST_P(StripePath, ARefusalBehindHalvesStillOnTheStripeWaitsForThem) {
  constexpr size_t kSize = 2 << 20;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 2 * kSize, v::access::kLocalWrite, 60));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 2 * kSize, v::access::kAll, 61));
  ASSERT_OK_AND_ASSIGN(auto closed, registerBuffer(pair->b.pd, kSize, v::access::kLocalWrite, 62));
  ASSERT_TRUE(stripeCarries(*pair, src, dst));
  fillPattern(src.memory.bytes(), 63);
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 2; ++i) {
    ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                   .wrId = 1 + i,
                   .sges = {sgeOf(src, i * kSize, kSize)},
                   .remoteAddr = dst.address(i * kSize),
                   .rkey = dst.mr.rkey()});
  }
  ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                 .wrId = 3,
                 .sges = {sgeOf(src, 0, 4096)},
                 .remoteAddr = closed.address(),
                 .rkey = closed.mr.rkey()});
  ops.push_back({.opcode = v::WrOpcode::kRdmaWrite,
                 .wrId = 4,
                 .sges = {sgeOf(src, 0, 4096)},
                 .remoteAddr = dst.address(),
                 .rkey = dst.mr.rkey()});
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<v::WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &completions));
  const v::WcStatus expected[4] = {v::WcStatus::kSuccess, v::WcStatus::kSuccess, v::WcStatus::kRemAccessErr,
                                   v::WcStatus::kWrFlushErr};
  for (size_t i = 0; i < completions.size(); ++i) {
    EXPECT_EQ(completions[i].wrId, i + 1);
    EXPECT_EQ(completions[i].status, expected[i]) << describe(completions[i]);
  }
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  EXPECT_TRUE(matchesPattern(bytesOf(closed), 62));
}

// Regions that go while a striped WRITE's halves are on their way. Whenever the deregistration falls
// (before the WRITE arrives, while its halves land, after), the WRITE either completes whole or
// fails, and once the deregistration has returned not a byte more lands in the region.
constexpr size_t kDeregisteredSize = 32 << 20;
constexpr int kDeregisterAfterUs[] = {0, 500, 1000, 2000, 4000};

// Posts a WRITE (or READ) of all of `local` to (from) `remote` on `qp`, runs `act` after `delayUs`,
// and waits for the request's completion on `cq`.
::testing::AssertionResult transferOn(v::QueuePair& qp, v::CompletionQueue& cq, v::WrOpcode opcode,
                                      RegisteredBuffer& local, RegisteredBuffer& remote, int delayUs,
                                      const std::function<void()>& act, v::WorkCompletion* wc) {
  Status st = post(qp, {.opcode = opcode,
                        .wrId = 1,
                        .sges = {sgeOf(local, 0, static_cast<uint32_t>(local.size()))},
                        .remoteAddr = remote.address(),
                        .rkey = remote.mr.rkey()});
  if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
  std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
  act();
  if (!pollOne(cq, wc)) return ::testing::AssertionFailure() << "the request never completed";
  if (wc->wrId != 1)
    return ::testing::AssertionFailure() << "not the request's completion: " << describe(*wc);
  return ::testing::AssertionSuccess();
}

// The same from a to b of `pair`.
::testing::AssertionResult transferWhile(ConnectedPair& pair, v::WrOpcode opcode, RegisteredBuffer& local,
                                         RegisteredBuffer& remote, int delayUs,
                                         const std::function<void()>& act, v::WorkCompletion* wc) {
  return transferOn(pair.a.qp, pair.a.sendCq, opcode, local, remote, delayUs, act, wc);
}

TEST_P(StripePath, ATargetDeregisteredWhileHalvesLandTakesNoByteAfterwards) {
  for (int delayUs : kDeregisterAfterUs) {
    SCOPED_TRACE("deregistered after " + std::to_string(delayUs) + " us");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kDeregisteredSize, v::access::kLocalWrite, 70));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kDeregisteredSize, v::access::kAll, 71));
    ASSERT_TRUE(stripeCarries(*pair, src, dst));
    fillPattern(src.memory.bytes(), 72);
    std::vector<uint8_t> atClose;
    v::WorkCompletion wc;
    ASSERT_TRUE(transferWhile(
        *pair, v::WrOpcode::kRdmaWrite, src, dst, delayUs,
        [&] {
          dst.mr.close();  // the memory stays allocated
          atClose.assign(bytesOf(dst).begin(), bytesOf(dst).end());
        },
        &wc));
    ASSERT_TRUE(wc.status == v::WcStatus::kSuccess || wc.status == v::WcStatus::kRemAccessErr)
        << describe(wc);
    if (wc.status == v::WcStatus::kSuccess) {
      EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
    }
    EXPECT_TRUE(bytesEqual(bytesOf(dst), atClose)) << "bytes landed after the region was deregistered";
  }
}

TEST_P(StripePath, ASourceDeregisteredWhileItsHalvesAreSentFailsTheWriteOrSendsItWhole) {
  for (int delayUs : kDeregisterAfterUs) {
    SCOPED_TRACE("deregistered after " + std::to_string(delayUs) + " us");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto probe, registerBuffer(pair->a.pd, 8192, v::access::kLocalWrite, 80));
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kDeregisteredSize, v::access::kLocalWrite, 81));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kDeregisteredSize, v::access::kAll, 82));
    ASSERT_TRUE(stripeCarries(*pair, probe, dst));
    v::WorkCompletion wc;
    ASSERT_TRUE(transferWhile(
        *pair, v::WrOpcode::kRdmaWrite, src, dst, delayUs, [&] { src.mr.close(); }, &wc));
    ASSERT_TRUE(wc.status == v::WcStatus::kSuccess || wc.status == v::WcStatus::kLocProtErr) << describe(wc);
    if (wc.status == v::WcStatus::kSuccess) {
      EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
    }
    if (wc.status == v::WcStatus::kLocProtErr) {
      EXPECT_TRUE(reachesState(pair->a.qp, v::QpState::kErr, kWaitTimeout))
          << "a failed request leaves the QP in ERR";
    }
  }
}

// A striped READ's response comes in two parts, the second on the stripe, placed by the stripe thread.
// Whatever the length and however the destination is split into SGEs, every byte lands where it
// belongs, the READ sees the WRITEs posted before it, and the stripe placed the second parts.
TEST_P(StripePath, ReadsComeBackWholeInTwoPartsAndSeeTheWritesBeforeThem) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  constexpr size_t kSize = 4 << 20;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 90));
  ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kSize, v::access::kAll, 91));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 92));
  ASSERT_TRUE(stripeCarries(*pair, src, remote));
  fillPattern(src.memory.bytes(), 93);
  // What `remote` holds once a WRITE of [1 MiB, 3 MiB) from src has landed.
  std::vector<uint8_t> expected(bytesOf(remote).begin(), bytesOf(remote).end());
  std::memcpy(expected.data() + (1 << 20), src.data() + (1 << 20), 2 << 20);
  // A READ of `length` bytes from remote offset `from` into local offset `to`, its destination in
  // three SGEs (split at a third and two thirds).
  auto read = [&](uint64_t id, size_t from, size_t to, size_t length) {
    const size_t third = length / 3;
    return SendOp{.opcode = v::WrOpcode::kRdmaRead,
                  .wrId = id,
                  .sges = {sgeOf(local, to, third), sgeOf(local, to + third, third),
                           sgeOf(local, to + 2 * third, length - 2 * third)},
                  .remoteAddr = remote.address(from),
                  .rkey = remote.mr.rkey()};
  };

  // The WRITE, then a READ of the whole region posted right behind it.
  uint64_t placedBefore = soft::stripeBytesPlaced();
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = v::WrOpcode::kRdmaWrite,
                                  .wrId = 1,
                                  .sges = {sgeOf(src, 1 << 20, 2 << 20)},
                                  .remoteAddr = remote.address(1 << 20),
                                  .rkey = remote.mr.rkey()},
                                 read(2, 0, 0, kSize)}));
  std::vector<v::WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  for (const auto& wc : completions) EXPECT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(bytesEqual(bytesOf(local), expected));
  // The stripe placed the WRITE's second part at the responder and the READ's here.
  const size_t write = 2 << 20;
  EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore,
            (write - soft::stripeSplitAt(write)) + (kSize - soft::stripeSplitAt(kSize)));

  // Shorter READs, from an odd offset, posted together into a cleared buffer.
  std::memset(local.data(), 0, kSize);
  const size_t lengths[] = {(1 << 20) + 5, 8191, 4097, 64};
  const size_t from = (1 << 20) - 3;
  std::vector<SendOp> ops;
  std::vector<size_t> at;
  size_t next = 0;
  uint64_t striped = 0;
  for (size_t len : lengths) {
    ops.push_back(read(10 + ops.size(), from, next, len));
    at.push_back(next);
    striped += len - soft::stripeSplitAt(len);
    next += len + 4096;
  }
  placedBefore = soft::stripeBytesPlaced();
  ASSERT_OK(postAll(pair->a.qp, ops));
  completions.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, ops.size(), &completions));
  for (size_t i = 0; i < completions.size(); ++i) {
    SCOPED_TRACE("READ of " + std::to_string(lengths[i]) + " bytes");
    EXPECT_EQ(completions[i].wrId, 10 + i);
    EXPECT_EQ(completions[i].status, v::WcStatus::kSuccess) << describe(completions[i]);
    EXPECT_TRUE(bytesEqual(bytesOf(local, at[i], lengths[i]),
                           std::span<const uint8_t>(expected).subspan(from, lengths[i])));
  }
  EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, striped);
}

TEST_P(StripePath, ARefusedReadFailsAsOnOneConnectionAndNothingLands) {
  constexpr size_t kSize = 1 << 20;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 100));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, kSize, v::access::kAll, 101));
  ASSERT_OK_AND_ASSIGN(
      auto noRead, registerBuffer(pair->b.pd, kSize, v::access::kLocalWrite | v::access::kRemoteWrite, 102));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 103));
  ASSERT_TRUE(stripeCarries(*pair, src, dst));
  const uint64_t placedBefore = soft::stripeBytesPlaced();
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = v::WrOpcode::kRdmaRead,
                                  .wrId = 1,
                                  .sges = {sgeOf(local, 0, kSize)},
                                  .remoteAddr = noRead.address(),
                                  .rkey = noRead.mr.rkey()},
                                 {.opcode = v::WrOpcode::kRdmaRead,
                                  .wrId = 2,
                                  .sges = {sgeOf(local, 0, kSize)},
                                  .remoteAddr = dst.address(),
                                  .rkey = dst.mr.rkey()}}));
  std::vector<v::WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_EQ(completions[0].status, v::WcStatus::kRemAccessErr) << describe(completions[0]);
  EXPECT_EQ(completions[1].status, v::WcStatus::kWrFlushErr) << describe(completions[1]);
  EXPECT_TRUE(matchesPattern(bytesOf(local), 103)) << "not a byte of either part landed";
  EXPECT_EQ(soft::stripeBytesPlaced(), placedBefore);
}

// A SEND refused for want of a receive (an RNR NAK) right behind a striped READ: the NAK says the
// READ is done at the responder while its second part may still be on the stripe. The READ completes
// whole, only once that part landed, and is not sent again; the SEND goes once a receive is there.
TEST_P(StripePath, AReadBeforeAnRnrRefusedSendCompletesWholeAndIsNotSentAgain) {
  constexpr size_t kSize = 2 << 20;
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kAll, 140 + round));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kSize, v::access::kAll, 150 + round));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 160 + round));
    ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, v::access::kLocalWrite, 170));
    ASSERT_TRUE(stripeCarries(*pair, src, remote));
    const std::vector<uint8_t> expected(bytesOf(remote).begin(), bytesOf(remote).end());
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    ASSERT_OK(postAll(pair->a.qp, {{.opcode = v::WrOpcode::kRdmaRead,
                                    .wrId = 1,
                                    .sges = {sgeOf(local, 0, kSize)},
                                    .remoteAddr = remote.address(),
                                    .rkey = remote.mr.rkey()},
                                   {.opcode = v::WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 64)}}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 2));
    ASSERT_OK(postReceive(pair->b.qp, 20, {sgeOf(inbox, 0, 4096)}));
    std::vector<v::WorkCompletion> completions;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
    EXPECT_EQ(completions[0].wrId, 1u);
    EXPECT_EQ(completions[0].status, v::WcStatus::kSuccess) << describe(completions[0]);
    EXPECT_EQ(completions[1].wrId, 2u);
    EXPECT_EQ(completions[1].status, v::WcStatus::kSuccess) << describe(completions[1]);
    EXPECT_TRUE(bytesEqual(bytesOf(local), expected));
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
    // Once only: the READ's second part crossed the stripe one time.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, kSize - soft::stripeSplitAt(kSize));
  }
}

// A WRITE the responder refuses right behind a striped READ: the responder's NAK and its closing
// connection may reach the requester before the READ's second part on the stripe, yet the READ
// completes whole and the WRITE fails with REM_ACCESS_ERR.
TEST_P(StripePath, AReadBeforeARefusedWriteCompletesWholeAndTheWriteFailsAsRefused) {
  constexpr size_t kSize = 2 << 20;
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, v::access::kAll, 180));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kSize, v::access::kAll, 181 + round));
    ASSERT_OK_AND_ASSIGN(auto readOnly, registerBuffer(pair->b.pd, 4096,
                                                       v::access::kLocalWrite | v::access::kRemoteRead, 190));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, kSize, v::access::kLocalWrite, 191));
    ASSERT_TRUE(stripeCarries(*pair, src, remote));
    const std::vector<uint8_t> expected(bytesOf(remote).begin(), bytesOf(remote).end());
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    ASSERT_OK(postAll(pair->a.qp, {{.opcode = v::WrOpcode::kRdmaRead,
                                    .wrId = 1,
                                    .sges = {sgeOf(local, 0, kSize)},
                                    .remoteAddr = remote.address(),
                                    .rkey = remote.mr.rkey()},
                                   {.opcode = v::WrOpcode::kRdmaWrite,
                                    .wrId = 2,
                                    .sges = {sgeOf(src, 0, 64)},
                                    .remoteAddr = readOnly.address(),
                                    .rkey = readOnly.mr.rkey()}}));
    std::vector<v::WorkCompletion> completions;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
    EXPECT_EQ(completions[0].wrId, 1u);
    EXPECT_EQ(completions[0].status, v::WcStatus::kSuccess) << describe(completions[0]);
    EXPECT_EQ(completions[1].wrId, 2u);
    EXPECT_EQ(completions[1].status, v::WcStatus::kRemAccessErr) << describe(completions[1]);
    EXPECT_TRUE(bytesEqual(bytesOf(local), expected));
    EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, kSize - soft::stripeSplitAt(kSize));
    EXPECT_TRUE(matchesPattern(bytesOf(readOnly), 190));
  }
}

// Waits a while, then says whether `buffer` still holds `before`: nothing landed meanwhile.
::testing::AssertionResult nothingLandsLater(RegisteredBuffer& buffer, const std::vector<uint8_t>& before) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return bytesEqual(bytesOf(buffer), before);
}

TEST_P(StripePath, AReadDestinationDeregisteredWhileItsPartsLandTakesNoByteAfterwards) {
  for (int delayUs : kDeregisterAfterUs) {
    SCOPED_TRACE("deregistered after " + std::to_string(delayUs) + " us");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto probe, registerBuffer(pair->a.pd, 8192, v::access::kLocalWrite, 110));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kDeregisteredSize, v::access::kAll, 111));
    ASSERT_OK_AND_ASSIGN(auto local,
                         registerBuffer(pair->a.pd, kDeregisteredSize, v::access::kLocalWrite, 112));
    ASSERT_TRUE(stripeCarries(*pair, probe, remote));
    std::vector<uint8_t> atClose;
    v::WorkCompletion wc;
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    ASSERT_TRUE(transferWhile(
        *pair, v::WrOpcode::kRdmaRead, local, remote, delayUs,
        [&] {
          local.mr.close();  // the memory stays allocated
          atClose.assign(bytesOf(local).begin(), bytesOf(local).end());
        },
        &wc));
    ASSERT_TRUE(wc.status == v::WcStatus::kSuccess || wc.status == v::WcStatus::kLocProtErr) << describe(wc);
    if (wc.status == v::WcStatus::kSuccess) {
      EXPECT_TRUE(bytesEqual(bytesOf(local), bytesOf(remote)));
      EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore,
                kDeregisteredSize - soft::stripeSplitAt(kDeregisteredSize))
          << "the READ's second part came over the stripe";
    }
    EXPECT_TRUE(nothingLandsLater(local, atClose)) << "bytes landed after the region was deregistered";
  }
}

TEST_P(StripePath, AReadSourceDeregisteredWhileItsPartsAreSentFailsTheReadOrSendsItWhole) {
  for (int delayUs : kDeregisterAfterUs) {
    SCOPED_TRACE("deregistered after " + std::to_string(delayUs) + " us");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto probe, registerBuffer(pair->a.pd, 8192, v::access::kLocalWrite, 120));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, v::access::kAll, 121));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kDeregisteredSize, v::access::kAll, 122));
    ASSERT_OK_AND_ASSIGN(auto local,
                         registerBuffer(pair->a.pd, kDeregisteredSize, v::access::kLocalWrite, 123));
    ASSERT_TRUE(stripeCarries(*pair, probe, dst));
    v::WorkCompletion wc;
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    ASSERT_TRUE(transferWhile(
        *pair, v::WrOpcode::kRdmaRead, local, remote, delayUs, [&] { remote.mr.close(); }, &wc));
    ASSERT_TRUE(wc.status == v::WcStatus::kSuccess || wc.status == v::WcStatus::kRemAccessErr)
        << describe(wc);
    if (wc.status == v::WcStatus::kSuccess) {
      EXPECT_TRUE(bytesEqual(bytesOf(local), bytesOf(remote)));
      EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore,
                kDeregisteredSize - soft::stripeSplitAt(kDeregisteredSize))
          << "the READ's second part came over the stripe";
    }
    if (wc.status == v::WcStatus::kRemAccessErr) {
      EXPECT_TRUE(reachesState(pair->a.qp, v::QpState::kErr, kWaitTimeout))
          << "a failed request leaves the QP in ERR";
    }
  }
}

// A QP moved to ERR while a striped READ's parts arrive: the READ is flushed (or done, if it beat
// the move), and once its completion is seen not a byte more lands in its memory.
TEST_P(StripePath, AReadOfAQpMovedToErrTakesNoByteAfterItsCompletion) {
  for (int delayUs : kDeregisterAfterUs) {
    SCOPED_TRACE("moved to ERR after " + std::to_string(delayUs) + " us");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair());
    ASSERT_OK_AND_ASSIGN(auto probe, registerBuffer(pair->a.pd, 8192, v::access::kLocalWrite, 130));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, kDeregisteredSize, v::access::kAll, 131));
    ASSERT_OK_AND_ASSIGN(auto local,
                         registerBuffer(pair->a.pd, kDeregisteredSize, v::access::kLocalWrite, 132));
    ASSERT_TRUE(stripeCarries(*pair, probe, remote));
    v::WorkCompletion wc;
    const uint64_t placedBefore = soft::stripeBytesPlaced();
    ASSERT_TRUE(transferWhile(
        *pair, v::WrOpcode::kRdmaRead, local, remote, delayUs,
        [&] {
          v::QpAttr attr;
          attr.state = v::QpState::kErr;
          ASSERT_OK(pair->a.qp.modify(attr, v::qp_attr_mask::kState));
        },
        &wc));
    ASSERT_TRUE(wc.status == v::WcStatus::kSuccess || wc.status == v::WcStatus::kWrFlushErr) << describe(wc);
    if (wc.status == v::WcStatus::kSuccess) {
      EXPECT_TRUE(bytesEqual(bytesOf(local), bytesOf(remote)));
      EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore,
                kDeregisteredSize - soft::stripeSplitAt(kDeregisteredSize))
          << "the READ's second part came over the stripe";
    }
    const std::vector<uint8_t> atCompletion(bytesOf(local).begin(), bytesOf(local).end());
    EXPECT_TRUE(nothingLandsLater(local, atCompletion)) << "bytes landed after the READ completed";
  }
}

// A context whose stripe thread could not start reads the stripes it accepts on its progress thread,
// and opens none itself: a's WRITEs and READs to it still share their bytes with a stripe, which its
// progress thread places and answers, and its own WRITEs to a go whole on one connection.
TEST_P(StripePath, AContextWithoutAStripeThreadReadsTheStripesItAcceptsOnItsProgressThreadAndOpensNone) {
  ConnectedPair pair;
  ASSERT_OK(openSide(pair.a, nullptr, 64));
  ASSERT_OK(openSide(pair.b, nullptr, 64));
  auto* softB = dynamic_cast<soft::SoftContext*>(pair.b.context->impl().get());
  ASSERT_NE(softB, nullptr);
  ASSERT_OK(softB->withoutStripeThreadForTests());
  ASSERT_OK(createQp(pair.a, {}));
  ASSERT_OK(createQp(pair.b, {}));
  ASSERT_OK(connectQps(*pair.a.context, pair.a.qp, *pair.b.context, pair.b.qp));
  constexpr size_t kSize = 4 << 20;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair.a.pd, kSize, v::access::kAll, 140));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair.b.pd, kSize, v::access::kAll, 141));
  ASSERT_OK_AND_ASSIGN(auto back, registerBuffer(pair.a.pd, kSize, v::access::kLocalWrite, 142));
  ASSERT_TRUE(stripeCarries(pair, src, dst));

  // Each transfer moves all of a region and must succeed.
  v::WorkCompletion wc;
  auto transfer = [&](Side& from, v::WrOpcode opcode, RegisteredBuffer& local, RegisteredBuffer& remote) {
    ::testing::AssertionResult done = transferOn(
        from.qp, from.sendCq, opcode, local, remote, 0, [] {}, &wc);
    if (done && wc.status != v::WcStatus::kSuccess) return ::testing::AssertionFailure() << describe(wc);
    return done;
  };

  // a's WRITE of the whole region: b's progress thread places the stripe's half.
  const uint64_t byStripeThreadBefore = soft::stripeBytesPlacedByStripeThread();
  uint64_t placedBefore = soft::stripeBytesPlaced();
  ASSERT_TRUE(transfer(pair.a, v::WrOpcode::kRdmaWrite, src, dst));
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, kSize - soft::stripeSplitAt(kSize));

  // a's READ of it back: b's progress thread writes the second part of the response on the stripe.
  placedBefore = soft::stripeBytesPlaced();
  ASSERT_TRUE(transfer(pair.a, v::WrOpcode::kRdmaRead, back, dst));
  EXPECT_TRUE(bytesEqual(bytesOf(back), bytesOf(src)));
  EXPECT_EQ(soft::stripeBytesPlaced() - placedBefore, kSize - soft::stripeSplitAt(kSize))
      << "the READ's second part came over the stripe";
  // Nothing was placed by a stripe thread at b (a's stripe thread placed the READ's part at a, which
  // this counter leaves out: it counts stripe data at a responder).
  EXPECT_EQ(soft::stripeBytesPlacedByStripeThread(), byStripeThreadBefore);

  // b's WRITE to a: b opened no stripe, so it goes whole on its one connection.
  fillPattern(dst.memory.bytes(), 143);
  placedBefore = soft::stripeBytesPlaced();
  ASSERT_TRUE(transfer(pair.b, v::WrOpcode::kRdmaWrite, dst, src));
  EXPECT_TRUE(bytesEqual(bytesOf(src), bytesOf(dst)));
  EXPECT_EQ(soft::stripeBytesPlaced(), placedBefore) << "a context without a stripe thread opened a stripe";
}

INSTANTIATE_TEST_SUITE_P(Providers, StripePath, ::testing::ValuesIn(providerPaths()), providerPathTestName);

}  // namespace
}  // namespace ferry::test
