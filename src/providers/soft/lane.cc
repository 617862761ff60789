#include "providers/soft/lane.h"

#include "common/clock.h"
#include "common/reactor.h"
#include "providers/soft/soft.h"

namespace ferry::soft {
namespace {
std::atomic<uint64_t> bytesPlaced{0};
std::atomic<uint64_t> bytesPlacedByLaneThread{0};
}  // namespace

uint64_t laneBytesPlaced() { return bytesPlaced.load(std::memory_order_relaxed); }
uint64_t laneBytesPlacedByLaneThread() { return bytesPlacedByLaneThread.load(std::memory_order_relaxed); }
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

void LaneOut::send(std::vector<OutFrame> frames) {
  auto self = shared_from_this();
  reactor_->post([self, frames = std::move(frames)]() mutable {
    if (!self->conn_ || self->closing_) return;
    self->conn_->cork();
    for (OutFrame& frame : frames) self->conn_->send(std::move(frame));
    if (!self->conn_->closed()) self->conn_->uncork();
  });
}

void LaneOut::expectRead(uint32_t seq, uint64_t length, Segments segments) {
  std::lock_guard<std::mutex> lock(readsMu_);
  reads_.push_back(ReadPart{seq, length, std::move(segments)});
}

bool LaneOut::readsPending() const {
  std::lock_guard<std::mutex> lock(readsMu_);
  return !reads_.empty();
}

void LaneOut::forgetReadsFrom(uint32_t seq) {
  std::lock_guard<std::mutex> lock(readsMu_);
  while (!reads_.empty() && static_cast<int32_t>(reads_.back().seq - seq) >= 0) reads_.pop_back();
}

void LaneOut::close(bool wait) {
  const bool first = !closing_.exchange(true);
  auto self = shared_from_this();
  auto closeConn = [self] {
    if (self->conn_) self->conn_->close(Status::ok(), true);
    std::lock_guard<std::mutex> lock(self->readsMu_);
    self->reads_.clear();
  };
  if (wait && !reactor_->inLoop()) {
    // The lane thread never waits for the QP's loop, so this wait ends; a reactor already stopped
    // runs nothing more, which is as good.
    (void)reactor_->runSync(closeConn);
  } else if (first) {
    reactor_->post(closeConn);
  }
}

Status LaneOut::onHeader(Conn&, const wire::FrameHeader& h, PayloadPlan* plan) {
  // The peer says two things on a lane: its hello reply, then the second parts of laned READs.
  if (!ready_) {
    if (h.type != wire::FrameType::kHelloReply)
      return Status(StatusCode::kProtocolError, "a lane's first frame is its hello reply");
    return Status::ok();
  }
  if (h.type != wire::FrameType::kLaneReadResp) {
    return Status(StatusCode::kProtocolError,
                  "a lane carries nothing back but its hello reply and READ data");
  }
  std::lock_guard<std::mutex> lock(readsMu_);
  // The responder answers laned READs in order, each with its part here (a READ it refuses takes
  // the QP to ERR, which closes the lane; those an RNR NAK made it drop are forgotten).
  if (reads_.empty() || reads_.front().seq != h.seq || reads_.front().length != h.payloadLen) {
    return Status(StatusCode::kProtocolError, "READ data on the lane that is not a laned READ's second part");
  }
  plan->segments = std::move(reads_.front().segments);  // the entry stays (readsPending) until placed
  return Status::ok();
}

void LaneOut::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  if (h.type == wire::FrameType::kLaneReadResp) {
    {
      std::lock_guard<std::mutex> lock(readsMu_);
      if (!reads_.empty() && reads_.front().seq == h.seq) reads_.pop_front();
    }
    if (!plan.revoked && trailer == 0) countLaneBytesPlaced(h.payloadLen);
    if (!closing_) {
      tell_(Event::kReadLanded, h.seq, trailer,
            plan.revoked ? Status(StatusCode::kPermissionDenied, "a READ's destination was deregistered")
                         : Status::ok());
    }
    return;
  }
  if (static_cast<wire::HelloResult>(h.aux) != wire::HelloResult::kAccepted) {
    conn.close(Status(StatusCode::kUnavailable,
                      "the peer refused the lane (hello result " + std::to_string(h.aux) + ")"));
    return;
  }
  ready_ = true;
  if (!closing_) tell_(Event::kReady, 0, 0, Status::ok());
}

void LaneOut::onPayloadRevoked(Conn&, const OutFrame& frame) {
  if (!closing_) tell_(Event::kRevoked, frame.seq, 0, Status::ok());
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
  if (!closing_)
    tell_(Event::kClosed, 0, 0, why.isOk() ? Status(StatusCode::kUnavailable, "the lane closed") : why);
}

LaneIn::LaneIn(std::shared_ptr<Conn> conn, Reactor* reactor, Tell tell)
    : conn_(std::move(conn)), reactor_(reactor), tell_(std::move(tell)) {}

