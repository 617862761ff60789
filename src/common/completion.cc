#include "ferry/common/completion.h"

#include <algorithm>
#include <cerrno>
#include <thread>

#include "ferry/common/config.h"

namespace ferry {

Completion::~Completion() {
  // Work dropped before it completed no longer waits.
  if (watched_) {
    if (auto progressor = progressor_.lock()) progressor->watchEnds();
  }
}

bool Completion::complete(Status status, uint32_t immData, uint64_t bytes) {
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
  completed(status_, bytes_);  // final once done_ is set: no other call writes them
  cv_.notify_all();
  for (auto& cb : cbs) cb(*this);
  return true;
}

void Completion::onDone(DoneCb cb) {
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

bool Completion::pollOnce() const {
  if (done()) return true;
  if (std::shared_ptr<Progressor> progressor = progressor_.lock()) {
    progressor->pollBegins();
    progressor->progressOnce();
    progressor->pollEnds(done());
  }
  return done();
}

Status Completion::waitUntil(Clock::time_point deadline) const {
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

Status Completion::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed))
    return Status(StatusCode::kBusy, "the operation is still running", EBUSY);
  return status_;
}

uint32_t Completion::immData() const {
  std::lock_guard<std::mutex> lock(mu_);
  return immData_;
}

uint64_t Completion::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace ferry
