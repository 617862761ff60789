// One connection to a peer: its state, the queue of operations waiting for the wireup, and the
// PeerConnection façade (agent.h).
#include <set>
#include <variant>

#include "agent/agent_impl.h"
#include "common/log.h"

namespace ferry::agent {

namespace ep = ferry::endpoint;

PeerImpl::PeerImpl(std::weak_ptr<AgentImpl> agent, std::string alias, size_t numQp)
    : agent_(std::move(agent)),
      alias_(std::move(alias)),
      numQp_(numQp),
      readyOp_(std::make_shared<Completion>()),
      goneOp_(std::make_shared<Completion>()) {
  lastHeard = Clock::now();
  lastPing = lastHeard;
}

std::string PeerImpl::alias() const { return alias_; }

PeerImpl::State PeerImpl::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool PeerImpl::retired() const { return state() == State::kFailed; }

Status PeerImpl::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::optional<WorkerAddress> PeerImpl::remote() const {
  std::lock_guard<std::mutex> lock(mu_);
  return remote_;
}

std::optional<LaneSet> PeerImpl::lanes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lanes_;
}

std::shared_ptr<ep::Endpoint> PeerImpl::endpointOf(OpClass c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kReady ? byClass_[static_cast<int>(c)] : nullptr;
}

void PeerImpl::setRemote(WorkerAddress address, LaneSet lanes) {
  std::lock_guard<std::mutex> lock(mu_);
  remote_ = std::move(address);
  lanes_ = std::move(lanes);
  bindClassesLocked();
}

void PeerImpl::setEndpoints(std::map<std::string, std::shared_ptr<ep::Endpoint>> byDevice) {
  std::lock_guard<std::mutex> lock(mu_);
  endpoints_ = std::move(byDevice);
  bindClassesLocked();
}

bool PeerImpl::endpointsMatchLanes() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lanes_ || endpoints_.empty()) return false;
  std::set<std::string> needed;
  for (const auto& lane : lanes_->lanes) needed.insert(lane.localDevice);
  if (needed.size() != endpoints_.size()) return false;
  for (const auto& device : needed) {
    if (!endpoints_.count(device)) return false;
  }
  return true;
}

void PeerImpl::bindClassesLocked() {
  for (int i = 0; i < kNumOpClasses; ++i) {
    auto it = lanes_ ? endpoints_.find(lanes_->lanes[i].localDevice) : endpoints_.end();
    byClass_[i] = it == endpoints_.end() ? nullptr : it->second;
  }
}

void PeerImpl::setState(State s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kFailed) state_ = s;
}

void PeerImpl::becomeReady() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kFailed || state_ == State::kReady) return;
    state_ = State::kReady;
    drainLocked();
  }
  readyOp_->complete(Status::ok());
}

void PeerImpl::fail(const Status& why) {
  std::deque<PendingOp> queued;
  std::map<std::string, std::shared_ptr<ep::Endpoint>> endpoints;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kFailed) return;
    state_ = State::kFailed;
    failure_ = why;
    queued.swap(queue_);
    endpoints = endpoints_;
  }
  // Operations already on an endpoint fail with the same status when it shuts down.
  for (auto& [device, e] : endpoints) e->shutdown(why);
  for (auto& op : queued) op.outer->complete(why);
  readyOp_->complete(why);
  goneOp_->complete(why);
}

namespace {

// Name-to-handle lookups of one call, remembering the last name on each side: a batch names the
// same regions over and over.
class HandleResolver {
 public:
  explicit HandleResolver(const ep::Endpoint& e) : e_(e) {}
  Result<ep::MrHandle> local(const RegionRef& r) { return resolve(r, false, lastLocal_); }
  Result<ep::MrHandle> remote(const RegionRef& r) { return resolve(r, true, lastRemote_); }

