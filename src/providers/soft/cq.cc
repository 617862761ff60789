// Completion queues and channels of the soft provider. A poll that finds nothing runs the
// device's progress loop in the caller when the progress thread is not running it.
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/log.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

using verbs::AsyncEventType;

Result<verbs::CqEvent> SoftCompChannel::getEvent(int timeoutMs) {
  if (closed_) return closedError("get CQ event: the completion channel is closed");
  auto ctx = ctx_.lock();
  if (!ctx || !ctx->callerProgress() || timeoutMs <= 0) return events_.take(timeoutMs);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  // What is left of the timeout in ms, rounded up (a wait never ends early); 0 once it passed.
  auto left = [&] {
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(0, ms));
  };
  for (;;) {
    auto event = events_.take(0);
    if (event.isOk() || event.status().code() != StatusCode::kTimedOut) return event;
    const int ms = left();
    if (ms == 0) return event;
    if (ctx->waitFromChannel(events_.fd(), ms) != Reactor::WaitHere::kReady) return events_.take(left());
  }
}

Result<int> SoftCq::poll(std::span<verbs::WorkCompletion> out) {
  if (closed_) return closedError("poll CQ: the CQ is closed");
  for (int round = 0;; ++round) {
    int n = 0;
    if (maybeReady_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (overflowed_) return Status(StatusCode::kIoError, "poll CQ: the CQ overflowed", EOVERFLOW);
      while (n < static_cast<int>(out.size()) && !entries_.empty()) {
        Entry& e = entries_.front();
        out[n++] = e.wc;
        if (e.held) e.held->fetch_sub(std::min(e.slots, e.held->load()));
        entries_.pop_front();
      }
      if (entries_.empty()) maybeReady_.store(false, std::memory_order_relaxed);
    }
    if (n > 0 || round > 0 || out.empty() || !ctx_->callerProgress()) return n;
    // Nothing yet: progress where the application is. When the progress thread is not running the
    // device's loop (it sleeps, or has not woken up yet), this thread runs it once itself: the
    // frames that arrived, the posts handed over, the timers due. Outside the CQ's lock, which
    // the loop's completions take. Only a poll of a CQ that is not armed vouches that the
    // application goes on polling.
    if (!ctx_->progressFromPoll(armed_.load(std::memory_order_relaxed) == 0)) return 0;
  }
}

Status SoftCq::reqNotify(bool solicitedOnly) {
  if (closed_) return closedError("request notification: the CQ is closed");
  if (!channel_) return invalidArgument("request notification: the CQ has no completion channel");
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_.store(solicitedOnly ? (armed_.load() == 1 ? 1 : 2) : 1);
  }
  ctx_->stopAttending();  // the application means to sleep: its peers must wake the thread again
  return Status::ok();
}

Status SoftCq::resize(int cqe) {
  if (closed_) return closedError("resize CQ: the CQ is closed");
  if (cqe < 1 || cqe > kMaxCqe)
    return invalidArgument("resize CQ: cqe must be 1.." + std::to_string(kMaxCqe));
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(cqe) < entries_.size()) {
    return invalidArgument("resize CQ: fewer entries than the completions it holds");
  }
  capacity_ = cqe;
  return Status::ok();
}

int SoftCq::cqe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void SoftCq::push(const verbs::WorkCompletion& wc, bool solicited) { push(wc, solicited, nullptr, 0); }

void SoftCq::push(const verbs::WorkCompletion& wc, bool solicited,
                  std::shared_ptr<std::atomic<uint32_t>> held, uint32_t slots) {
  if (closed_) return;
  bool fire = false;
  bool overflow = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (overflowed_) return;
    if (entries_.size() >= static_cast<size_t>(capacity_)) {
      overflowed_ = true;
      overflow = true;
    } else {
      entries_.push_back(Entry{wc, std::move(held), slots});
      const int armed = armed_.load(std::memory_order_relaxed);
      if (armed == 1 || (armed == 2 && (solicited || wc.status != verbs::WcStatus::kSuccess))) {
        armed_.store(0, std::memory_order_relaxed);
        fire = true;
      }
    }
    maybeReady_.store(true, std::memory_order_release);
  }
  if (overflow) {
    FERRY_LOG(kWarn, "a completion queue of %s overflowed", ctx_->info().name.c_str());
    ctx_->raiseAsync({.type = AsyncEventType::kCqErr, .cqId = this});
    return;
  }
  if (fire && channel_) channel_->notify({.cqId = this, .cqContext = userContext_});
}

}  // namespace ferry::soft
