#include "ferry/endpoint/future.h"

#include "ferry/endpoint/op_state.h"

#include <algorithm>
#include <thread>

#include "ferry/common/config.h"

namespace ferry::endpoint {

bool OpState::complete(Status status, uint32_t immData, uint64_t bytes) {
  std::vector<DoneCb> cbs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return false;
    status_ = std::move(status);
    immData_ = immData;
    bytes_ = bytes;
    done_.store(true, std::memory_order_release);
    cbs.swap(doneCbs_);
  }
  if (metrics_[0] || metrics_[1]) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started_).count();
    for (const auto& m : metrics_) {
      if (m) m->record(static_cast<int>(kind_), status_.code(), bytes_, static_cast<uint64_t>(std::max<int64_t>(ns, 0)));
    }
  }
  cv_.notify_all();
  for (auto& cb : cbs) cb(*this);
  return true;
}

void OpState::track(std::shared_ptr<Metrics> endpoint, std::shared_ptr<Metrics> context) {
  metrics_[0] = std::move(endpoint);
  metrics_[1] = std::move(context);
  started_ = Clock::now();
}

void OpState::onDone(DoneCb cb) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      doneCbs_.push_back(std::move(cb));
      return;
    }
  }
  cb(*this);
}

Status OpState::waitUntil(Clock::time_point deadline) const {
  if (!done()) {
    // Progress where the application already is: take the completions ourselves for a while, so
    // one that is there (a same-host WRITE completes within its post) wakes no thread at all.
    static const auto spin = std::chrono::microseconds(config::waitSpinUs());
    if (spin.count() > 0) {
      if (std::shared_ptr<Progressor> progressor = progressor_.lock()) {
        const Clock::time_point until = std::min(deadline, Clock::now() + spin);
        for (;;) {
          progressor->progressOnce();
          if (done() || Clock::now() >= until) break;
          std::this_thread::yield();
        }
      }
    }
  }
  if (!done()) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [this] { return done_.load(std::memory_order_relaxed); })) {
      return Status(StatusCode::kTimedOut, "the operation has not completed within the timeout", ETIMEDOUT);
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
