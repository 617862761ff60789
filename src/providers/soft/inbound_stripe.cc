// InboundStripe: the responder's bookkeeping of its connection's stripe (loop thread).
#include "providers/soft/inbound_stripe.h"

#include <utility>

#include "providers/soft/qp_internal.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

uint64_t InboundStripe::issueTicket() {
  ticket_ = randomTicket();
  return ticket_;
}

wire::HelloResult InboundStripe::adopt(SoftContext& ctx, const std::shared_ptr<Conn>& conn, uint64_t ticket,
                                       Tell tell) {
  // The ticket went only over the responder's current connection: whoever shows it is its peer.
  if (ticket_ == 0 || ticket != ticket_) return wire::HelloResult::kMismatch;
  if (in_ && !in_->closing()) return wire::HelloResult::kBusy;
  ticket_ = 0;  // one stripe per connection
  // Read on the stripe thread (where this process's stripes are written too); on the loop when
  // there is none.
  Reactor* stripeReactor = ctx.stripeReactorFromLoop();
  const uint64_t gen = ++gen_;
  in_ = StripeIn::adopt(
      &ctx, conn, stripeReactor ? stripeReactor : &ctx.reactor(),
      [tell = std::move(tell), gen](StripeIn::Event event, uint32_t seq, bool revoked, const Status& why) {
        tell(gen, event, seq, revoked, why);
      });
  return wire::HelloResult::kAccepted;
}

void InboundStripe::expect(uint32_t seq, uint64_t addr, uint64_t length, Segments segments) {
  const bool placed = !segments.empty();
  if (placed) ++pending_;
  pieces_.push_back(Piece{seq, addr, length, placed});
  planned_ = true;
  if (in_) in_->expect(seq, length, std::move(segments));
}

bool InboundStripe::clearOf(uint64_t lo, uint64_t hi) const {
  for (const Piece& piece : pieces_) {
    if (piece.placed && lo < piece.addr + piece.length && piece.addr < hi) return false;
  }
  return true;
}

uint32_t InboundStripe::ackThrough(uint32_t through) const {
  for (const Piece& piece : pieces_) {
    if (!piece.placed) continue;
    if (qp_detail::seqLe(piece.seq, through)) return piece.seq - 1;  // done, but not all of it landed yet
    break;
  }
  return through;
}

std::optional<InboundStripe::Piece> InboundStripe::landed(uint32_t seq) {
  if (pieces_.empty() || pieces_.front().seq != seq) return std::nullopt;
  const Piece piece = pieces_.front();
  pieces_.pop_front();
  if (piece.placed) --pending_;
  return piece;
}

void InboundStripe::deferRefusal(Refusal refusal) {
  if (!refusal_) refusal_ = refusal;
}

std::optional<InboundStripe::Refusal> InboundStripe::refusalDue() {
  if (pending_ > 0 || !refusal_) return std::nullopt;
  return std::exchange(refusal_, std::nullopt);
}

void InboundStripe::holdReadPart(OutFrame part) {
  if (in_) readParts_.push_back(std::move(part));
}

void InboundStripe::uncork() {
  if (readParts_.empty()) return;
  if (in_) in_->send(std::exchange(readParts_, {}));
  readParts_.clear();
}

void InboundStripe::drop(bool afterFlush) {
  if (afterFlush) {
    uncork();
    if (in_) in_->closeAfterFlush();  // in_ holds it until then
  } else {
    if (in_) in_->close(/*wait=*/pending_ > 0);
    in_.reset();
    ++gen_;
  }
  ticket_ = 0;
  pieces_.clear();
  pending_ = 0;
  refusal_.reset();
  readParts_.clear();
}

}  // namespace ferry::soft