std::shared_ptr<LaneIn> LaneIn::adopt(SoftContext* ctx, std::shared_ptr<Conn> conn, Reactor* reactor,
                                      Tell tell) {
  std::shared_ptr<LaneIn> lane(new LaneIn(std::move(conn), reactor, std::move(tell)));
  lane->home_ = &ctx->reactor();
  lane->conn_->setDelegate(lane.get());
  // Its input waits from this frame on (the hello is being answered in this step): after the step,
  // it goes on where the lane is read.
  lane->conn_->pauseInput();
  lane->home_->post([lane] {
    lane->moved_ = true;
    if (lane->closing_ || lane->conn_->closed()) return;
    if (lane->reactor_ == lane->home_) {
      lane->conn_->resumeInput();
    } else {
      lane->conn_->moveTo(lane->reactor_);  // resumes its input there
    }
  });
  return lane;
}

void LaneIn::onLane(std::function<void()> fn) {
  if (moved_) {
    reactor_->post(std::move(fn));
  } else {
    fn();  // the connection is still on this loop
  }
}

void LaneIn::expect(uint32_t seq, uint64_t length, Segments segments) {
  bool resume = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_.push_back(Piece{seq, length, std::move(segments)});
    resume = std::exchange(waiting_, false);
  }
  // A lane paused ahead of the WRITEs has its next one now.
  if (resume) onLane([self = shared_from_this()] { self->conn_->resumeInput(); });
}

void LaneIn::send(std::vector<OutFrame> frames) {
  if (frames.empty()) return;
  onLane([self = shared_from_this(), frames = std::move(frames)]() mutable {
    Conn& conn = *self->conn_;
    if (conn.closed()) return;
    conn.cork();
    for (OutFrame& frame : frames) conn.send(std::move(frame));
    if (!conn.closed()) conn.uncork();
  });
}

void LaneIn::close(bool wait) {
  closing_ = true;
  auto closeConn = [self = shared_from_this()] {
    self->conn_->close(Status::ok(), true);
    self->conn_->setDelegate(nullptr);
    std::lock_guard<std::mutex> lock(self->mu_);
    self->pieces_.clear();
  };
  if (!moved_ || reactor_->inLoop()) {
    closeConn();
  } else if (wait) {
    // The lane thread never waits for the QP's loop, so this wait ends; a reactor already stopped
    // runs nothing more, which is as good.
    (void)reactor_->runSync(closeConn);
  } else {
    reactor_->post(closeConn);
  }
}

void LaneIn::closeAfterFlush() {
  closing_ = true;
  onLane([self = shared_from_this()] {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->pieces_.clear();
    }
    self->conn_->closeAfterFlush(/*drain=*/true);
  });
}

Status LaneIn::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (h.type != wire::FrameType::kLaneData) {
    return Status(StatusCode::kProtocolError, "a lane carries lane data only");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pieces_.empty()) {
    // Ahead of the WRITEs: this part is placed once its WRITE's own frame has been checked
    // (expect resumes the lane; this header is asked about again then).
    waiting_ = true;
    conn.pauseInput();
    return Status::ok();
  }
  const Piece& piece = pieces_.front();
  if (piece.seq != h.seq || piece.length != h.payloadLen) {
    return Status(StatusCode::kProtocolError, "lane data that is not the next laned WRITE's second half");
  }
  plan->segments = piece.segments;
  return Status::ok();
}

void LaneIn::onFrame(Conn&, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t) {
  bool placed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pieces_.empty() || pieces_.front().seq != h.seq) return;  // cleared by a close meanwhile
    placed = !pieces_.front().segments.empty();
    pieces_.pop_front();
  }
  if (placed && !plan.revoked) {
    countLaneBytesPlaced(h.payloadLen);
    if (reactor_ != home_ && reactor_->inLoop()) {
      bytesPlacedByLaneThread.fetch_add(h.payloadLen, std::memory_order_relaxed);
    }
  }
  if (!closing_) tell_(Event::kLanded, h.seq, placed && plan.revoked, Status::ok());
}

void LaneIn::onClosed(Conn&, const Status& why) {
  if (toldClosed_) return;
  toldClosed_ = true;
  if (!closing_) {
    tell_(Event::kClosed, 0, false, why.isOk() ? Status(StatusCode::kUnavailable, "the lane closed") : why);
  }
}

void splitSegments(const Segments& segs, uint64_t at, Segments* head, Segments* tail) {
  uint64_t offset = 0;
  for (const Segment& seg : segs) {
    if (offset + seg.length <= at) {
      if (head) head->push_back(seg);
    } else if (offset >= at) {
      if (tail) tail->push_back(seg);
    } else {
      const uint64_t first = at - offset;
      if (head) head->push_back(Segment{seg.ptr, first, seg.entry});
      if (tail) tail->push_back(Segment{seg.ptr ? seg.ptr + first : nullptr, seg.length - first, seg.entry});
    }
    offset += seg.length;
  }
}

}  // namespace ferry::soft
