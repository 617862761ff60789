// Connector (connector.h): its life (start, the agent under it, shutdown), the agent messages it
// dispatches, how an operation ends (finish, a peer that is gone), and the public handles. The
// connector's threads and its other files are described in connector_impl.h.
#include "ferry/connect/connector.h"

#include <cstring>

#include "agent/crypto.h"
#include "common/log.h"
#include "connect/connector_impl.h"

namespace ferry::connect {

const char* operationStatusName(OperationStatus s) {
  switch (s) {
    case OperationStatus::kUninitialized: return "UNINITIALIZED";
    case OperationStatus::kInitialized: return "INITIALIZED";
    case OperationStatus::kInProgress: return "IN_PROGRESS";
    case OperationStatus::kComplete: return "COMPLETE";
    case OperationStatus::kCancelled: return "CANCELLED";
    case OperationStatus::kErrored: return "ERRORED";
  }
  return "?";
}

namespace {

// The DONE an owner sends the reader or writer that began its operation.
std::string doneText(const Connector::Impl::OpPtr& op, uint64_t peerOp, OperationStatus status,
                     const Status& why) {
  Message done = messageOf(MessageType::kDone, peerOp);
  done.code = why.code();
  if (status == OperationStatus::kCancelled) {
    done.code = StatusCode::kCancelled;
    done.reason = "the owner cancelled its " +
                  std::string(op->kind == OperationKind::kRead ? "readable" : "writable") + " operation";
  } else if (!why.isOk()) {
    done.reason = why.message();
  }
  return encodeMessage(done);
}

}  // namespace

Connector::Impl::~Impl() { stopClock(); }

uint64_t Connector::Impl::newIdLocked() {
  std::uniform_int_distribution<uint64_t> dist(1, kMaxExactId);
  for (;;) {
    uint64_t id = dist(rng);
    if (!passive.count(id) && !active.count(id) && !ended.count(id)) return id;
  }
}

Status Connector::Impl::checkBuffers(const std::vector<Buffer>& bufs, bool written, const char* what) const {
  if (bufs.empty()) return invalidArgument(std::string(what) + ": no descriptor");
  if (bufs.size() > kMaxDescriptors) {
    return invalidArgument(std::string(what) + ": " + std::to_string(bufs.size()) + " descriptors (at most " +
                           std::to_string(kMaxDescriptors) + ")");
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    const Buffer& b = bufs[i];
    std::string which = std::string(what) + ": descriptor " + std::to_string(i);
    if (b.addr == nullptr) return invalidArgument(which + " has a null address");
    if (b.length == 0) return invalidArgument(which + " is empty");
    if (reinterpret_cast<uintptr_t>(b.addr) > UINTPTR_MAX - b.length)
      return invalidArgument(which + " overflows");
    if (written && b.readOnly) {
      return invalidArgument(which + " is read-only memory, and this operation writes into it");
    }
  }
  return Status::ok();
}

Status Connector::Impl::registerBuffers(const OpPtr& op, ep::RegionOptions base) {
  std::vector<std::string> names;
  for (size_t i = 0; i < op->buffers.size(); ++i) {
    std::string name = "~connect." + std::to_string(op->id) + "." + std::to_string(i);
    ep::RegionOptions o = base;
    o.owner = op->buffers[i].owner;
    o.published = false;
    Status st = agent->registerMemoryRegion(name, op->buffers[i].addr, op->buffers[i].length, o);
    if (!st.isOk()) {
      for (const auto& n : names) (void)agent->unregisterMemoryRegion(n);
      return st;
    }
    names.push_back(std::move(name));
  }
  op->regions = std::move(names);
  return Status::ok();
}

bool Connector::Impl::finish(const OpPtr& op, OperationStatus status, Status why) {
  std::vector<std::string> regions;
  std::shared_ptr<ep::Endpoint> endpoint;
  std::vector<ep::MrHandle> remote;
  std::shared_ptr<agent::PeerConnection> peer;
  uint64_t peerOp = 0;
  bool tellOwner = false, tellPeer = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (op->ended) return false;
    op->ended = true;
    op->status = status;
    op->error = why;
    regions.swap(op->regions);
    endpoint = op->endpoint;
    remote.swap(op->remote);
    peer = op->peer;
    peerOp = op->peerOp;
    if (op->passive) {
      passive.erase(op->id);
      ended[op->id] = Ended{.expires = op->metadata.expires, .status = status};
      tellPeer = peer != nullptr;  // the reader or writer waits for DONE
    } else {
      active.erase(op->id);
      // A reader or writer that stops before the owner answered tells it (the owner stops).
      tellOwner = op->beginSent && status != OperationStatus::kComplete && !op->ownerStopped &&
                  why.code() != StatusCode::kPeerGone;
    }
    if (status == OperationStatus::kComplete)
      ++stats.completed;
    else if (status == OperationStatus::kCancelled)
      ++stats.cancelled;
    else
      ++stats.errored;
  }
  {
    std::lock_guard<std::mutex> lock(clockMu);
    expiries.erase({op->expiryDue, op->id});
  }
  for (const auto& name : regions) (void)agent->unregisterMemoryRegion(name);
  if (endpoint) {
    for (auto h : remote) (void)endpoint->unregisterRemoteMemoryRegion(h);
  }
  if (tellPeer && why.code() != StatusCode::kPeerGone) {
    (void)peer->sendMessage(kChannel, doneText(op, peerOp, status, why));
  }
  if (tellOwner) {
    Message cancel = messageOf(MessageType::kCancel, op->id);
    cancel.operation = op->metadata.operation;
    (void)peer->sendMessage(kChannel, encodeMessage(cancel));
  }
  op->done->complete(status == OperationStatus::kComplete ? Status::ok() : why, 0, op->bytes.load());
  cv.notify_all();
  return true;
}

