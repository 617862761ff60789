#include "providers/soft/lane.h"

#include "common/clock.h"
#include "common/reactor.h"
#include "providers/soft/soft.h"

namespace ferry::soft {
namespace {
std::atomic<uint64_t> bytesPlaced{0};
}  // namespace

uint64_t laneBytesPlaced() { return bytesPlaced.load(std::memory_order_relaxed); }
void countLaneBytesPlaced(uint64_t bytes) { bytesPlaced.fetch_add(bytes, std::memory_order_relaxed); }

LaneOut::LaneOut(Reactor* reactor, const wire::FrameHeader& hello, Tell tell)
    : reactor_(reactor), hello_(hello), tell_(std::move(tell)) {}

std::shared_ptr<LaneOut> LaneOut::start(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port,
                                        const wire::FrameHeader& hello, Tell tell) {
  std::shared_ptr<LaneOut> lane(new LaneOut(reactor, hello, std::move(tell)));
  auto link = dialTcpLink(ctx->ipv4(), ip, port);
  if (!link.isOk()) {
    // Told from the lane thread, as every other event is.
    reactor->post([lane, why = link.status()] { lane->tellClosed(why); });
    return lane;
  }
  lane->conn_ = std::make_shared<Conn>(ctx, std::move(*link), lane.get(), reactor);
  reactor->post([lane] {
    if (lane->closing_) {
      lane->conn_->close(Status::ok(), true);
      return;
    }
    if (Status st = lane->conn_->attach(); !st.isOk()) lane->conn_->close(st);
  });
  return lane;
}

void LaneOut::send(OutFrame frame) {
  auto self = shared_from_this();
  reactor_->post([self, frame = std::move(frame)]() mutable {
    if (self->conn_ && !self->closing_) self->conn_->send(std::move(frame));
  });
}

void LaneOut::close() {
  if (closing_.exchange(true)) return;
  auto self = shared_from_this();
  reactor_->post([self] {
    if (self->conn_) self->conn_->close(Status::ok(), true);
  });
}

Status LaneOut::onHeader(Conn&, const wire::FrameHeader& h, PayloadPlan*) {
  // The peer says one thing on a lane: its hello reply.
  if (ready_ || h.type != wire::FrameType::kHelloReply) {
    return Status(StatusCode::kProtocolError, "a lane carries nothing back but its hello reply");
  }
  return Status::ok();
}

void LaneOut::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan&, uint32_t) {
  if (static_cast<wire::HelloResult>(h.aux) != wire::HelloResult::kAccepted) {
    conn.close(Status(StatusCode::kUnavailable,
                      "the peer refused the lane (hello result " + std::to_string(h.aux) + ")"));
    return;
  }
  ready_ = true;
  if (!closing_) tell_(Event::kReady, 0, Status::ok());
}

void LaneOut::onPayloadRevoked(Conn&, const OutFrame& frame) {
  if (!closing_) tell_(Event::kRevoked, frame.seq, Status::ok());
}

void LaneOut::onProgress(Conn&) { progressNs_.store(steadyNs(), std::memory_order_relaxed); }

void LaneOut::onConnected(Conn& conn) {
  progressNs_.store(steadyNs(), std::memory_order_relaxed);
  conn.sendHeader(hello_);
}

void LaneOut::onClosed(Conn&, const Status& why) { tellClosed(why); }

void LaneOut::tellClosed(const Status& why) {
  if (toldClosed_) return;
  toldClosed_ = true;
  if (!closing_) tell_(Event::kClosed, 0, why.isOk() ? Status(StatusCode::kUnavailable, "the lane closed") : why);
}

void splitSegments(const std::vector<Segment>& segs, uint64_t at, std::vector<Segment>* head,
                   std::vector<Segment>* tail) {
  uint64_t offset = 0;
  for (const Segment& seg : segs) {
    if (offset + seg.length <= at) {
      head->push_back(seg);
    } else if (offset >= at) {
      tail->push_back(seg);
    } else {
      const uint64_t first = at - offset;
      head->push_back(Segment{seg.ptr, first, seg.entry});
      tail->push_back(Segment{seg.ptr ? seg.ptr + first : nullptr, seg.length - first, seg.entry});
    }
    offset += seg.length;
  }
}

}  // namespace ferry::soft
