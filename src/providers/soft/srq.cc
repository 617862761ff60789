// Shared receive queues of the soft provider.
#include <algorithm>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "providers/soft/soft.h"

namespace ferry::soft {

using verbs::AsyncEventType;

Status SoftSrq::postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < wrs.size(); ++i) {
    Status st;
    if (closed_) {
      st = closedError("post SRQ recv: the SRQ is closed");
    } else if (queue_.size() >= init_.maxWr) {
      st = resourceExhausted("post SRQ recv: the SRQ is full");
    }
    if (!st.isOk()) {
      if (badIndex) *badIndex = i;
      return st;
    }
    queue_.push_back(RecvWqe{wrs[i].wrId, Sges(wrs[i].sgList.begin(), wrs[i].sgList.end())});
  }
  return Status::ok();
}

Status SoftSrq::armLimit(uint32_t limit) {
  if (closed_) return closedError("arm SRQ limit: the SRQ is closed");
  std::lock_guard<std::mutex> lock(mu_);
  if (limit > init_.maxWr) return invalidArgument("arm SRQ limit: limit above max_wr");
  init_.srqLimit = limit;
  limitArmed_ = limit > 0;
  return Status::ok();
}

Result<verbs::SrqInit> SoftSrq::query() {
  if (closed_) return closedError("query SRQ: the SRQ is closed");
  std::lock_guard<std::mutex> lock(mu_);
  verbs::SrqInit q = init_;
  if (!limitArmed_) q.srqLimit = 0;
  return q;
}

bool SoftSrq::take(RecvWqe* out) {
  bool fire = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || queue_.empty()) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    if (limitArmed_ && queue_.size() < init_.srqLimit) {
      limitArmed_ = false;
      fire = true;
    }
  }
  if (fire) ctx_->raiseAsync({.type = AsyncEventType::kSrqLimitReached, .srqId = this});
  return true;
}

void SoftSrq::giveBack(RecvWqe wqe) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_front(std::move(wqe));
}

}  // namespace ferry::soft
