#include "providers/soft/outbound_stripe.h"

#include <utility>

#include "providers/soft/soft.h"

namespace ferry::soft {

void OutboundStripe::newConnection() {
  used_ = false;
  ticketHeld_ = 0;
}

bool OutboundStripe::openBefore(const SendWqe& wqe, uint64_t* ticket) {
  const bool large =
      (wqe.opcode == verbs::WrOpcode::kRdmaWrite || wqe.opcode == verbs::WrOpcode::kRdmaRead) &&
      wqe.length >= minBytes_;
  if (ticketHeld_ == 0 || !large) return false;
  *ticket = std::exchange(ticketHeld_, 0);
  return true;
}

bool OutboundStripe::open(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port,
                          const wire::FrameHeader& hello, Tell tell) {
  if (out_) return false;
  const uint64_t gen = ++gen_;
  out_ = StripeOut::start(
      ctx, reactor, ip, port, hello,
      [tell = std::move(tell), gen](StripeOut::Event event, uint32_t seq, uint32_t syndrome,
                                    const Status& why) { tell(gen, event, seq, syndrome, why); });
  return true;
}

bool OutboundStripe::sharesWrite(const SendWqe& wqe) const {
  return ready_ && wqe.opcode == verbs::WrOpcode::kRdmaWrite && wqe.inlineData.empty() &&
         wqe.length >= minBytes_;
}

bool OutboundStripe::sharesRead(const SendWqe& wqe) const {
  return ready_ && wqe.opcode == verbs::WrOpcode::kRdmaRead && wqe.length >= minBytes_;
}

void OutboundStripe::drop() {
  if (out_) out_->close(/*wait=*/out_->readsPending());
  out_.reset();
  outlivesConnection_ = false;
  ++gen_;
  ready_ = false;
}

}  // namespace ferry::soft
