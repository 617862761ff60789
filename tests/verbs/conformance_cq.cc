// Completion queues: creation and resizing, which requests complete (signaled, unsignaled,
// SQ_SIG_ALL, errors), overflow, and completion channels with armed and solicited-only CQs.
#include <poll.h>

#include <chrono>
#include <limits>
#include <span>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

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
    ASSERT_OK(post(pair->a.qp, rdmaRequest(WrOpcode::kRdmaWrite, id, sgeOf(src, 0, 512), dst)));
  }
  ASSERT_OK(pair->a.sendCq.resize(64));
  EXPECT_GE(pair->a.sendCq.cqe(), 64);
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 8, &completions));
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(succeeded(completions[i], i + 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(20)));
}

TEST_P(VerbsConformance, UnsignaledRequestsProduceNoCompletion) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 38));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 39));
  std::vector<SendOp> ops;
  for (uint64_t id = 1; id <= 4; ++id) {
    ops.push_back(rdmaRequest(WrOpcode::kRdmaWrite, id, sgeOf(src, id * 512, 512), dst, id * 512));
    ops.back().flags = id == 4 ? send_flags::kSignaled : 0u;
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
    ops.push_back(rdmaRequest(WrOpcode::kRdmaWrite, id, sgeOf(src, 0, 64), dst));
    ops.back().flags = 0;
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
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 9,
                           .sges = {sgeOf(src, 0, 64)},
                           .flags = 0,
                           .remoteAddr = dst.address(),
                           .rkey = corruptKey(dst.mr.rkey())},
                          &wc));
  EXPECT_TRUE(failedWith(wc, 9, WcStatus::kRemAccessErr));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 43));
}

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
    ops.push_back(rdmaRequest(WrOpcode::kRdmaWrite, static_cast<uint64_t>(i), sgeOf(src, 0, 8), dst));
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
  const SendOp write = rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 64), dst);
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
  ASSERT_TRUE(postAndWait(a, write, &wc));
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

}  // namespace
}  // namespace ferry::test
