#include "ferry/endpoint/future.h"

#include <algorithm>

#include "endpoint/op_state.h"

namespace ferry::endpoint {

void OpState::track(std::shared_ptr<Metrics> endpoint, std::shared_ptr<Metrics> context) {
  metrics_[0] = std::move(endpoint);
  metrics_[1] = std::move(context);
  started_ = Clock::now();
}

void OpState::completed(const Status& status, uint64_t bytes) {
  if (!metrics_[0] && !metrics_[1]) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started_).count();
  for (const auto& m : metrics_) {
    if (m)
      m->record(static_cast<int>(kind_), status.code(), bytes,
                static_cast<uint64_t>(std::max<int64_t>(ns, 0)));
  }
}

Status Future::wait(std::chrono::milliseconds timeout) const {
  if (!op_) return invalidArgument("wait: empty future");
  return op_->waitUntil(Completion::Clock::now() + timeout);
}

Status Future::wait() const {
  if (!op_) return invalidArgument("wait: empty future");
  for (;;) {
    Status st = op_->waitUntil(Completion::Clock::now() + std::chrono::hours(1));
    if (st.code() != StatusCode::kTimedOut || op_->done()) return st;
  }
}

}  // namespace ferry::endpoint
