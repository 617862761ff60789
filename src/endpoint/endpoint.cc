// The endpoint's life (endpoint.h): creation (checking the options, the completion queue, the
// queue pairs brought to INIT, the receive buffers posted), the worker it is attached to, its
// failure, its shutdown, and its counters. The other jobs have files of their own
// (endpoint_internal.h lists them).
#include "ferry/endpoint/endpoint.h"

#include <algorithm>
#include <cstdlib>

#include "common/log.h"
#include "endpoint/endpoint_internal.h"
#include "endpoint/endpoint_qp.h"
#include "ferry/common/config.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

// Checks the options against the device (kInvalidArgument for one out of its range); returns the
// completion queue size they need.
Result<uint64_t> checkOptions(const EndpointOptions& o, const RdmaContext& context) {
  const v::DeviceAttr& dev = context.deviceAttr();
  if (o.numQp < 1 || o.numQp > 64)
    return invalidArgument("num_qp must be 1..64, not " + std::to_string(o.numQp));
  if (o.sendDepth < 1 || o.sendDepth > static_cast<uint32_t>(dev.maxQpWr)) {
    return invalidArgument("send depth must be 1.." + std::to_string(dev.maxQpWr));
  }
  if (o.recvDepth < 1 || o.recvDepth > static_cast<uint32_t>(dev.maxQpWr)) {
    return invalidArgument("receive depth must be 1.." + std::to_string(dev.maxQpWr));
  }
  uint64_t maxMsg = context.portAttr().maxMsgSz ? context.portAttr().maxMsgSz : (uint64_t{1} << 31);
  if (o.recvBufferSize < 64 || o.recvBufferSize > std::min<uint64_t>(maxMsg, uint64_t{1} << 30)) {
    return invalidArgument("receive buffer size must be 64 bytes .. " +
                           std::to_string(std::min<uint64_t>(maxMsg, uint64_t{1} << 30)));
  }
  if (o.maxWorkRequestBytes < 1 || o.maxWorkRequestBytes > maxMsg) {
    return invalidArgument("largest work request must be 1 .. " + std::to_string(maxMsg) + " bytes");
  }
  if (o.minStripeBytes < 1) return invalidArgument("the smallest stripe must be at least 1 byte");
  if (o.ackTimeout < 1 || o.ackTimeout > 31)
    return invalidArgument("ackTimeout must be 0 (from FERRY_TRANSPORT_TIMEOUT) or 1..31");
  uint64_t cqe = o.numQp * (uint64_t{o.sendDepth} + o.recvDepth) + 64;
  if (cqe > static_cast<uint64_t>(dev.maxCqe)) {
    return invalidArgument(
        "num_qp x (send depth + receive depth) exceeds the device's completion queue size");
  }
  return cqe;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation

uint8_t ackTimeoutCovering(int seconds, int tries) {
  const double perTry = static_cast<double>(seconds) / std::max(tries, 1);
  for (uint8_t e = 1; e < 31; ++e) {
    if (4.096e-6 * static_cast<double>(uint64_t{1} << e) >= perTry) return e;
  }
  return 31;
}

Result<std::shared_ptr<Endpoint>> Endpoint::create(const ContextOptions& device, EndpointOptions options) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<RdmaContext> context, RdmaContext::open(device));
  return create(std::move(context), std::move(options));
}

Result<std::shared_ptr<Endpoint>> Endpoint::create(std::shared_ptr<RdmaContext> context,
                                                   EndpointOptions options) {
  if (!context) return invalidArgument("Endpoint: no context");
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<MemoryPool> pool, MemoryPool::create(std::move(context)));
  return create(std::move(pool), std::move(options));
}

Result<std::shared_ptr<Endpoint>> Endpoint::create(std::shared_ptr<MemoryPool> pool,
                                                   EndpointOptions options) {
  if (!pool) return invalidArgument("Endpoint: no memory pool");
  if (options.ackTimeout == 0) options.ackTimeout = ackTimeoutCovering(config::transportTimeoutSeconds());
  std::shared_ptr<EndpointImpl> ep(new EndpointImpl(std::move(pool), std::move(options)));
  ep->self_ = ep;  // once here, so that each new operation takes it without locking a weak pointer
  FERRY_RETURN_IF_ERROR(ep->init());
  return std::shared_ptr<Endpoint>(std::move(ep));
}

