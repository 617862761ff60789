// StripeOut: the requester's side of a QP's stripe (FERRY_SOFT_TCP_STRIPE). A stripe is a second TCP
// connection from a QP's requester to its peer's responder. The second part of each large WRITE
// goes on it as a kStripeData frame (wire.h), while the first part goes on the QP's own connection
// with kFlagStriped; the second part of each large READ's response comes back on it as a
// kStripeReadResp frame. What makes it worth a connection: two byte streams, each with a congestion
// window of its own (a link that loses packets bounds each stream, not their sum), and the
// context's stripe thread (SoftContext::stripeReactor), which writes the WRITE parts and places the
// READ parts, so two cores copy one large transfer where one did. The responder places a stripe's
// WRITE bytes on its stripe thread (StripeIn), in the order of the WRITEs its connection carries, and
// acknowledges a striped WRITE only once both parts have landed (rc_responder.cc); the requester
// completes a striped READ only once both parts of its response have landed. The QP's ordering and
// completion rules do not change.
//
// Everything of the stripe's connection runs on the stripe thread; the QP, on its own loop, hears of it
// through `tell` (which the QP makes post to its loop). The responder's side (StripeIn, below) reads
// its stripe on its own context's stripe thread the same way.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "providers/soft/conn.h"
#include "providers/soft/wire.h"

namespace ferry {
class Reactor;
}

namespace ferry::soft {

class SoftContext;

class StripeOut final : public Conn::Delegate, public std::enable_shared_from_this<StripeOut> {
 public:
  enum class Event {
    kReady,       // the peer accepted the stripe: striped WRITEs and READs may go
    kRevoked,     // a source region was deregistered while a stripe frame was sent (seq); zeros went
    kReadLanded,  // the second part of READ seq landed; syndrome: the responder's trailer, why: not
                  // ok when a destination region was deregistered while it arrived (bytes dropped)
    kClosed,      // the stripe is gone (why)
  };
  using Tell = std::function<void(Event event, uint32_t seq, uint32_t syndrome, const Status& why)>;

  // Dials ip:port from the context's address on `reactor` (the stripe thread), says `hello` once
  // connected and reports through tell (called on the stripe thread).
  static std::shared_ptr<StripeOut> start(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port,
                                          const wire::FrameHeader& hello, Tell tell);

  // Queues frames (any thread; they are written on the stripe thread, in the order of the calls,
  // the frames of one call in one write where the socket takes them).
  void send(std::vector<OutFrame> frames);
  // The second part of READ seq will come back on the stripe (length bytes, placed in segments):
  // said before the READ's request leaves, in the order of the READs (any thread).
  void expectRead(uint32_t seq, uint64_t length, Segments segments);
  // READ parts expected and not yet landed (any thread).
  bool readsPending() const;
  // Forgets the READ parts expected from READ seq on (an RNR NAK: the responder answers none of
  // them, and they are sent, and expected, again).
  void forgetReadsFrom(uint32_t seq);
  // Closes the connection (any thread); nothing more is told. With wait (not on the stripe thread),
  // returns only once the stripe thread has closed it: no READ part lands after that.
  void close(bool wait = false);
  // steadyNs() of the last bytes the stripe moved (for the QP's transport timer).
  int64_t lastProgressNs() const { return progressNs_.load(std::memory_order_relaxed); }

  // Conn::Delegate (stripe thread).
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
               uint32_t trailer) override;
  void onPayloadRevoked(Conn& conn, const OutFrame& frame) override;
  void onProgress(Conn& conn) override;
  void onConnected(Conn& conn) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  StripeOut(Reactor* reactor, const wire::FrameHeader& hello, Tell tell);
  void tellClosed(const Status& why);  // once

  struct ReadPart {
    uint32_t seq = 0;
    uint64_t length = 0;
    Segments segments;
  };

  Reactor* reactor_;
  wire::FrameHeader hello_;
  mutable std::mutex readsMu_;
  std::deque<ReadPart> reads_;  // under readsMu_: expected, in the order of the READs
  Tell tell_;
  std::shared_ptr<Conn> conn_;  // stripe thread only (set before the first task runs there)
  bool ready_ = false;          // stripe thread only
  bool toldClosed_ = false;     // stripe thread only
  std::atomic<bool> closing_{false};
  std::atomic<int64_t> progressNs_{0};
};

