// Readable and writable operations, owner side: create_readable / create_writable issue the
// metadata, and a BEGIN that carries it is checked (tag, expiry, state, sizes) before the owner
// starts moving the bytes (chunk_pump.cc). A peer's CANCEL stops it.

#include <cstring>

#include "agent/crypto.h"
#include "common/cuda_driver.h"
#include "common/json.h"
#include "common/log.h"
#include "connect/connector_impl.h"

namespace ferry::connect {

Result<std::shared_ptr<Operation>> Connector::Impl::create(OperationKind kind, std::vector<Buffer> bufs) {
  const char* what = kind == OperationKind::kRead ? "create_readable" : "create_writable";
  FERRY_RETURN_IF_ERROR(checkBuffers(bufs, kind == OperationKind::kWrite, what));
  auto op = std::make_shared<Operation::State>();
  op->connector = weak_from_this();
  op->kind = kind;
  op->passive = true;
  op->buffers = std::move(bufs);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (shut) return Status(StatusCode::kClosed, std::string(what) + ": the connector was shut down");
    op->id = newIdLocked();
    sweepLocked();
  }
  // The owner's memory is reached by its own device only: no remote access.
  ep::RegionOptions o;
  o.writable = kind == OperationKind::kWrite;
  o.remote = ep::RegionOptions::Remote::kNone;
  FERRY_RETURN_IF_ERROR(registerBuffers(op, o));
  Metadata& md = op->metadata;
  md.kind = kind;
  md.worker = agent->alias();
  md.address = agent->address();
  md.operation = op->id;
  {
    std::lock_guard<std::mutex> lock(mu);
    char raw[16];
    for (int i = 0; i < 16; i += 8) {
      uint64_t v = rng();
      std::memcpy(raw + i, &v, 8);
    }
    md.nonce = agent::hexOf(std::string_view(raw, 16));
  }
  md.expires = nowMs() + opts.metadataTtl.count();
  for (const auto& b : op->buffers) {
    const MemoryLocation where = cuda::locate(b.addr);
    md.descriptors.push_back({.size = b.length, .device = where.onDevice() ? where.toString() : "cpu"});
    op->total += b.length;
  }
  md.tag = agent::hmacSha256Hex(key, canonicalText(md));
  op->metadataText = encodeMetadata(md);
  {
    std::lock_guard<std::mutex> lock(mu);
    op->status = OperationStatus::kInitialized;
    passive[op->id] = op;
    ++stats.created;
  }
  // One millisecond late: the owner accepts a BEGIN until now > expires.
  expireAt(op, md.expires, std::chrono::milliseconds(1));
  return std::make_shared<Operation>(op);
}

void Connector::Impl::sweepLocked() {
  if (ended.size() < sweepAt) return;
  int64_t now = nowMs();
  for (auto it = ended.begin(); it != ended.end();) {
    it = it->second.expires < now ? ended.erase(it) : std::next(it);
  }
  sweepAt = std::max<size_t>(1024, ended.size() * 2);
}

void Connector::Impl::refuse(const std::shared_ptr<agent::PeerConnection>& from, uint64_t id,
                             const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    ++stats.refused;
  }
  FERRY_LOG(kInfo, "connector '%s': refused a BEGIN from '%s': %s", agent->alias().c_str(),
            from->peerAlias().c_str(), why.toString().c_str());
  Message done = messageOf(MessageType::kDone, id);
  done.code = why.code();
  done.reason = why.message();
  (void)from->sendMessage(kChannel, encodeMessage(done));
}

// The metadata's tag and expiry, checked before any table is looked at.
Status Connector::Impl::checkBeginTag(const Metadata& md) const {
  auto denied = [](const std::string& why) { return Status(StatusCode::kPermissionDenied, why); };
  if (!agent::constantTimeEqual(md.tag, agent::hmacSha256Hex(key, canonicalText(md)))) {
    return denied("the metadata's tag does not match: the text was changed, or it is not from worker '" +
                  agent->alias() + "' (this life of it)");
  }
  // Expired first: an operation that no peer began ended at its expiry.
  if (nowMs() > md.expires) {
    return denied("the metadata of operation " + std::to_string(md.operation) + " expired " +
                  std::to_string(nowMs() - md.expires) + " ms ago");
  }
  return Status::ok();
}

