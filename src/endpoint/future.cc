#include "ferry/endpoint/future.h"

#include <algorithm>
#include <thread>

#include "ferry/common/config.h"
#include "ferry/endpoint/op_state.h"

namespace ferry::endpoint {

bool OpState::complete(Status status, uint32_t immData, uint64_t bytes) {
  std::vector<DoneCb> cbs;
  bool watched = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return false;
    status_ = std::move(status);
    immData_ = immData;
    bytes_ = bytes;
    done_.store(true, std::memory_order_release);
    cbs.swap(doneCbs_);
    std::swap(watched, watched_);
  }
  if (watched) {
    if (auto progressor = progressor_.lock()) progressor->watchEnds();
  }
  if (metrics_[0] || metrics_[1]) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started_).count();
    for (const auto& m : metrics_) {
      if (m)
        m->record(static_cast<int>(kind_), status_.code(), bytes_,
                  static_cast<uint64_t>(std::max<int64_t>(ns, 0)));
    }
  }
  cv_.notify_all();
  for (auto& cb : cbs) cb(*this);
  return true;
}

OpState::~OpState() {
  // An operation dropped before it completed no longer waits.
  if (watched_) {
    if (auto progressor = progressor_.lock()) progressor->watchEnds();
  }
}

void OpState::track(std::shared_ptr<Metrics> endpoint, std::shared_ptr<Metrics> context) {
  metrics_[0] = std::move(endpoint);
  metrics_[1] = std::move(context);
  started_ = Clock::now();
}

void OpState::onDone(DoneCb cb) {
  std::shared_ptr<Progressor> toTell;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      doneCbs_.push_back(std::move(cb));
      // A callback waits without polling: the progressor's thread must take this completion.
      if (!watched_ && (toTell = progressor_.lock())) watched_ = true;
      if (!toTell) return;
    }
  }
  // Outside the lock; the caller may hold locks of its own, so the progressor must not block.
  if (toTell) {
    toTell->watchBegins(/*mayBlock=*/false);
    return;
  }
  cb(*this);
}

bool OpState::pollOnce() const {
  if (done()) return true;
  if (std::shared_ptr<Progressor> progressor = progressor_.lock()) {
    progressor->pollBegins();
    progressor->progressOnce();
    progressor->pollEnds(done());
  }
  return done();
}

Status OpState::waitUntil(Clock::time_point deadline) const {
  if (!done()) {
    // Progress where the application already is: take the completions ourselves for a while, so
    // one that is there (a same-host WRITE completes within its post) wakes no thread at all.
    static const auto spin = std::chrono::microseconds(config::waitSpinUs());
    std::shared_ptr<Progressor> progressor = spin.count() > 0 ? progressor_.lock() : nullptr;
    if (progressor) {
      const Clock::time_point until = std::min(deadline, Clock::now() + spin);
      progressor->pollBegins();
      for (;;) {
        progressor->progressOnce();
        if (done() || Clock::now() >= until) break;
        std::this_thread::yield();
      }
      progressor->pollEnds(done());
    }
    if (!done()) {
      // This thread sleeps now: the progressor's own thread must wake it.
      if (progressor) progressor->watchBegins(/*mayBlock=*/true);
      bool finished;
      {
        std::unique_lock<std::mutex> lock(mu_);
        finished = cv_.wait_until(lock, deadline, [this] { return done_.load(std::memory_order_relaxed); });
      }
      if (progressor) progressor->watchEnds();
      if (!finished) {
        return Status(StatusCode::kTimedOut, "the operation has not completed within the timeout", ETIMEDOUT);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

Status OpState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed))
    return Status(StatusCode::kBusy, "the operation is still running", EBUSY);
  return status_;
}

uint32_t OpState::immData() const {
  std::lock_guard<std::mutex> lock(mu_);
  return immData_;
}

uint64_t OpState::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

Status Future::wait(std::chrono::milliseconds timeout) const {
  if (!op_) return invalidArgument("wait: empty future");
  return op_->waitUntil(OpState::Clock::now() + timeout);
}

Status Future::wait() const {
  if (!op_) return invalidArgument("wait: empty future");
  for (;;) {
    Status st = op_->waitUntil(OpState::Clock::now() + std::chrono::hours(1));
    if (st.code() != StatusCode::kTimedOut || op_->done()) return st;
  }
}

}  // namespace ferry::endpoint