 private:
  struct Last {
    const std::string* name = nullptr;
    ep::MrHandle handle = 0;
  };
  Result<ep::MrHandle> resolve(const RegionRef& r, bool remote, Last& last) {
    const auto* name = std::get_if<std::string>(&r);
    if (name == nullptr) return std::get<ep::MrHandle>(r);
    if (last.name != nullptr && *last.name == *name) return last.handle;
    auto h = remote ? e_.remoteHandle(*name) : e_.localHandle(*name);
    if (h.isOk()) last = {name, *h};
    return h;
  }
  const ep::Endpoint& e_;
  Last lastLocal_, lastRemote_;
};

OpClass classOf(ep::OpKind kind) {
  return kind == ep::OpKind::kRead || kind == ep::OpKind::kWrite ? OpClass::kRma : OpClass::kMessages;
}

}  // namespace

Result<std::shared_ptr<Completion>> PeerImpl::postLocked(const OpRequest& op, std::string* missing) {
  OpClass cls = classOf(op.kind);
  const std::shared_ptr<ep::Endpoint>& e = byClass_[static_cast<int>(cls)];
  if (!e)
    return Status(StatusCode::kInternal, "no endpoint for the " + std::string(opClassName(cls)) + " lane");
  HandleResolver names(*e);
  switch (op.kind) {
    case ep::OpKind::kRead:
    case ep::OpKind::kWrite:
    case ep::OpKind::kWriteWithImm: {
      std::vector<ep::Assignment> batch;
      batch.reserve(op.batch.size());
      for (const auto& a : op.batch) {
        FERRY_ASSIGN_OR_RETURN(ep::MrHandle local, names.local(a.local));
        auto remote = names.remote(a.remote);
        if (!remote.isOk()) {
          if (const auto* name = std::get_if<std::string>(&a.remote)) *missing = *name;
          return remote.status();
        }
        batch.push_back({.local = local,
                         .remote = *remote,
                         .localOffset = a.localOffset,
                         .remoteOffset = a.remoteOffset,
                         .length = a.length});
      }
      Result<ep::ReadWriteFuture> f = op.kind == ep::OpKind::kRead    ? e->read(batch)
                                      : op.kind == ep::OpKind::kWrite ? e->write(batch)
                                                                      : e->writeWithImm(batch, op.imm);
      if (!f.isOk()) return f.status();
      return f->state();
    }
    case ep::OpKind::kSend:
    case ep::OpKind::kRecv: {
      std::vector<ep::Chunk> chunks;
      chunks.reserve(op.chunks.size());
      for (const auto& c : op.chunks) {
        FERRY_ASSIGN_OR_RETURN(ep::MrHandle h, names.local(c.region));
        chunks.push_back({.mr = h, .offset = c.offset, .length = c.length});
      }
      if (op.kind == ep::OpKind::kSend) {
        auto f = e->send(chunks);
        if (!f.isOk()) return f.status();
        return f->state();
      }
      auto f = e->recv(chunks);
      if (!f.isOk()) return f.status();
      return f->state();
    }
    case ep::OpKind::kImmRecv: {
      auto f = e->immRecv();
      if (!f.isOk()) return f.status();
      return f->state();
    }
  }
  return Status(StatusCode::kInternal, "unknown operation kind");
}

void PeerImpl::drainLocked() {
  while (!queue_.empty() && state_ == State::kReady && queryId == 0) {
    PendingOp& op = queue_.front();
    std::string missing;
    auto inner = postLocked(op.request(), &missing);
    if (!inner.isOk() && !missing.empty()) {
      // Ask the peer for the region; the queue waits behind this operation (order is kept).
      if (auto agent = agent_.lock()) {
        queryName = missing;
        queryId = ~uint64_t{0};  // claimed; the agent's loop sets the real number
        std::weak_ptr<PeerImpl> weak = weak_from_this();
        agent->loop().post([agent, weak, missing] {
          if (auto p = weak.lock()) agent->queryRegion(p, missing);
        });
        return;
      }
    }
    std::shared_ptr<Completion> outer = op.outer;
    queue_.pop_front();
    if (!inner.isOk()) {
      outer->complete(inner.status());
      continue;
    }
    (*inner)->onDone(
        [outer](const Completion& done) { outer->complete(done.status(), done.immData(), done.bytes()); });
  }
}