// The operation a BEGIN names, if it may start now: still INITIALIZED, the same nonce, the same
// sizes, over a connection that has not failed.
Result<Connector::Impl::OpPtr> Connector::Impl::beginTargetLocked(
    const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
  const Metadata& md = m.metadata;
  auto denied = [](const std::string& why) { return Status(StatusCode::kPermissionDenied, why); };
  auto it = passive.find(md.operation);
  if (it == passive.end()) {
    auto e = ended.find(md.operation);
    if (e != ended.end()) {
      return denied("operation " + std::to_string(md.operation) + " of worker '" + agent->alias() +
                    "' has ended (" + operationStatusName(e->second.status) +
                    "): its metadata was used once already");
    }
    return notFound("worker '" + agent->alias() + "' has no operation " + std::to_string(md.operation));
  }
  OpPtr op = it->second;
  if (op->metadata.nonce != md.nonce)
    return denied("the metadata does not match operation " + std::to_string(md.operation));
  if (op->status != OperationStatus::kInitialized) {
    return Status(StatusCode::kBusy, "operation " + std::to_string(md.operation) + " is already " +
                                         operationStatusName(op->status));
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    if (m.buffers[i].length != op->buffers[i].length) {
      return invalidArgument("descriptor " + std::to_string(i) + ": " + std::to_string(m.buffers[i].length) +
                             " bytes for " + std::to_string(op->buffers[i].length));
    }
  }
  if (Status failed = from->retireIfFailed(); !failed.isOk()) {
    return failed;  // the peer's next operation wires up anew
  }
  return op;
}

// The peer's buffers of this operation as remote regions of the endpoint, and ours as local
// handles, in descriptor order. Stops at the first failure (the caller revokes what was added).
Status Connector::Impl::exposePeerBuffersLocked(const OpPtr& op,
                                                const std::shared_ptr<agent::PeerConnection>& from,
                                                const Message& m,
                                                const std::shared_ptr<ep::Endpoint>& endpoint,
                                                std::vector<ep::MrHandle>& local,
                                                std::vector<ep::MrHandle>& remote) {
  std::string prefix = "~connect." + from->peerUuid() + "." + std::to_string(m.id) + ".";
  Status bad;
  for (size_t i = 0; i < m.buffers.size() && bad.isOk(); ++i) {
    json::Value info = json::Value::emptyObject();
    info.set("addr", static_cast<int64_t>(m.buffers[i].addr));
    info.set("length", static_cast<int64_t>(m.buffers[i].length));
    info.set("rkey", static_cast<int64_t>(m.buffers[i].rkey));
    info.set("writable", op->kind == OperationKind::kRead);
    auto r = endpoint->registerRemoteMemoryRegion(prefix + std::to_string(i), json::serialize(info));
    auto l = endpoint->localHandle(op->regions[i]);
    if (!r.isOk())
      bad = r.status();
    else
      remote.push_back(*r);
    if (!l.isOk())
      bad = l.status();
    else
      local.push_back(*l);
  }
  return bad;
}

void Connector::Impl::onBegin(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
  if (Status st = checkBeginTag(m.metadata); !st.isOk()) return refuse(from, m.id, st);
  std::unique_lock<std::mutex> lock(mu);
  auto found = beginTargetLocked(from, m);
  if (!found.isOk()) {
    lock.unlock();
    return refuse(from, m.id, found.status());
  }
  OpPtr op = *found;
  auto endpoint = from->endpoint(agent::OpClass::kRma);
  if (!endpoint) {
    lock.unlock();
    return refuse(from, m.id, Status(StatusCode::kUnavailable, "no connection to the peer's endpoint"));
  }
  std::vector<ep::MrHandle> local, remote;
  Status bad = exposePeerBuffersLocked(op, from, m, endpoint, local, remote);
  if (!bad.isOk()) {
    lock.unlock();
    for (auto h : remote) (void)endpoint->unregisterRemoteMemoryRegion(h);
    return refuse(from, m.id, bad);
  }
  op->status = OperationStatus::kInProgress;
  op->peer = from;
  op->peerUuid = from->peerUuid();
  op->peerAlias = from->peerAlias();
  op->peerOp = m.id;
  op->endpoint = endpoint;
  op->local = std::move(local);
  op->remote = std::move(remote);
  ++stats.served;
  watchLocked(from, op->peerUuid);
  // Before any DONE (the channel is ordered): the reader or writer stops watching the expiry.
  (void)from->sendMessage(kChannel, encodeMessage(messageOf(MessageType::kStarted, m.id)));
  pumpLocked(op, lock);
}

void Connector::Impl::onCancel(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = passive.find(m.operation);
  if (it == passive.end()) return;  // ended already: DONE went out
  OpPtr op = it->second;
  if (op->peerOp != m.id || op->peerUuid != from->peerUuid()) return;  // not the peer that began it
  op->stopping = true;
  op->peerCancelled = true;  // pumpLocked ends the operation when its last batch is in
  op->stopReason = Status(StatusCode::kCancelled,
                          "the peer cancelled its " + std::string(kindVerb(op->kind)) + " operation");
  pumpLocked(op, lock);
}

}  // namespace ferry::connect
