#include "providers/soft/stripe.h"

#include "common/clock.h"
#include "common/reactor.h"
#include "providers/soft/soft.h"

namespace ferry::soft {
namespace {
std::atomic<uint64_t> bytesPlaced{0};
std::atomic<uint64_t> bytesPlacedByStripeThread{0};
}  // namespace

uint64_t stripeBytesPlaced() { return bytesPlaced.load(std::memory_order_relaxed); }
uint64_t stripeBytesPlacedByStripeThread() {
  return bytesPlacedByStripeThread.load(std::memory_order_relaxed);
}
void countStripeBytesPlaced(uint64_t bytes) { bytesPlaced.fetch_add(bytes, std::memory_order_relaxed); }

StripeOut::StripeOut(Reactor* reactor, const wire::FrameHeader& hello, Tell tell)
    : reactor_(reactor), hello_(hello), tell_(std::move(tell)) {}

std::shared_ptr<StripeOut> StripeOut::start(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port,
                                            const wire::FrameHeader& hello, Tell tell) {
  std::shared_ptr<StripeOut> stripe(new StripeOut(reactor, hello, std::move(tell)));
  auto link = dialTcpLink(ctx->ipv4(), ip, port);
  if (!link.isOk()) {
    // Told from the stripe thread, as every other event is.
    reactor->post([stripe, why = link.status()] { stripe->tellClosed(why); });
    return stripe;
  }
  stripe->conn_ = std::make_shared<Conn>(ctx, std::move(*link), stripe.get(), reactor);
  reactor->post([stripe] {
    if (stripe->closing_) {
      stripe->conn_->close(Status::ok(), true);
      return;
    }
    if (Status st = stripe->conn_->attach(); !st.isOk()) stripe->conn_->close(st);
  });
  return stripe;
}

void StripeOut::send(std::vector<OutFrame> frames) {
  auto self = shared_from_this();
  reactor_->post([self, frames = std::move(frames)]() mutable {
    if (!self->conn_ || self->closing_) return;
    self->conn_->cork();
    for (OutFrame& frame : frames) self->conn_->send(std::move(frame));
    if (!self->conn_->closed()) self->conn_->uncork();
  });
}

void StripeOut::expectRead(uint32_t seq, uint64_t length, Segments segments) {
  std::lock_guard<std::mutex> lock(readsMu_);
  reads_.push_back(ReadPart{seq, length, std::move(segments)});
}

bool StripeOut::readsPending() const {
  std::lock_guard<std::mutex> lock(readsMu_);
  return !reads_.empty();
}

void StripeOut::forgetReadsFrom(uint32_t seq) {
  std::lock_guard<std::mutex> lock(readsMu_);
  while (!reads_.empty() && static_cast<int32_t>(reads_.back().seq - seq) >= 0) reads_.pop_back();
}

void StripeOut::close(bool wait) {
  const bool first = !closing_.exchange(true);
  auto self = shared_from_this();
  auto closeConn = [self] {
    if (self->conn_) self->conn_->close(Status::ok(), true);
    std::lock_guard<std::mutex> lock(self->readsMu_);
    self->reads_.clear();
  };
  if (wait && !reactor_->inLoop()) {
    // The stripe thread never waits for the QP's loop, so this wait ends; a reactor already stopped
    // runs nothing more, which is as good.
    (void)reactor_->runSync(closeConn);
  } else if (first) {
    reactor_->post(closeConn);
  }
}

Status StripeOut::onHeader(Conn&, const wire::FrameHeader& h, PayloadPlan* plan) {
  // The peer says two things on a stripe: its hello reply, then the second parts of striped READs.
  if (!ready_) {
    if (h.type != wire::FrameType::kHelloReply)
      return Status(StatusCode::kProtocolError, "a stripe's first frame is its hello reply");
    return Status::ok();
  }
  if (h.type != wire::FrameType::kStripeReadResp) {
    return Status(StatusCode::kProtocolError,
                  "a stripe carries nothing back but its hello reply and READ data");
  }
  std::lock_guard<std::mutex> lock(readsMu_);
  // The responder answers striped READs in order, each with its part here (a READ it refuses takes
  // the QP to ERR, which closes the stripe; those an RNR NAK made it drop are forgotten).
  if (reads_.empty() || reads_.front().seq != h.seq || reads_.front().length != h.payloadLen) {
    return Status(StatusCode::kProtocolError,
                  "READ data on the stripe that is not a striped READ's second part");
  }
  plan->segments = std::move(reads_.front().segments);  // the entry stays (readsPending) until placed
  return Status::ok();
}

void StripeOut::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  if (h.type == wire::FrameType::kStripeReadResp) {
    {
      std::lock_guard<std::mutex> lock(readsMu_);
      if (!reads_.empty() && reads_.front().seq == h.seq) reads_.pop_front();
    }
    if (!plan.revoked && trailer == 0) countStripeBytesPlaced(h.payloadLen);
    if (!closing_) {
      tell_(Event::kReadLanded, h.seq, trailer,
            plan.revoked ? Status(StatusCode::kPermissionDenied, "a READ's destination was deregistered")
                         : Status::ok());
    }
    return;
  }
  if (static_cast<wire::HelloResult>(h.aux) != wire::HelloResult::kAccepted) {
    conn.close(Status(StatusCode::kUnavailable,
                      "the peer refused the stripe (hello result " + std::to_string(h.aux) + ")"));
    return;
  }
  ready_ = true;
  if (!closing_) tell_(Event::kReady, 0, 0, Status::ok());
}

