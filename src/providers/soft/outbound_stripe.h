// OutboundStripe: a requester connection's stripe (stripe.h), as the requester's loop keeps it.
//
// It holds the ticket the peer's hello reply gave the connection (the stripe opens with the first
// request large enough to share), the StripeOut dialed with it and its generation (events of a
// stripe since dropped are ignored), whether the peer accepted it, whether a striped WRITE went on
// the connection (its unsent frames may then not be dropped: the responder matches halves in
// order), and whether the stripe is being heard out after the connection closed. The requester asks
// it whether a request shares the stripe and keeps none of this itself; the counterpart at the
// responder is InboundStripe. Loop only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "providers/soft/stripe.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

struct SendWqe;

class OutboundStripe {
 public:
  // What the stripe tells, with the generation of the stripe that told it (see current()). It is
  // called on the stripe's thread: the caller posts it to its loop.
  using Tell = std::function<void(uint64_t gen, StripeOut::Event event, uint32_t seq, uint32_t syndrome,
                                  const Status& why)>;

  // minBytes: the smallest WRITE or READ that shares the stripe (0: none ever does).
  explicit OutboundStripe(uint64_t minBytes) : minBytes_(minBytes) {}
  OutboundStripe(const OutboundStripe&) = delete;
  OutboundStripe& operator=(const OutboundStripe&) = delete;

  // A new connection: nothing striped on it yet, no ticket.
  void newConnection();
  // The connection's hello reply gave this ticket (0: none; the connection is to this host, where a
  // stripe is no use, is given none): the stripe opens with the first request large enough to share.
  void offer(uint64_t ticket) { ticketHeld_ = minBytes_ > 0 ? ticket : 0; }
  // Whether the stripe should open before `wqe` goes (a ticket is held and the request is large
  // enough to share): true once, handing out the ticket to dial with.
  bool openBefore(const SendWqe& wqe, uint64_t* ticket);
  // Dials the stripe (StripeOut::start) and tells through tell; false when one is open already.
  bool open(SoftContext* ctx, Reactor* reactor, in_addr_t ip, uint16_t port, const wire::FrameHeader& hello,
            Tell tell);
  // Whether events of stripe `gen` still count (it was not dropped since).
  bool current(uint64_t gen) const { return out_ != nullptr && gen == gen_; }
  uint64_t generation() const { return gen_; }
  // The stripe, while one is open (nullptr otherwise).
  const std::shared_ptr<StripeOut>& out() const { return out_; }
  // The peer accepted the stripe: WRITEs and READs may share it.
  void markReady() { ready_ = true; }
  // Whether wqe's WRITE is split with the stripe, or its READ's response comes back in two parts.
  bool sharesWrite(const SendWqe& wqe) const;
  bool sharesRead(const SendWqe& wqe) const;
  // A striped WRITE went on the connection: its unsent frames must go (usedOnConnection).
  void noteWriteShared() { used_ = true; }
  bool usedOnConnection() const { return used_; }
  // The connection closed with READ parts still due on the stripe: it is heard out first.
  void outliveConnection() { outlivesConnection_ = true; }
  bool outlivesConnection() const { return outlivesConnection_; }
  // Bytes the stripe moved are progress too (for the transport timer): steadyNs() of the last, or 0.
  int64_t lastProgressNs() const { return out_ ? out_->lastProgressNs() : 0; }
  // Ends the stripe (used stays: halves are on their way, unsent frames still go). With READ parts
  // still due, waits until the stripe thread stopped placing: nothing lands in a READ's memory after
  // the READ completed.
  void drop();

 private:
  const uint64_t minBytes_;
  std::shared_ptr<StripeOut> out_;
  uint64_t gen_ = 0;
  bool ready_ = false;
  bool used_ = false;
  uint64_t ticketHeld_ = 0;
  bool outlivesConnection_ = false;
};

}  // namespace ferry::soft