void Connector::Impl::peerClosed(const std::string& uuid, const Status& why) {
  std::vector<OpPtr> hit;
  {
    std::lock_guard<std::mutex> lock(mu);
    watched.erase(uuid);
    for (auto* table : {&passive, &active}) {
      for (auto& [id, op] : *table) {
        if (op->peerUuid == uuid) hit.push_back(op);
      }
    }
  }
  for (auto& op : hit) {
    std::string who =
        "worker '" + (op->passive ? op->peerAlias + "' (which began it)" : op->metadata.worker + "'");
    finish(op, OperationStatus::kErrored, Status(StatusCode::kPeerGone, who + " is gone: " + why.message()));
  }
}

void Connector::Impl::watchLocked(const std::shared_ptr<agent::PeerConnection>& peer,
                                  const std::string& uuid) {
  if (uuid.empty() || !watched.insert(uuid).second) return;
  std::weak_ptr<Impl> weak = weak_from_this();
  peer->closed().state()->onDone([weak, uuid](const Completion& d) {
    Status why = d.status();
    if (auto self = weak.lock())
      self->agent->post([weak, uuid, why] {
        if (auto s = weak.lock()) s->peerClosed(uuid, why);
      });
  });
}

void Connector::Impl::onMessage(const std::shared_ptr<agent::PeerConnection>& from, std::string_view body) {
  auto m = decodeMessage(body);
  if (!m.isOk()) {
    FERRY_LOG(kWarn, "connector '%s': refused a message from '%s': %s", agent->alias().c_str(),
              from->peerAlias().c_str(), m.status().toString().c_str());
    std::lock_guard<std::mutex> lock(mu);
    ++stats.refused;
    return;
  }
  switch (m->type) {
    case MessageType::kBegin: onBegin(from, *m); break;
    case MessageType::kStarted: onStarted(from, *m); break;
    case MessageType::kDone: onDone(from, *m); break;
    case MessageType::kCancel: onCancel(from, *m); break;
  }
}

void Connector::Impl::shutdown() {
  std::vector<OpPtr> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (shut) return;
    shut = true;
    for (auto* table : {&passive, &active}) {
      for (auto& [id, op] : *table) all.push_back(op);
    }
  }
  stopClock();
  for (auto& op : all) {
    finish(op, OperationStatus::kErrored, Status(StatusCode::kCancelled, "the connector was shut down"));
  }
  agent->onMessage(kChannel, nullptr);
  agent->shutdown();
}

// ---------------------------------------------------------------------------------------------
// Operation

