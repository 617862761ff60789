// InboundStripe: a responder connection's stripe (stripe.h), as the responder's loop keeps it.
//
// It holds the StripeIn the peer opened with the connection's ticket, the pieces the stripe owes in
// the order of the striped WRITEs on the connection (a piece not placed is discarded there: its
// WRITE was refused or dropped), the refusal that waits for the placed pieces before it (a NAK
// acknowledges everything earlier), and the second parts of READ responses, held until the
// connection's input pauses so that they leave together. The responder asks it what the stripe
// allows (whether a request may pass the pending pieces, how far an ACK may go) and keeps none of
// this itself. Loop only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/verbs/types.h"
#include "providers/soft/conn.h"
#include "providers/soft/stripe.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

class SoftContext;

class InboundStripe {
 public:
  // A refusal that waits for the pieces pending before it.
  struct Refusal {
    uint32_t seq = 0;
    wire::Syndrome syndrome = wire::Syndrome::kRemAccess;
    verbs::AsyncEventType event = verbs::AsyncEventType::kQpAccessErr;
  };
  struct Piece {
    uint32_t seq = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    bool placed = false;  // false: the bytes are discarded
  };
  // What the stripe tells, with the generation of the stripe that told it (see current()). It is
  // called on the stripe's thread: the caller posts it to its loop.
  using Tell =
      std::function<void(uint64_t gen, StripeIn::Event event, uint32_t seq, bool revoked, const Status& why)>;

  InboundStripe() = default;
  InboundStripe(const InboundStripe&) = delete;
  InboundStripe& operator=(const InboundStripe&) = delete;

  // A one-time secret for the hello reply of the connection just accepted: a stripe shows it in its
  // own hello (0: none to give).
  uint64_t issueTicket();
  // A stripe's hello that showed `ticket`: adopted (kAccepted; read on the context's stripe thread,
  // or on the loop when there is none), a wrong or spent ticket (kMismatch), or a stripe already
  // open (kBusy).
  wire::HelloResult adopt(SoftContext& ctx, const std::shared_ptr<Conn>& conn, uint64_t ticket, Tell tell);
  // Whether events of stripe `gen` still count (it was not dropped since).
  bool current(uint64_t gen) const { return in_ != nullptr && gen == gen_; }
  bool open() const { return in_ != nullptr; }

  // The header being checked starts: no piece planned for it yet.
  void beginHeader() { planned_ = false; }
  // Whether the header being checked had its piece expected.
  bool planned() const { return planned_; }
  // The stripe's next piece is the second part of WRITE seq: length bytes at addr, placed in
  // segments (empty: discarded).
  void expect(uint32_t seq, uint64_t addr, uint64_t length, Segments segments);
  // Placed pieces expected and not landed yet.
  size_t pending() const { return pending_; }
  // Whether [lo, hi) meets no placed piece that is pending.
  bool clearOf(uint64_t lo, uint64_t hi) const;
  // How far an ACK of everything through `through` may go: short of the oldest placed piece
  // pending.
  uint32_t ackThrough(uint32_t through) const;
  // The stripe told that the piece of WRITE seq landed: that piece, when it was the one due (pieces
  // land in the order they were expected), else nothing.
  std::optional<Piece> landed(uint32_t seq);

  // Holds a refusal until the pending pieces have landed (the first one held stays).
  void deferRefusal(Refusal refusal);
  // The held refusal, once nothing is pending before it.
  std::optional<Refusal> refusalDue();

  // Holds the second part of a striped READ's response; uncork() lets the held ones go together.
  void holdReadPart(OutFrame part);
  void uncork();

  // Ends the stripe: at once (waiting for the stripe thread to stop placing, when pieces are
  // pending, so that nothing lands after the QP let the WRITE go), or (afterFlush, in ERR) once
  // the READ parts on it have gone, as a NAK queued on the connection does.
  void drop(bool afterFlush);

 private:
  std::shared_ptr<StripeIn> in_;
  uint64_t gen_ = 0;  // events of stripes since dropped are ignored
  uint64_t ticket_ = 0;
  std::deque<Piece> pieces_;
  size_t pending_ = 0;    // pieces in pieces_ to be placed
  bool planned_ = false;  // the striped header being checked has its piece
  std::optional<Refusal> refusal_;
  std::vector<OutFrame> readParts_;
};

}  // namespace ferry::soft
