// The expiry clock: a thread that sleeps until the next metadata expiry and hands the operations
// due to the agent's thread, where an operation that no peer began ends ERRORED (kTimedOut).

#include "connect/connector_impl.h"

namespace ferry::connect {

void Connector::Impl::startClock() {
  clock = std::thread([this] { clockLoop(); });
}

void Connector::Impl::stopClock() {
  {
    std::lock_guard<std::mutex> lock(clockMu);
    clockStop = true;
  }
  clockCv.notify_all();
  if (clock.joinable() && clock.get_id() != std::this_thread::get_id()) clock.join();
}

void Connector::Impl::expireAt(const OpPtr& op, int64_t expiresMs, std::chrono::milliseconds slack) {
  auto due = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, expiresMs - nowMs())) + slack;
  bool first;
  {
    std::lock_guard<std::mutex> lock(clockMu);
    op->expiryDue = due;
    auto it = expiries.emplace(std::make_pair(due, op->id), op).first;
    first = it == expiries.begin();
  }
  if (first) clockCv.notify_all();
}

void Connector::Impl::clockLoop() {
  std::unique_lock<std::mutex> lock(clockMu);
  while (!clockStop) {
    if (expiries.empty()) {
      clockCv.wait(lock);
      continue;
    }
    auto due = expiries.begin()->first.first;
    if (Clock::now() < due) {
      clockCv.wait_until(lock, due);
      continue;
    }
    std::vector<std::weak_ptr<Operation::State>> ops;
    while (!expiries.empty() && expiries.begin()->first.first <= Clock::now()) {
      ops.push_back(std::move(expiries.begin()->second));
      expiries.erase(expiries.begin());
    }
    lock.unlock();
    std::weak_ptr<Impl> weak = weak_from_this();
    agent->post([weak, ops = std::move(ops)] {
      auto self = weak.lock();
      if (!self) return;
      for (const auto& w : ops) {
        if (auto op = w.lock()) self->expire(op);
      }
    });
    lock.lock();
  }
}

void Connector::Impl::expire(const OpPtr& op) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (op->ended) return;
    std::string id = std::to_string(op->metadata.operation);
    if (op->passive) {
      if (op->status != OperationStatus::kInitialized) return;
      why = "the metadata of " + std::string(op->kind == OperationKind::kRead ? "readable" : "writable") +
            " operation " + id + " expired (metadata_ttl " + std::to_string(opts.metadataTtl.count()) +
            " ms) before any peer began it";
    } else {
      if (op->started) return;
      why = "the metadata of operation " + id + " of worker '" + op->metadata.worker +
            "' expired before the owner began the " + kindVerb(op->kind) +
            (op->beginSent ? " (it did not answer the BEGIN)" : " (the connection to it was not ready)");
    }
  }
  finish(op, OperationStatus::kErrored, Status(StatusCode::kTimedOut, why));
}

}  // namespace ferry::connect
