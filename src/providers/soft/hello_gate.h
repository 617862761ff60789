// HelloGate: the delegate of the connections a context's listeners accepted, until their first
// frame, a hello, names the queue pair that takes them (context_listen.cc). Reactor thread.
#pragma once

#include <functional>
#include <memory>

#include "providers/soft/conn.h"

namespace ferry::soft {

// Connections accepted by a context's listener, until their first frame names a QP.
class HelloGate final : public Conn::Delegate {
 public:
  Status onHeader(Conn&, const wire::FrameHeader& h, PayloadPlan*) override {
    if (h.type != wire::FrameType::kHello) return Status(StatusCode::kProtocolError, "expected a hello");
    return Status::ok();
  }
  void onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan&, uint32_t) override {
    hello(conn.shared_from_this(), h);
  }
  void onClosed(Conn& conn, const Status&) override { forget(&conn); }

  std::function<void(const std::shared_ptr<Conn>&, const wire::FrameHeader&)> hello;
  std::function<void(Conn*)> forget;
};

}  // namespace ferry::soft
