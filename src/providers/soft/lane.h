// LaneOut: the sending side of a QP's lane (FERRY_SOFT_TCP_LANE). A lane is a second TCP connection
// from a QP's requester to its peer's responder; the second half of each large WRITE goes on it as
// a kLaneData frame (wire.h), while the first half goes on the QP's own connection with
// kFlagLaned. What makes it worth a connection is the thread: the lane is written by the context's
// lane thread (SoftContext::laneReactor), so two cores copy one large WRITE into the kernel at once
// where one did. The responder places a lane's bytes on its own loop, in the order of the WRITEs
// its connection carries, and acknowledges a laned WRITE only once both halves have landed
// (qp_responder.cc), so the QP's ordering and completion rules do not change.
//
// Everything of the lane's connection runs on the lane thread; the QP, on its own loop, hears of it
// through `tell` (which the QP makes post to its loop).
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <functional>
#include <memory>

#include "providers/soft/conn.h"
#include "providers/soft/wire.h"

namespace ferry {
class Reactor;
}

namespace ferry::soft {

class SoftContext;

class LaneOut final : public Conn::Delegate, public std::enable_shared_from_this<LaneOut> {
 public:
  enum class Event {
    kReady,    // the peer accepted the lane: laned WRITEs may go
    kRevoked,  // a source region was deregistered while a lane frame was sent (seq); zeros went
    kClosed,   // the lane is gone (status: why)
  };
  using Tell = std::function<void(Event event, uint32_t seq, const Status& why)>;

  // Dials ip:port from the context's address on `reactor` (the lane thread), says `hello` once
  // connected and reports through tell (called on the lane thread).
  static std::shared_ptr<LaneOut> start(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port,
                                        const wire::FrameHeader& hello, Tell tell);

  // Queues a frame (any thread; it is written on the lane thread, in the order of the calls).
  void send(OutFrame frame);
  // Closes the connection (any thread); nothing more is told.
  void close();
  // steadyNs() of the last bytes the lane moved (for the QP's transport timer).
  int64_t lastProgressNs() const { return progressNs_.load(std::memory_order_relaxed); }

  // Conn::Delegate (lane thread).
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan, uint32_t trailer) override;
  void onPayloadRevoked(Conn& conn, const OutFrame& frame) override;
  void onProgress(Conn& conn) override;
  void onConnected(Conn& conn) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  LaneOut(Reactor* reactor, const wire::FrameHeader& hello, Tell tell);
  void tellClosed(const Status& why);  // once

  Reactor* reactor_;
  wire::FrameHeader hello_;
  Tell tell_;
  std::shared_ptr<Conn> conn_;  // lane thread only (set before the first task runs there)
  bool ready_ = false;          // lane thread only
  bool toldClosed_ = false;    // lane thread only
  std::atomic<bool> closing_{false};
  std::atomic<int64_t> progressNs_{0};
};

// How many bytes lanes brought into this process's registered memory (responders' side).
uint64_t laneBytesPlaced();
void countLaneBytesPlaced(uint64_t bytes);

// Splits segs at byte `at`: the segments (and piece of one) before it into head, the rest into tail.
void splitSegments(const std::vector<Segment>& segs, uint64_t at, std::vector<Segment>* head,
                   std::vector<Segment>* tail);

}  // namespace ferry::soft
