// Handle lifetime: closing a context closes its children, empty and moved-from handles say
// CLOSED, a QP whose CQ is closed refuses work, and idle connections cost no CPU.
#include <sys/resource.h>

#include <chrono>
#include <span>
#include <thread>
#include <utility>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

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
  const Status status = post(pair->a.qp, rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 64), dst));
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
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 64), dst), &wc));
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
}  // namespace ferry::test