EndpointImpl::EndpointImpl(std::shared_ptr<MemoryPool> pool, EndpointOptions options)
    : options_(std::move(options)),
      pool_(std::move(pool)),
      context_(pool_->context()),
      worker_(options_.worker) {}

EndpointImpl::~EndpointImpl() { shutdown(); }

Status EndpointImpl::init() {
  const v::DeviceAttr& dev = context_->deviceAttr();
  const EndpointOptions& o = options_;
  FERRY_ASSIGN_OR_RETURN(uint64_t cqe, checkOptions(o, *context_));
  maxSendSge_ = std::max<uint32_t>(1, std::min<uint32_t>(kMaxSendSge, static_cast<uint32_t>(dev.maxSge)));

  v::Context& ctx = context_->verbs();
  FERRY_ASSIGN_OR_RETURN(channel_, ctx.createCompChannel());
  FERRY_ASSIGN_OR_RETURN(cq_, ctx.createCq({.cqe = static_cast<int>(cqe), .channel = &channel_}));

  const uint64_t slabBytes = uint64_t{o.numQp} * o.recvDepth * o.recvBufferSize;
  const uint64_t rounded = (slabBytes + 4095) / 4096 * 4096;
  recvSlab_ = std::unique_ptr<uint8_t[], void (*)(void*)>(
      static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)), std::free);
  if (!recvSlab_)
    return resourceExhausted("cannot allocate " + std::to_string(rounded) + " bytes of receive buffers");
  FERRY_ASSIGN_OR_RETURN(recvMr_,
                         pool_->pd().registerMemory(recvSlab_.get(), rounded, v::access::kLocalWrite));

  for (size_t i = 0; i < o.numQp; ++i) {
    auto qp = std::make_unique<EndpointQp>();
    qp->index = i;
    qp->nextMessage = i;
    FERRY_ASSIGN_OR_RETURN(qp->queuePair, pool_->pd().createQp({.type = v::QpType::kRc,
                                                                .sendCq = &cq_,
                                                                .recvCq = &cq_,
                                                                .cap = {.maxSendWr = o.sendDepth,
                                                                        .maxRecvWr = o.recvDepth,
                                                                        .maxSendSge = maxSendSge_,
                                                                        .maxRecvSge = 1}}));
    qp->qpNum = qp->queuePair.qpNum();
    qp->local.portNum = static_cast<uint8_t>(context_->ibPort());
    qp->local.packetLifeTime = o.ackTimeout;
    qp->local.sgidIndex = o.gidIndex;
    FERRY_RETURN_IF_ERROR(v::fillPath(ctx, qp->queuePair, qp->local));
    // INIT now, so the receives are posted before the peer can send anything.
    v::QpAttr attr;
    attr.state = v::QpState::kInit;
    attr.pkeyIndex = 0;
    attr.portNum = qp->local.portNum;
    attr.qpAccessFlags = kQpAccess;
    namespace m = v::qp_attr_mask;
    FERRY_RETURN_IF_ERROR(qp->queuePair.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
    qp->batch.reserve(o.sendDepth);
    qp->sges.reserve(size_t{o.sendDepth} * maxSendSge_);
    qps_.push_back(std::move(qp));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t b = 0; b < o.numQp * o.recvDepth; ++b) repostLocked(b);
    if (state_ == State::kFailed) return failure_;
  }
  FERRY_RETURN_IF_ERROR(cq_.reqNotify());
  if (!worker_) {
    FERRY_ASSIGN_OR_RETURN(worker_, Worker::create({.socketId = -1, .id = 0}));
  }
  return worker_->attach(self());
}

Status EndpointImpl::moveToWorker(std::shared_ptr<Worker> worker) {
  std::shared_ptr<Worker> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown) return closedError("add_endpoint: the endpoint was shut down");
    if (worker_ == worker) return Status::ok();
    FERRY_RETURN_IF_ERROR(worker->attach(self()));
    worker_->detach(this);
    old = std::move(worker_);
    worker_ = std::move(worker);
  }
  // A completion may have arrived between the two workers; let the new one look.
  progressFromWorker();
  old.reset();  // a worker of the endpoint's own ends here, outside the lock
  return Status::ok();
}