// StripeIn: the responder's side of a QP's stripe, the connection a StripeOut dialled. It reads the stripe
// on the context's stripe thread, as StripeOut writes it there on the requester's side: the two
// connections of a QP are read by two threads, each of which may share a core with the thread
// that writes its connection (on loopback the reader then copies from a cache the writer just
// filled). The QP, on its own loop, says which piece each striped WRITE leaves to the stripe (expect)
// and hands over the second parts of striped READ responses (send); the stripe thread places the
// pieces, in the order of the WRITEs, and tells the QP of each through `tell` (which the QP makes
// post to its loop), which acknowledges a striped WRITE once both its parts have landed.
//
// The connection is accepted on the QP's loop, where its hello is answered; adopt() moves it to
// the stripe thread once that step is over.
class StripeIn final : public Conn::Delegate, public std::enable_shared_from_this<StripeIn> {
 public:
  enum class Event {
    kLanded,  // the piece of WRITE seq is placed (revoked: its region went while it arrived, the
              // bytes were dropped); a discarded piece is told too
    kClosed,  // the stripe is gone (why)
  };
  using Tell = std::function<void(Event event, uint32_t seq, bool revoked, const Status& why)>;

  // Takes conn, whose hello the QP's loop is answering in this step (its input is paused here),
  // and moves it to `reactor` (the stripe thread; the QP's own loop when there is none) once the
  // step is over. Loop only, as every call below but the Delegate's.
  static std::shared_ptr<StripeIn> adopt(SoftContext* ctx, std::shared_ptr<Conn> conn, Reactor* reactor,
                                         Tell tell);

  // The stripe's next piece is the second part of WRITE seq: length bytes, placed in segments (empty:
  // discarded, its WRITE was refused or dropped). Said in the order of the WRITEs.
  void expect(uint32_t seq, uint64_t length, Segments segments);
  // Queues the second parts of striped READ responses, written together, in the order of the calls.
  void send(std::vector<OutFrame> frames);
  // Closes the stripe; nothing more is told. With wait, returns only once the connection is closed
  // where it runs: no byte lands after that.
  void close(bool wait = false);
  // Writes what is queued, then closes (draining what the peer still sends, as Conn does); nothing
  // more is told.
  void closeAfterFlush();
  bool closing() const { return closing_.load(std::memory_order_relaxed); }

  // Conn::Delegate (the stripe's loop).
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
               uint32_t trailer) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  StripeIn(std::shared_ptr<Conn> conn, Reactor* reactor, Tell tell);
  // Runs fn where the connection is: on this (the QP's) loop until the move, on the stripe's after.
  void onStripe(std::function<void()> fn);

  struct Piece {
    uint32_t seq = 0;
    uint64_t length = 0;
    Segments segments;
  };

  std::shared_ptr<Conn> conn_;
  Reactor* reactor_;    // the stripe's loop
  Reactor* home_;       // the QP's loop
  bool moved_ = false;  // QP's loop only: the connection left it (onStripe posts to reactor_); never
                        // set for a stripe that closed first, whose connection stays on the loop
  Tell tell_;
  std::mutex mu_;
  std::deque<Piece> pieces_;  // under mu_: expected, in the order of the WRITEs
  bool waiting_ = false;      // under mu_: the stripe paused ahead of every WRITE
  bool toldClosed_ = false;   // the stripe's loop only
  std::atomic<bool> closing_{false};
};

// How many bytes stripes brought into this process's registered memory (responders' side), and how
// many of them a stripe thread placed while the QP's loop was elsewhere (a context without a stripe
// thread reads its stripes on its loop).
uint64_t stripeBytesPlaced();
uint64_t stripeBytesPlacedByStripeThread();
void countStripeBytesPlaced(uint64_t bytes);

// Where a striped transfer of `length` bytes splits: the first part (on the QP's own connection) is
// the bytes below this 4 KiB boundary near the middle, the second part (on the stripe) the rest.
inline uint64_t stripeSplitAt(uint64_t length) { return (length / 2) & ~uint64_t{0xfff}; }

// Splits segs at byte `at`: the segments (and piece of one) before it into head, the rest into tail
// (either may be null: that side is not wanted).
void splitSegments(const Segments& segs, uint64_t at, Segments* head, Segments* tail);

}  // namespace ferry::soft