void PeerImpl::regionAnswered(const std::string& name, const std::optional<std::string>& info) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queryId == 0 || name != queryName) return;
  queryId = 0;
  queryName.clear();
  if (info) {
    auto parsed = json::parse(*info);
    for (auto& [device, e] : endpoints_) {
      if (!parsed.isOk() || !lanes_) break;
      // The entry of the peer's device this endpoint is connected to.
      for (const auto& lane : lanes_->lanes) {
        if (lane.localDevice != device) continue;
        if (const json::Value* entry = parsed->find(lane.remoteDevice)) {
          (void)e->registerRemoteMemoryRegion(name, json::serialize(*entry));
        }
        break;
      }
    }
  }
  // The front operation either resolves now or fails with the endpoint's kNotFound.
  if (!queue_.empty() && state_ == State::kReady) {
    std::string missing;
    PendingOp op = std::move(queue_.front());
    queue_.pop_front();
    auto inner = postLocked(op.request(), &missing);
    if (!inner.isOk()) {
      op.outer->complete(Status(StatusCode::kNotFound, "agent '" + alias_ + "' has no memory region named '" +
                                                           (missing.empty() ? name : missing) + "'"));
    } else {
      auto outer = op.outer;
      (*inner)->onDone([outer](const Completion& d) { outer->complete(d.status(), d.immData(), d.bytes()); });
    }
  }
  drainLocked();
}

// An endpoint failed (the peer died, or refused an access): this connection is over; the caller's
// next operation wires up anew.
Status PeerImpl::retireAfter(const Status& failed) {
  Status why(StatusCode::kPeerGone, "the connection to '" + alias_ + "' failed: " + failed.message());
  if (auto agent = agent_.lock()) agent->retire(shared_from_this());
  return why;
}

Status PeerImpl::retireIfEndpointFailed() {
  Status failed = Status::ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kReady) return Status::ok();
    for (const auto& e : byClass_) {
      if (!e || !failed.isOk()) continue;
      failed = e->failure();
      if (failed.isOk() && e->isShutdown())
        failed = Status(StatusCode::kPeerGone, "its endpoint was shut down");
    }
  }
  return failed.isOk() ? failed : retireAfter(failed);
}

Result<std::shared_ptr<Completion>> PeerImpl::submit(const OpRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::kFailed) return failure_;
  if (state_ == State::kReady && queue_.empty() && queryId == 0) {
    const auto& e = byClass_[static_cast<int>(classOf(request.kind))];
    Status failed = e ? e->failure() : Status::ok();
    if (!failed.isOk()) {
      lock.unlock();
      return retireAfter(failed);
    }
    std::string missing;
    auto inner = postLocked(request, &missing);
    if (inner.isOk() || missing.empty()) return inner;
    // A remote region not known yet: queue the operation and ask the peer.
  }
  PendingOp op;
  op.kind = request.kind;
  op.batch.assign(request.batch.begin(), request.batch.end());
  op.chunks.assign(request.chunks.begin(), request.chunks.end());
  op.imm = request.imm;
  if (auto agent = agent_.lock()) {
    std::lock_guard<std::mutex> statsLock(agent->statsMu());
    ++agent->mutableStats().operationsQueued;
  }
  return enqueueLocked(std::move(op));
}

void PeerImpl::handOver(const std::shared_ptr<PeerImpl>& successor, const std::string& why) {
  std::deque<PendingOp> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
    state_ = State::kFailed;
    failure_ = Status(StatusCode::kPeerGone, why);
  }
  for (auto& op : queued) successor->adopt(std::move(op));
  std::shared_ptr<Completion> mine = readyOp_;
  successor->readyOp()->onDone([mine](const Completion& d) { mine->complete(d.status()); });
  std::shared_ptr<Completion> gone = goneOp_;
  successor->goneOp()->onDone([gone](const Completion& d) { gone->complete(d.status()); });
}