std::shared_ptr<Worker> EndpointImpl::worker() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_;
}

bool EndpointImpl::isShutdown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kShutdown;
}

Status EndpointImpl::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void EndpointImpl::failLocked(const Status& why) {
  if (state_ == State::kFailed || state_ == State::kShutdown) return;
  state_ = State::kFailed;
  failure_ = why;
  FERRY_LOG(kWarn, "endpoint on %s: %s", context_->deviceName().c_str(), why.toString().c_str());
  // Stop the queue pairs: everything posted completes (flushed), so operations with work in flight
  // finish through their completions, once the device no longer touches their memory.
  for (auto& qp : qps_) {
    v::QpAttr attr;
    attr.state = v::QpState::kErr;
    Status st = qp->queuePair.modify(attr, v::qp_attr_mask::kState);
    if (!st.isOk())
      FERRY_LOG(kWarn, "endpoint: moving queue pair %zu to ERR: %s", qp->index, st.toString().c_str());
  }
  // Operations with nothing in flight fail now.
  for (auto& op : queue_) {
    op->allPosted = true;
    if (op->firstError.isOk()) op->firstError = why;
    finishIfDoneLocked(op);
  }
  queue_.clear();
  for (auto& [seq, op] : recvWaiting_) op->complete(why);
  recvWaiting_.clear();
  incoming_.clear();
  unexpectedBytes_ = 0;
  for (auto& op : immWaiting_) op->complete(why);
  immWaiting_.clear();
  updateProbeLocked();
}

// ---------------------------------------------------------------------------------------------
// Shutdown and introspection

void EndpointImpl::shutdown() { shutdown(Status(StatusCode::kCancelled, "the endpoint was shut down")); }

void EndpointImpl::shutdown(const Status& why) {
  std::vector<std::shared_ptr<OpState>> pending;
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown) return;
    // What completed before the shutdown is delivered first: an immediate or a message that
    // arrived, or a transfer the device finished, succeeds even when the shutdown follows at once
    // (a peer that leaves as soon as its WRITE_WITH_IMM completed: its goodbye can reach the agent
    // before the worker took the immediate from the queue). Errors are left to the shutdown's own
    // status.
    if (state_ == State::kConnected && cq_.valid()) drainCompletionsLocked(Drain::kSuccessesBeforeShutdown);
    state_ = State::kShutdown;
    wantsProbe_.store(false);
    for (auto& op : queue_) pending.push_back(op);
    queue_.clear();
    for (auto& qp : qps_) {
      for (auto& rec : qp->inflight) {
        if (rec.op) pending.push_back(std::move(rec.op));
      }
      qp->inflight.clear();
      qp->batch.clear();
      qp->sges.clear();
    }
    for (auto& [seq, op] : recvWaiting_) pending.push_back(op);
    recvWaiting_.clear();
    incoming_.clear();
    for (auto& op : immWaiting_) pending.push_back(op);
    immWaiting_.clear();
    immArrived_.clear();
    worker = std::move(worker_);
    if (worker) worker->detach(this);
    // The device stops touching memory before anyone hears of the cancellation: closing a queue
    // pair drops its work.
    for (auto& qp : qps_) qp->queuePair.close();
    cq_.close();
    recvMr_.close();
    channel_.close();
  }
  const Status failed = why.isOk() ? Status(StatusCode::kCancelled, "the endpoint was shut down") : why;
  for (auto& op : pending) op->complete(failed);
  pending.clear();
  worker.reset();  // a worker of the endpoint's own ends here
}

EndpointStats EndpointImpl::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EndpointStats s;
  s.operations = metrics_->snapshot();
  for (const auto& qp : qps_) {
    s.qps.push_back({.workRequests = qp->workRequests,
                     .bytes = qp->bytes,
                     .maxOutstanding = qp->maxOutstanding,
                     .receivesPosted = qp->receivesPosted});
  }
  s.operationsQueued = queue_.size();
  s.unexpectedBytes = unexpectedBytes_;
  s.immediatesQueued = immArrived_.size();
  s.workerWakeups = workerWakeups_;
  return s;
}

}  // namespace ferry::endpoint
