// The helpers conformance.h declares for the verbs conformance suite's files: completion checks,
// waiting for an async event, reconnecting a pair, the setups several cases share, and the sweep
// and placement check of byte-exact transfers.
#include "verbs/conformance.h"

#include <algorithm>
#include <string>
#include <vector>

namespace ferry::test {

std::span<uint8_t> writableBytes(const RegisteredBuffer& buffer, size_t offset, size_t length) {
  return {buffer.data() + offset, length};
}

::testing::AssertionResult succeeded(const WorkCompletion& wc, uint64_t wrId, WcOpcode opcode) {
  if (wc.status == WcStatus::kSuccess && wc.wrId == wrId && wc.opcode == opcode) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected wr_id=" << wrId << " SUCCESS " << v::wcOpcodeName(opcode) << ", got " << describe(wc);
}

::testing::AssertionResult failedWith(const WorkCompletion& wc, uint64_t wrId, WcStatus status) {
  if (wc.status == status && wc.wrId == wrId) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "expected wr_id=" << wrId << " " << v::wcStatusName(status) << ", got " << describe(wc);
}

SendOp rdmaRequest(WrOpcode opcode, uint64_t wrId, const v::Sge& local, const RegisteredBuffer& remote,
                   size_t remoteOffset) {
  return {.opcode = opcode,
          .wrId = wrId,
          .sges = {local},
          .remoteAddr = remote.address(remoteOffset),
          .rkey = remote.mr.rkey()};
}

::testing::AssertionResult postAndWait(Side& side, const SendOp& op, WorkCompletion* wc) {
  const Status posted = post(side.qp, op);
  if (!posted.isOk()) return ::testing::AssertionFailure() << "post: " << posted.toString();
  return pollOne(side.sendCq, wc);
}

void expectFailedThenFlushed(Side& side, Clock::time_point start, const FailedThenFlushed& requests) {
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(side.sendCq, 2, &completions));
  EXPECT_LT(Clock::now() - start, kPeerLossBound);
  EXPECT_TRUE(failedWith(completions[0], requests.failedId, requests.status));
  EXPECT_TRUE(failedWith(completions[1], requests.flushedId, WcStatus::kWrFlushErr));
  EXPECT_TRUE(reachesState(side.qp, QpState::kErr));
}

void expectDelivered(ConnectedPair& pair, const Delivery& delivery, WorkCompletion* wc) {
  ASSERT_TRUE(pollOne(pair.a.sendCq, wc));
  EXPECT_TRUE(succeeded(*wc, delivery.sendId, delivery.sent));
  ASSERT_TRUE(pollOne(pair.b.recvCq, wc));
  EXPECT_TRUE(succeeded(*wc, delivery.recvId, delivery.received));
}

Status VerbsConformance::openUnconnected(Side& a, Side& b, v::Path* localA, v::Path* localB) const {
  FERRY_RETURN_IF_ERROR(openSide(a, nullptr, 64));
  FERRY_RETURN_IF_ERROR(openSide(b, nullptr, 64));
  FERRY_RETURN_IF_ERROR(createQp(a, {}));
  FERRY_RETURN_IF_ERROR(createQp(b, {}));
  FERRY_ASSIGN_OR_RETURN(*localA, makeLocalPath(*a.context, a.qp));
  FERRY_ASSIGN_OR_RETURN(*localB, makeLocalPath(*b.context, b.qp));
  return Status::ok();
}

::testing::AssertionResult waitAsyncEvent(v::Context& context, v::AsyncEventType type, v::AsyncEvent* out,
                                          milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string seen;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    Result<v::AsyncEvent> event = context.getAsyncEvent(static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (event.isOk()) {
      if (event->type == type) {
        *out = *event;
        return ::testing::AssertionSuccess();
      }
      seen += std::string(" ") + v::asyncEventName(event->type);
      continue;
    }
    if (event.status().code() != StatusCode::kTimedOut) {
      return ::testing::AssertionFailure() << "getAsyncEvent: " << event.status().toString();
    }
    if (Clock::now() >= deadline) {
      return ::testing::AssertionFailure()
             << "no " << v::asyncEventName(type) << " within " << timeout.count()
             << " ms; other events:" << (seen.empty() ? " none" : seen);
    }
  }
}

::testing::AssertionResult resetAndReconnect(ConnectedPair& pair, const LinkOptions& link, uint32_t accessA,
                                             uint32_t accessB) {
  v::QpAttr attr;
  attr.state = QpState::kReset;
  for (Side* side : {&pair.a, &pair.b}) {
    Status status = side->qp.modify(attr, v::qp_attr_mask::kState);
    if (!status.isOk()) return ::testing::AssertionFailure() << "modify to RESET: " << status.toString();
    Result<v::QpAttr> now = side->qp.query();
    if (!now.isOk() || now->state != QpState::kReset) {
      return ::testing::AssertionFailure() << "QP not in RESET after modify";
    }
  }
  Status status = connectQps(*pair.a.context, pair.a.qp, *pair.b.context, pair.b.qp, link, accessA, accessB,
                             &pair.a.path, &pair.b.path);
  if (!status.isOk()) return ::testing::AssertionFailure() << "reconnect: " << status.toString();
  return ::testing::AssertionSuccess();
}

size_t maxMessage(const v::Context& context) {
  auto port = context.queryPort(1);
  return port.isOk() ? port->maxMsgSz : 0;
}

void forEachSize(const v::Context& context, const RegisteredBuffer& destination, uint64_t seedBase,
                 const std::function<void(const SweepStep& step)>& transfer) {
  uint64_t wrId = 0;
  for (size_t size : kSizes) {
    if (size > maxMessage(context)) continue;  // above the device's max_msg_sz
    SCOPED_TRACE("size " + std::to_string(size));
    const SweepStep step{.size = size, .wrId = ++wrId, .seed = seedBase + size};
    fillPattern(writableBytes(destination, 0, kDstOffset + size + kGuard), step.seed);
    transfer(step);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

::testing::AssertionResult placedWithGuards(const RegisteredBuffer& dst, std::span<const uint8_t> source,
                                            size_t size, uint64_t seed) {
  if (auto r = bytesEqual(bytesOf(dst, kDstOffset, size), source); !r) return r << " (the transferred bytes)";
  if (auto r = matchesPattern(bytesOf(dst, 0, kDstOffset), seed, 0); !r)
    return r << " (bytes before the destination)";
  if (auto r = matchesPattern(bytesOf(dst, kDstOffset + size, kGuard), seed, kDstOffset + size); !r) {
    return r << " (bytes past the destination)";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ferry::test