void PeerImpl::adopt(PendingOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kFailed) {
    op.outer->complete(failure_);
    return;
  }
  enqueueLocked(std::move(op));
}

std::shared_ptr<Completion> PeerImpl::enqueueLocked(PendingOp op) {
  if (!op.outer) op.outer = std::make_shared<Completion>();
  std::shared_ptr<Completion> outer = op.outer;
  queue_.push_back(std::move(op));
  if (state_ == State::kReady) drainLocked();
  return outer;
}

// ---- PeerConnection ----

std::shared_ptr<PeerImpl> PeerConnection::currentImpl() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_;
}

std::shared_ptr<PeerImpl> PeerConnection::impl() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_->retired()) {
    if (auto agent = impl_->agentImpl()) {
      Result<std::shared_ptr<PeerImpl>> next =
          impl_->addressBytes.empty() ? agent->peerByAlias(impl_->alias(), impl_->numQp(), true)
                                      : agent->peerByAddress(impl_->addressBytes, impl_->numQp());
      if (next.isOk()) impl_ = *next;
    }
  }
  return impl_;
}

std::string PeerConnection::peerAlias() const {
  auto p = currentImpl();
  auto r = p->remote();
  return r && !r->alias.empty() ? r->alias : p->alias();
}

bool PeerConnection::isConnected() const { return currentImpl()->state() == PeerImpl::State::kReady; }

// The wireup as it is: a failed one reports its failure (the next operation starts another).
Status PeerConnection::waitReady(std::chrono::milliseconds timeout) const {
  return currentImpl()->readyOp()->waitUntil(Completion::Clock::now() + timeout);
}

Status PeerConnection::retireIfFailed() { return currentImpl()->retireIfEndpointFailed(); }

ep::Future PeerConnection::ready() const { return ep::Future(currentImpl()->readyOp()); }

std::shared_ptr<ep::Endpoint> PeerConnection::endpoint(OpClass c) const {
  return currentImpl()->endpointOf(c);
}

Result<LaneSet> PeerConnection::lanes() const {
  auto l = currentImpl()->lanes();
  if (!l)
    return Status(StatusCode::kUnavailable,
                  "the lanes to '" + peerAlias() + "' are not chosen yet (its address is not known)");
  return *l;
}

std::string PeerConnection::peerUuid() const {
  auto r = currentImpl()->remote();
  return r ? uuidText(r->uuid) : std::string();
}

namespace {

Status checkBatch(AgentImpl& agent, std::span<const NamedAssignment> batch, bool localWritten) {
  if (batch.empty()) return invalidArgument("the batch is empty");
  for (size_t i = 0; i < batch.size(); ++i) {
    Status st = agent.checkLocalRange(batch[i].local, batch[i].localOffset, batch[i].length, localWritten);
    if (!st.isOk()) return invalidArgument("assignment " + std::to_string(i) + ": " + st.message());
    if (batch[i].remoteOffset > UINT64_MAX - batch[i].length) {
      return invalidArgument("assignment " + std::to_string(i) + ": remote offset + length overflows");
    }
  }
  return Status::ok();
}

Status checkChunks(AgentImpl& agent, std::span<const NamedChunk> chunks, bool written) {
  if (chunks.empty()) return invalidArgument("no chunks");
  for (size_t i = 0; i < chunks.size(); ++i) {
    Status st = agent.checkLocalRange(chunks[i].region, chunks[i].offset, chunks[i].length, written);
    if (!st.isOk()) return invalidArgument("chunk " + std::to_string(i) + ": " + st.message());
  }
  return Status::ok();
}

template <typename F>
Result<F> run(const PeerConnection& c, const OpRequest& request) {
  auto impl = c.impl();
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Completion> state, impl->submit(request));
  return F(std::move(state));
}

}  // namespace