void StripeOut::onPayloadRevoked(Conn&, const OutFrame& frame) {
  if (!closing_) tell_(Event::kRevoked, frame.seq, 0, Status::ok());
}

void StripeOut::onProgress(Conn&) { progressNs_.store(steadyNs(), std::memory_order_relaxed); }

void StripeOut::onConnected(Conn& conn) {
  progressNs_.store(steadyNs(), std::memory_order_relaxed);
  conn.sendHeader(hello_);
}

void StripeOut::onClosed(Conn&, const Status& why) { tellClosed(why); }

void StripeOut::tellClosed(const Status& why) {
  if (toldClosed_) return;
  toldClosed_ = true;
  if (!closing_)
    tell_(Event::kClosed, 0, 0, why.isOk() ? Status(StatusCode::kUnavailable, "the stripe closed") : why);
}

StripeIn::StripeIn(std::shared_ptr<Conn> conn, Reactor* reactor, Tell tell)
    : conn_(std::move(conn)), reactor_(reactor), tell_(std::move(tell)) {}

std::shared_ptr<StripeIn> StripeIn::adopt(SoftContext* ctx, std::shared_ptr<Conn> conn, Reactor* reactor,
                                          Tell tell) {
  std::shared_ptr<StripeIn> stripe(new StripeIn(std::move(conn), reactor, std::move(tell)));
  stripe->home_ = &ctx->reactor();
  stripe->conn_->setDelegate(stripe.get());
  // Its input waits from this frame on (the hello is being answered in this step): after the step,
  // it goes on where the stripe is read.
  stripe->conn_->pauseInput();
  stripe->home_->post([stripe] {
    // A stripe closing (or closed) before it moved stays on this loop, where its close runs: moved_
    // says where the connection is, and a close posted to the stripe thread for a connection still
    // here would touch this loop's timers and link from that thread.
    if (stripe->closing_ || stripe->conn_->closed()) return;
    stripe->moved_ = true;
    if (stripe->reactor_ == stripe->home_) {
      stripe->conn_->resumeInput();
    } else {
      stripe->conn_->moveTo(stripe->reactor_);  // resumes its input there
    }
  });
  return stripe;
}

void StripeIn::onStripe(std::function<void()> fn) {
  if (moved_) {
    reactor_->post(std::move(fn));
  } else {
    fn();  // the connection is still on this loop
  }
}

void StripeIn::expect(uint32_t seq, uint64_t length, Segments segments) {
  bool resume = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_.push_back(Piece{seq, length, std::move(segments)});
    resume = std::exchange(waiting_, false);
  }
  // A stripe paused ahead of the WRITEs has its next one now.
  if (resume) onStripe([self = shared_from_this()] { self->conn_->resumeInput(); });
}

void StripeIn::send(std::vector<OutFrame> frames) {
  if (frames.empty()) return;
  onStripe([self = shared_from_this(), frames = std::move(frames)]() mutable {
    Conn& conn = *self->conn_;
    if (conn.closed()) return;
    conn.cork();
    for (OutFrame& frame : frames) conn.send(std::move(frame));
    if (!conn.closed()) conn.uncork();
  });
}

void StripeIn::close(bool wait) {
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
    // The stripe thread never waits for the QP's loop, so this wait ends; a reactor already stopped
    // runs nothing more, which is as good.
    (void)reactor_->runSync(closeConn);
  } else {
    reactor_->post(closeConn);
  }
}

void StripeIn::closeAfterFlush() {
  closing_ = true;
  onStripe([self = shared_from_this()] {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->pieces_.clear();
    }
    self->conn_->closeAfterFlush(/*drain=*/true);
  });
}

Status StripeIn::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (h.type != wire::FrameType::kStripeData) {
    return Status(StatusCode::kProtocolError, "a stripe carries stripe data only");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pieces_.empty()) {
    // Ahead of the WRITEs: this part is placed once its WRITE's own frame has been checked
    // (expect resumes the stripe; this header is asked about again then).
    waiting_ = true;
    conn.pauseInput();
    return Status::ok();
  }
  const Piece& piece = pieces_.front();
  if (piece.seq != h.seq || piece.length != h.payloadLen) {
    return Status(StatusCode::kProtocolError, "stripe data that is not the next striped WRITE's second half");
  }
  plan->segments = piece.segments;
  return Status::ok();
}

void StripeIn::onFrame(Conn&, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t) {
  bool placed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pieces_.empty() || pieces_.front().seq != h.seq) return;  // cleared by a close meanwhile
    placed = !pieces_.front().segments.empty();
    pieces_.pop_front();
  }
  if (placed && !plan.revoked) {
    countStripeBytesPlaced(h.payloadLen);
    if (reactor_ != home_ && reactor_->inLoop()) {
      bytesPlacedByStripeThread.fetch_add(h.payloadLen, std::memory_order_relaxed);
    }
  }
  if (!closing_) tell_(Event::kLanded, h.seq, placed && plan.revoked, Status::ok());
}

void StripeIn::onClosed(Conn&, const Status& why) {
  if (toldClosed_) return;
  toldClosed_ = true;
  if (!closing_) {
    tell_(Event::kClosed, 0, false, why.isOk() ? Status(StatusCode::kUnavailable, "the stripe closed") : why);
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
