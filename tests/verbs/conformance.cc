// The helpers conformance.h declares for the verbs conformance suite's files: completion checks,
// waiting for an async event, reconnecting a pair, and the placement check of byte-exact transfers.
#include "verbs/conformance.h"

#include <algorithm>
#include <string>

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