Operation::~Operation() {
  if (state_ && !state_->done->done()) cancel();
}

uint64_t Operation::id() const { return state_->id; }
OperationKind Operation::kind() const { return state_->kind; }
bool Operation::passive() const { return state_->passive; }

OperationStatus Operation::status() const {
  auto c = state_->connector.lock();
  if (!c) return state_->done->done() ? (state_->status) : OperationStatus::kErrored;
  std::lock_guard<std::mutex> lock(c->mu);
  return state_->status;
}

Status Operation::error() const {
  auto c = state_->connector.lock();
  if (!c)
    return state_->done->done() ? state_->done->status()
                                : Status(StatusCode::kCancelled, "the connector is gone");
  std::lock_guard<std::mutex> lock(c->mu);
  if (!state_->ended) return state_->error;
  return state_->status == OperationStatus::kComplete ? Status::ok() : state_->error;
}

ep::Future Operation::completion() const { return ep::Future(state_->done); }

Result<std::string> Operation::metadata() const {
  if (!state_->passive)
    return invalidArgument("metadata(): only readable and writable operations have metadata");
  return state_->metadataText;
}

uint64_t Operation::bytes() const { return state_->bytes.load(); }

void Operation::cancel() {
  if (auto c = state_->connector.lock()) c->cancel(state_);
}

// ---------------------------------------------------------------------------------------------
// Connector

Result<std::shared_ptr<Connector>> Connector::start(ConnectorOptions options) {
  if (options.chunkBytes < 4096 || options.chunkBytes > (uint64_t{1} << 30)) {
    return invalidArgument("Connector: chunk_bytes must be in [4 KiB, 1 GiB]");
  }
  if (options.window < 1 || options.window > 256)
    return invalidArgument("Connector: window must be in [1, 256]");
  if (options.metadataTtl.count() <= 0)
    return invalidArgument("Connector: the metadata TTL must be positive");
  if (options.cancelGrace.count() < 0) return invalidArgument("Connector: cancel_grace must not be negative");
  auto impl = std::make_shared<Impl>();
  impl->opts = options;
  agent::AgentOptions a;
  a.alias = options.workerId.empty() ? "connector-" + agent::randomHex(4) : options.workerId;
  a.store = options.store;
  a.scope = options.scope;
  a.devices = options.devices;
  a.listenHost = options.listenHost;
  a.secret = options.secret;
  a.lanes = options.lanes;
  a.connectTimeout = options.connectTimeout;
  FERRY_ASSIGN_OR_RETURN(impl->agent, agent::Agent::start(std::move(a)));
  impl->nameSpace = options.scope;
  impl->key = agent::randomHex(32);
  impl->startClock();
  std::weak_ptr<Impl> weak = impl;
  impl->agent->onMessage(kChannel,
                         [weak](std::shared_ptr<agent::PeerConnection> from, std::string_view body) {
                           if (auto self = weak.lock()) self->onMessage(from, body);
                         });
  return std::make_shared<Connector>(impl);
}

Connector::~Connector() { shutdown(); }
void Connector::shutdown() { impl_->shutdown(); }

Result<std::shared_ptr<Operation>> Connector::createReadable(std::vector<Buffer> local) {
  return impl_->create(OperationKind::kRead, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::createWritable(std::vector<Buffer> local) {
  return impl_->create(OperationKind::kWrite, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::beginRead(std::string_view remoteMetadata,
                                                        std::vector<Buffer> local) {
  return impl_->begin(OperationKind::kRead, remoteMetadata, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::beginWrite(std::vector<Buffer> local,
                                                         std::string_view remoteMetadata) {
  return impl_->begin(OperationKind::kWrite, remoteMetadata, std::move(local));
}

const std::string& Connector::name() const { return impl_->agent->alias(); }
const std::string& Connector::nameSpace() const { return impl_->nameSpace; }
const std::shared_ptr<agent::Agent>& Connector::agent() const { return impl_->agent; }

ConnectorStats Connector::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ConnectorStats s = impl_->stats;
  s.created = impl_->stats.created;
  s.live = impl_->passive.size() + impl_->active.size();
  return s;
}

}  // namespace ferry::connect