Result<ep::ReadWriteFuture> PeerConnection::read(std::span<const NamedAssignment> batch) {
  auto agent = impl()->agentImpl();
  if (!agent) return closedError("read: the agent was shut down");
  FERRY_RETURN_IF_ERROR(checkBatch(*agent, batch, true));
  return run<ep::ReadWriteFuture>(
      *this, OpRequest{.kind = ep::OpKind::kRead, .batch = batch, .chunks = {}, .imm = 0});
}

Result<ep::ReadWriteFuture> PeerConnection::write(std::span<const NamedAssignment> batch) {
  auto agent = impl()->agentImpl();
  if (!agent) return closedError("write: the agent was shut down");
  FERRY_RETURN_IF_ERROR(checkBatch(*agent, batch, false));
  return run<ep::ReadWriteFuture>(
      *this, OpRequest{.kind = ep::OpKind::kWrite, .batch = batch, .chunks = {}, .imm = 0});
}

Result<ep::ReadWriteFuture> PeerConnection::writeWithImm(std::span<const NamedAssignment> batch,
                                                         uint32_t immData) {
  auto agent = impl()->agentImpl();
  if (!agent) return closedError("write_with_imm: the agent was shut down");
  FERRY_RETURN_IF_ERROR(checkBatch(*agent, batch, false));
  return run<ep::ReadWriteFuture>(
      *this, OpRequest{.kind = ep::OpKind::kWriteWithImm, .batch = batch, .chunks = {}, .imm = immData});
}

Result<ep::SendFuture> PeerConnection::send(std::span<const NamedChunk> chunks) {
  auto agent = impl()->agentImpl();
  if (!agent) return closedError("send: the agent was shut down");
  FERRY_RETURN_IF_ERROR(checkChunks(*agent, chunks, false));
  return run<ep::SendFuture>(*this,
                             OpRequest{.kind = ep::OpKind::kSend, .batch = {}, .chunks = chunks, .imm = 0});
}

Result<ep::RecvFuture> PeerConnection::recv(std::span<const NamedChunk> chunks) {
  auto agent = impl()->agentImpl();
  if (!agent) return closedError("recv: the agent was shut down");
  FERRY_RETURN_IF_ERROR(checkChunks(*agent, chunks, true));
  return run<ep::RecvFuture>(*this,
                             OpRequest{.kind = ep::OpKind::kRecv, .batch = {}, .chunks = chunks, .imm = 0});
}

ep::Future PeerConnection::closed() const { return ep::Future(currentImpl()->goneOp()); }

Status PeerConnection::sendMessage(std::string_view channel, std::string_view body) {
  if (channel.empty() || channel.size() > kMaxChannel) {
    return invalidArgument("send_message: the channel is empty or longer than " +
                           std::to_string(kMaxChannel) + " bytes");
  }
  if (body.size() > kMaxWireupLine / 2) {
    return invalidArgument("send_message: a body of " + std::to_string(body.size()) +
                           " bytes is longer than " + std::to_string(kMaxWireupLine / 2));
  }
  auto impl = currentImpl();
  auto agent = impl->agentImpl();
  auto remote = impl->remote();
  if (!agent) return Status(StatusCode::kCancelled, "send_message: the agent was shut down");
  if (impl->state() != PeerImpl::State::kReady || !remote) {
    if (impl->retired()) return impl->failure();
    return Status(StatusCode::kUnavailable,
                  "send_message: the connection to '" + impl->alias() + "' is not ready");
  }
  agent->sendMessage(*remote, channel, body);
  return Status::ok();
}

Result<ep::ImmRecvFuture> PeerConnection::immRecv() {
  return run<ep::ImmRecvFuture>(*this,
                                OpRequest{.kind = ep::OpKind::kImmRecv, .batch = {}, .chunks = {}, .imm = 0});
}

}  // namespace ferry::agent
