#include "ferry/endpoint/endpoint.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "common/clock.h"
#include "common/json.h"
#include "ferry/common/config.h"
#include "common/log.h"
#include "endpoint/lane.h"
#include "endpoint/metadata.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

// Receive work requests carry this bit in their wrId (send work requests carry their sequence).
constexpr uint64_t kRecvWrFlag = uint64_t{1} << 63;
// A message travels as SEND_WITH_IMM fragments; the immediate holds the message number (31 bits)
// and whether the fragment is the message's last.
constexpr uint32_t kLastFragment = uint32_t{1} << 31;
constexpr uint32_t kMessageSeqMask = kLastFragment - 1;
// A send work request is signaled at least this often (and the last of every post).
constexpr uint32_t kSignalEvery = 16;
constexpr uint32_t kMaxSendSge = 8;
constexpr uint32_t kQpAccess = v::access::kLocalWrite | v::access::kRemoteWrite | v::access::kRemoteRead;

Status protocolError(const std::string& what) { return Status(StatusCode::kProtocolError, what); }

// peerGone: report a queue pair that gave up on the peer, and the work flushed after it, as
// kPeerGone (EndpointOptions::transportFailureIsPeerGone).
Status workCompletionStatus(const v::WorkCompletion& wc, size_t lane, const Status& failure, bool peerGone) {
  std::string what = std::string(v::wcStatusName(wc.status));
  std::string text;
  switch (wc.status) {
    case v::WcStatus::kRetryExcErr:
      text = "the peer is gone or unreachable (" + what + " on queue pair " + std::to_string(lane) + ")";
      break;
    case v::WcStatus::kWrFlushErr:
      text = "work flushed (" + what + ")" + (failure.isOk() ? std::string() : ": " + failure.message());
      break;
    case v::WcStatus::kRemAccessErr:
      text = "the peer refused the access (" + what + " on queue pair " + std::to_string(lane) +
             "): its region was unregistered or its metadata is stale";
      break;
    default: text = "work request failed: " + what + " on queue pair " + std::to_string(lane);
  }
  bool gone = peerGone && (wc.status == v::WcStatus::kRetryExcErr ||
                           (wc.status == v::WcStatus::kWrFlushErr && failure.code() == StatusCode::kPeerGone));
  return Status(gone ? StatusCode::kPeerGone : StatusCode::kWorkCompletionError, text, static_cast<int>(wc.status));
}

}  // namespace

struct Endpoint::Fragment {
  std::vector<uint8_t> copy;  // the bytes, copied aside
  int64_t buffer = -1;        // or the receive buffer still holding them
  uint32_t length = 0;
};

struct Endpoint::IncomingMessage {
  std::deque<Fragment> fragments;
  bool complete = false;
};

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
  std::shared_ptr<Endpoint> ep(new Endpoint(std::move(pool), std::move(options)));
  ep->self_ = ep;  // once here, so that each new operation takes it without locking a weak pointer
  FERRY_RETURN_IF_ERROR(ep->init());
  return ep;
}

Endpoint::Endpoint(std::shared_ptr<MemoryPool> pool, EndpointOptions options)
    : options_(std::move(options)),
      pool_(std::move(pool)),
      context_(pool_->context()),
      worker_(options_.worker) {}

Endpoint::~Endpoint() { shutdown(); }

Status Endpoint::init() {
  const v::DeviceAttr& dev = context_->deviceAttr();
  const EndpointOptions& o = options_;
  if (o.numQp < 1 || o.numQp > 64)
    return invalidArgument("num_qp must be 1..64, not " + std::to_string(o.numQp));
  if (o.sendDepth < 1 || o.sendDepth > static_cast<uint32_t>(dev.maxQpWr)) {
    return invalidArgument("send depth must be 1.." + std::to_string(dev.maxQpWr));
  }
  if (o.recvDepth < 1 || o.recvDepth > static_cast<uint32_t>(dev.maxQpWr)) {
    return invalidArgument("receive depth must be 1.." + std::to_string(dev.maxQpWr));
  }
  uint64_t maxMsg = context_->portAttr().maxMsgSz ? context_->portAttr().maxMsgSz : (uint64_t{1} << 31);
  if (o.recvBufferSize < 64 || o.recvBufferSize > std::min<uint64_t>(maxMsg, uint64_t{1} << 30)) {
    return invalidArgument("receive buffer size must be 64 bytes .. " +
                           std::to_string(std::min<uint64_t>(maxMsg, uint64_t{1} << 30)));
  }
  if (o.maxWorkRequestBytes < 1 || o.maxWorkRequestBytes > maxMsg) {
    return invalidArgument("largest work request must be 1 .. " + std::to_string(maxMsg) + " bytes");
  }
  if (o.minStripeBytes < 1) return invalidArgument("the smallest stripe must be at least 1 byte");
  if (o.ackTimeout < 1 || o.ackTimeout > 31) return invalidArgument("ackTimeout must be 0 (from FERRY_TRANSPORT_TIMEOUT) or 1..31");
  uint64_t cqe = o.numQp * (uint64_t{o.sendDepth} + o.recvDepth) + 64;
  if (cqe > static_cast<uint64_t>(dev.maxCqe)) {
    return invalidArgument(
        "num_qp x (send depth + receive depth) exceeds the device's completion queue size");
  }
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
    auto lane = std::make_unique<QpLane>();
    lane->index = i;
    lane->nextMessage = i;
    FERRY_ASSIGN_OR_RETURN(lane->qp, pool_->pd().createQp({.type = v::QpType::kRc,
                                                           .sendCq = &cq_,
                                                           .recvCq = &cq_,
                                                           .cap = {.maxSendWr = o.sendDepth,
                                                                   .maxRecvWr = o.recvDepth,
                                                                   .maxSendSge = maxSendSge_,
                                                                   .maxRecvSge = 1}}));
    lane->qpNum = lane->qp.qpNum();
    lane->local.portNum = static_cast<uint8_t>(context_->ibPort());
    lane->local.packetLifeTime = o.ackTimeout;
    lane->local.sgidIndex = o.gidIndex;
    FERRY_RETURN_IF_ERROR(v::fillPath(ctx, lane->qp, lane->local));
    // INIT now, so the receives are posted before the peer can send anything.
    v::QpAttr attr;
    attr.state = v::QpState::kInit;
    attr.pkeyIndex = 0;
    attr.portNum = lane->local.portNum;
    attr.qpAccessFlags = kQpAccess;
    namespace m = v::qp_attr_mask;
    FERRY_RETURN_IF_ERROR(lane->qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
    lane->batch.reserve(o.sendDepth);
    lane->sges.reserve(size_t{o.sendDepth} * maxSendSge_);
    lanes_.push_back(std::move(lane));
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
  return worker_->attach(shared_from_this());
}

Status Endpoint::moveToWorker(std::shared_ptr<Worker> worker) {
  std::shared_ptr<Worker> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown) return closedError("add_endpoint: the endpoint was shut down");
    if (worker_ == worker) return Status::ok();
    FERRY_RETURN_IF_ERROR(worker->attach(shared_from_this()));
    worker_->detach(this);
    old = std::move(worker_);
    worker_ = std::move(worker);
  }
  // A completion may have arrived between the two workers; let the new one look.
  progressFromWorker();
  old.reset();  // a worker of the endpoint's own ends here, outside the lock
  return Status::ok();
}

std::shared_ptr<Worker> Endpoint::worker() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_;
}

// ---------------------------------------------------------------------------------------------
// Memory

Result<MrHandle> Endpoint::registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                                RegionOptions options) {
  return pool_->registerMemoryRegion(name, addr, length, std::move(options));
}

Result<MrHandle> Endpoint::registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                                RegionOptions options) {
  return pool_->registerMemoryRegion(key, addr, length, std::move(options));
}

Result<MrHandle> Endpoint::registerRemoteMemoryRegion(std::string_view name, std::string_view mrInfoJson) {
  if (name.empty()) return invalidArgument("register_remote_memory_region: the name is empty");
  auto parsed = json::parse(mrInfoJson);
  if (!parsed.isOk()) return invalidArgument("register_remote_memory_region: " + parsed.status().message());
  FERRY_ASSIGN_OR_RETURN(
      RegionMetadata r,
      decodeRegion(std::string(name), *parsed, "register_remote_memory_region '" + std::string(name) + "'"));
  std::unique_lock<std::shared_mutex> lock(remoteMu_);
  return recordRemoteLocked(
      RemoteRegion{.name = r.name, .addr = r.addr, .length = r.length, .rkey = r.rkey, .writable = r.writable},
      r.handle);
}

Status Endpoint::unregisterRemoteMemoryRegion(MrHandle handle) {
  std::unique_lock<std::shared_mutex> lock(remoteMu_);
  auto it = remotes_.find(handle);
  if (it == remotes_.end()) return notFound("unregister_remote_memory_region: no remote region " + std::to_string(handle));
  remoteNames_.erase(it->second.name);
  remotes_.erase(it);
  return Status::ok();
}

MrHandle Endpoint::recordRemoteLocked(RemoteRegion region, std::optional<MrHandle> wanted) {
  auto named = remoteNames_.find(region.name);
  MrHandle handle;
  if (named != remoteNames_.end()) {
    handle = named->second;
  } else if (wanted && remotes_.count(*wanted) == 0) {
    handle = *wanted;
  } else {
    while (remotes_.count(nextRemote_) != 0) ++nextRemote_;
    handle = nextRemote_++;
  }
  remoteNames_[region.name] = handle;
  remotes_[handle] = std::move(region);
  return handle;
}

Result<MrHandle> Endpoint::localHandle(std::string_view name) const { return pool_->handleOf(name); }

Result<MrHandle> Endpoint::remoteHandle(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(remoteMu_);
  auto it = remoteNames_.find(std::string(name));
  if (it == remoteNames_.end()) {
    return notFound("no remote memory region named '" + std::string(name) +
                    "' (register_remote_memory_region() or connect() records them)");
  }
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Metadata and connection

std::string Endpoint::endpointInfo() const {
  EndpointMetadata m{.device = context_->deviceName(),
                     .ibPort = context_->ibPort(),
                     .linkType = context_->linkType(),
                     .numQp = static_cast<uint32_t>(options_.numQp),
                     .recvBufferSize = options_.recvBufferSize,
                     .recvDepth = options_.recvDepth,
                     .paths = {},
                     .regions = {}};
  for (const auto& lane : lanes_) m.paths.push_back(lane->local);
  return encodeMetadata(m, pool_->mrInfo());
}

std::string Endpoint::mrInfo() const { return pool_->mrInfo(); }

Status Endpoint::connect(std::string_view peerInfo) {
  // Check everything first: malformed metadata changes nothing.
  FERRY_ASSIGN_OR_RETURN(EndpointMetadata peer, decodeMetadata(peerInfo, "connect: peer metadata"));
  if (peer.numQp != options_.numQp) {
    return invalidArgument("connect: peer metadata: the peer has num_qp=" + std::to_string(peer.numQp) +
                           ", this endpoint " + std::to_string(options_.numQp) + ": both sides need the same num_qp");
  }
  std::vector<v::Path>& peerPaths = peer.paths;
  std::vector<RegionMetadata>& regions = peer.regions;
  const uint32_t recvBufferSize = peer.recvBufferSize;

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown) return closedError("connect: the endpoint was shut down");
    if (state_ == State::kFailed) return failure_;
    if (state_ == State::kConnected) return invalidArgument("connect: the endpoint is already connected");
    for (size_t i = 0; i < lanes_.size(); ++i) {
      QpLane& lane = *lanes_[i];
      v::Path path = peerPaths[i];
      path.reverse();
      path.portNum = lane.local.portNum;
      path.sgidIndex = lane.local.sgidIndex;
      Status st = v::fillPath(context_->verbs(), lane.qp, path);
      if (st.isOk()) {
        // Our side as published; our own transport policy (never the peer's timeouts for our QP).
        path.sgid = lane.local.sgid;
        path.sqpsn = lane.local.sqpsn;
        path.retries = lane.local.retries;
        path.rnrRetries = lane.local.rnrRetries;
        path.minRnrTimer = lane.local.minRnrTimer;
        path.packetLifeTime = lane.local.packetLifeTime;
        st = lane.qp.establish(path, kQpAccess);
      }
      if (!st.isOk()) {
        Status why(st.code(),
                   "connect: bringing up queue pair " + std::to_string(i) + " failed: " + st.message() +
                       " (this endpoint cannot be used any more)",
                   st.cause());
        failLocked(why);
        return why;
      }
    }
    peerRecvBufferSize_ = static_cast<uint32_t>(recvBufferSize);
    state_ = State::kConnected;
    updateProbeLocked();
  }
  {
    std::unique_lock<std::shared_mutex> lock(remoteMu_);
    // In the peer's handle order, so its handles are kept wherever they are free here.
    std::sort(regions.begin(), regions.end(), [](const RegionMetadata& a, const RegionMetadata& b) {
      return a.handle.value_or(~MrHandle{0}) < b.handle.value_or(~MrHandle{0});
    });
    for (auto& r : regions) {
      recordRemoteLocked(
          RemoteRegion{.name = r.name, .addr = r.addr, .length = r.length, .rkey = r.rkey, .writable = r.writable},
          r.handle);
    }
  }
  auto worker = this->worker();
  if (worker) worker->wake();
  return Status::ok();
}

bool Endpoint::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kConnected;
}

bool Endpoint::isShutdown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kShutdown;
}

Status Endpoint::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

// ---------------------------------------------------------------------------------------------
// Submission

Result<std::shared_ptr<OpState>> Endpoint::resolveTransfers(OpKind kind, std::span<const Assignment> batch) {
  auto op = newOp(kind);
  op->transfers.reserve(batch.size());
  const char* verb = kind == OpKind::kRead ? "read" : kind == OpKind::kWrite ? "write" : "write_with_imm";
  std::optional<RegionView> local;
  const RemoteRegion* remote = nullptr;
  MrHandle remoteHandleCached = 0;
  std::shared_lock<std::shared_mutex> lock(remoteMu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const Assignment& a = batch[i];
    auto where = [&] { return std::string(verb) + ": assignment " + std::to_string(i) + ": "; };
    if (!local || local->handle != a.local) {
      auto found = pool_->find(a.local);
      if (!found.isOk()) return invalidArgument(where() + found.status().message());
      local = *found;
    }
    if (remote == nullptr || remoteHandleCached != a.remote) {
      auto it = remotes_.find(a.remote);
      if (it == remotes_.end()) {
        return invalidArgument(where() + "no remote memory region with handle " + std::to_string(a.remote) +
                               " (register_remote_memory_region() or connect() records them)");
      }
      remote = &it->second;
      remoteHandleCached = a.remote;
    }
    if (a.localOffset > local->length || a.length > local->length - a.localOffset) {
      return invalidArgument(where() + "local offset " + std::to_string(a.localOffset) + " + length " +
                             std::to_string(a.length) + " exceeds the local region (" +
                             std::to_string(local->length) + " bytes)");
    }
    if (a.remoteOffset > remote->length || a.length > remote->length - a.remoteOffset) {
      return invalidArgument(where() + "remote offset " + std::to_string(a.remoteOffset) + " + length " +
                             std::to_string(a.length) + " exceeds remote region '" + remote->name + "' (" +
                             std::to_string(remote->length) + " bytes)");
    }
    if (kind == OpKind::kRead && !local->writable) {
      return invalidArgument(where() + "the local region is read-only: it cannot be a READ's destination");
    }
    if (kind != OpKind::kRead && !remote->writable) {
      return invalidArgument(where() + "remote region '" + remote->name + "' is read-only");
    }
    if (a.length == 0) continue;
    const uint64_t localAddr = local->addr + a.localOffset;
    const uint64_t remoteAddr = remote->addr + a.remoteOffset;
    op->totalBytes += a.length;
    if (!op->transfers.empty()) {
      // A range that continues the previous one on both sides travels with it (fewer work
      // requests for batches of consecutive pages).
      Transfer& prev = op->transfers.back();
      if (prev.lkey == local->lkey && prev.rkey == remote->rkey &&
          prev.localAddr + prev.length == localAddr && prev.remoteAddr + prev.length == remoteAddr) {
        prev.length += a.length;
        continue;
      }
    }
    op->transfers.push_back(Transfer{.localAddr = localAddr,
                                     .remoteAddr = remoteAddr,
                                     .length = a.length,
                                     .lkey = local->lkey,
                                     .rkey = remote->rkey});
  }
  return op;
}

Result<std::shared_ptr<OpState>> Endpoint::resolvePieces(OpKind kind, std::span<const Chunk> chunks) {
  auto op = newOp(kind);
  const char* verb = kind == OpKind::kSend ? "send" : "recv";
  std::optional<RegionView> region;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    auto where = [&] { return std::string(verb) + ": chunk " + std::to_string(i) + ": "; };
    if (!region || region->handle != c.mr) {
      auto found = pool_->find(c.mr);
      if (!found.isOk()) return invalidArgument(where() + found.status().message());
      region = *found;
    }
    if (c.offset > region->length || c.length > region->length - c.offset) {
      return invalidArgument(where() + "offset " + std::to_string(c.offset) + " + length " +
                             std::to_string(c.length) + " exceeds the region (" +
                             std::to_string(region->length) + " bytes)");
    }
    if (kind == OpKind::kRecv && !region->writable) {
      return invalidArgument(where() + "the region is read-only: it cannot receive");
    }
    if (c.length == 0) continue;
    op->pieces.push_back(
        MessagePiece{.mr = c.mr, .addr = region->addr + c.offset, .length = c.length, .lkey = region->lkey});
    op->totalBytes += c.length;
  }
  return op;
}

Status Endpoint::notUsableLocked() const {
  switch (state_) {
    case State::kShutdown: return closedError("the endpoint was shut down");
    case State::kFailed: return failure_;
    case State::kIdle:
      return Status(StatusCode::kUnavailable,
                    "the endpoint is not connected (call connect(peer_info) first)");
    case State::kConnected: break;
  }
  return Status::ok();
}

Status Endpoint::submit(const std::shared_ptr<OpState>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_RETURN_IF_ERROR(notUsableLocked());
  if (op->kind() == OpKind::kSend) op->messageSeq = sendSeq_++;
  queue_.push_back(op);
  pumpLocked();
  return Status::ok();
}

Result<ReadWriteFuture> Endpoint::read(std::span<const Assignment> batch) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kRead, batch));
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<ReadWriteFuture> Endpoint::write(std::span<const Assignment> batch) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kWrite, batch));
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<ReadWriteFuture> Endpoint::writeWithImm(std::span<const Assignment> batch, uint32_t immData) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kWriteWithImm, batch));
  op->imm = immData;
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<SendFuture> Endpoint::send(std::span<const Chunk> chunks) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolvePieces(OpKind::kSend, chunks));
  FERRY_RETURN_IF_ERROR(submit(op));
  return SendFuture(std::move(op));
}

Result<RecvFuture> Endpoint::recv(std::span<const Chunk> chunks) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolvePieces(OpKind::kRecv, chunks));
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown || state_ == State::kFailed) return notUsableLocked();
    op->messageSeq = recvSeq_++;
    auto in = incoming_.find(op->messageSeq);
    if (in != incoming_.end()) {
      // The message (or its start) came first: hand it over and give its receive buffers back.
      for (Fragment& f : in->second.fragments) {
        if (f.buffer >= 0) {
          copyIntoRecvLocked(*op, recvSlab_.get() + uint64_t(f.buffer) * options_.recvBufferSize, f.length);
          repostLocked(static_cast<uint32_t>(f.buffer));
        } else {
          copyIntoRecvLocked(*op, f.copy.data(), f.length);
          unexpectedBytes_ -= f.copy.size();
        }
      }
      bool complete = in->second.complete;
      incoming_.erase(in);
      if (complete) {
        finishRecvLocked(op);
        return RecvFuture(std::move(op));
      }
    }
    recvWaiting_[op->messageSeq] = op;
    bool had = wantsProbe();
    updateProbeLocked();
    if (!had && wantsProbe()) worker = worker_;
  }
  if (worker) worker->wake();
  return RecvFuture(std::move(op));
}

Result<ImmRecvFuture> Endpoint::immRecv() {
  auto op = newOp(OpKind::kImmRecv);
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown || state_ == State::kFailed) return notUsableLocked();
    if (!immArrived_.empty()) {
      op->complete(Status::ok(), immArrived_.front());
      immArrived_.pop_front();
      return ImmRecvFuture(std::move(op));
    }
    immWaiting_.push_back(op);
    bool had = wantsProbe();
    updateProbeLocked();
    if (!had && wantsProbe()) worker = worker_;
  }
  if (worker) worker->wake();
  return ImmRecvFuture(std::move(op));
}

// ---------------------------------------------------------------------------------------------
// Posting

int Endpoint::pickLaneLocked() {
  const size_t n = lanes_.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = (rr_ + k) % n;
    if (lanes_[i]->outstanding < options_.sendDepth) {
      rr_ = i + 1;
      return static_cast<int>(i);
    }
  }
  return -1;
}


bool Endpoint::postTransfersLocked(OpState& op, const std::shared_ptr<OpState>& ref) {
  const size_t n = lanes_.size();
  const v::WrOpcode opcode = op.kind() == OpKind::kRead ? v::WrOpcode::kRdmaRead : v::WrOpcode::kRdmaWrite;
  while (op.nextTransfer < op.transfers.size()) {
    const Transfer& t = op.transfers[op.nextTransfer];
    // One range: pieces of at most maxWorkRequestBytes; with several queue pairs, about an equal
    // share each, but no smaller than minStripeBytes.
    uint64_t piece = t.length;
    if (n > 1) piece = std::max(options_.minStripeBytes, (t.length + n - 1) / n);
    piece = std::min(piece, options_.maxWorkRequestBytes);
    const uint64_t len = std::min(piece, t.length - op.transferOffset);
    const int li = pickLaneLocked();
    if (li < 0) return false;
    QpLane& lane = *lanes_[li];
    v::Sge sge{.addr = t.localAddr + op.transferOffset, .length = static_cast<uint32_t>(len), .lkey = t.lkey};
    v::SendWr wr;
    wr.wrId = lane.nextSeq;
    wr.opcode = opcode;
    wr.rdma = {.remoteAddr = t.remoteAddr + op.transferOffset, .rkey = t.rkey};
    lane.append(wr, std::span<const v::Sge>(&sge, 1));
    lane.inflight.push_back({lane.nextSeq++, ref});
    ++lane.outstanding;
    ++op.wrsInFlight;
    lane.bytes += len;
    op.transferOffset += len;
    if (op.transferOffset == t.length) {
      ++op.nextTransfer;
      op.transferOffset = 0;
    }
  }
  if (op.kind() == OpKind::kWriteWithImm) {
    // The immediate goes on every queue pair after that pair's share of the data: RC order per
    // pair means the peer sees it only once all the data is in place. It matches them up again.
    while (op.markersPosted < n) {
      QpLane& lane = *lanes_[op.markersPosted];
      if (lane.outstanding >= options_.sendDepth) return false;
      v::SendWr wr;
      wr.wrId = lane.nextSeq;
      wr.opcode = v::WrOpcode::kRdmaWriteWithImm;
      wr.immData = op.imm;
      lane.append(wr, {});
      lane.inflight.push_back({lane.nextSeq++, ref});
      ++lane.outstanding;
      ++op.wrsInFlight;
      ++op.markersPosted;
    }
  }
  return true;
}

bool Endpoint::postMessageLocked(OpState& op, const std::shared_ptr<OpState>& ref) {
  QpLane& lane = *lanes_[op.messageSeq % lanes_.size()];
  const uint64_t fragment = peerRecvBufferSize_;
  bool first = op.movedBytes == 0 && op.wrsInFlight == 0;
  while (first || op.movedBytes < op.totalBytes) {
    first = false;
    if (lane.outstanding >= options_.sendDepth) return false;
    v::Sge list[kMaxSendSge];
    uint32_t count = 0;
    uint64_t bytes = 0;
    while (op.nextPiece < op.pieces.size() && bytes < fragment && count < maxSendSge_) {
      const MessagePiece& p = op.pieces[op.nextPiece];
      uint64_t take = std::min(p.length - op.pieceOffset, fragment - bytes);
      list[count++] =
          v::Sge{.addr = p.addr + op.pieceOffset, .length = static_cast<uint32_t>(take), .lkey = p.lkey};
      bytes += take;
      op.pieceOffset += take;
      if (op.pieceOffset == p.length) {
        ++op.nextPiece;
        op.pieceOffset = 0;
      }
    }
    op.movedBytes += bytes;
    const bool last = op.movedBytes == op.totalBytes;
    v::SendWr wr;
    wr.wrId = lane.nextSeq;
    wr.opcode = v::WrOpcode::kSendWithImm;
    wr.immData = static_cast<uint32_t>(op.messageSeq & kMessageSeqMask) | (last ? kLastFragment : 0);
    lane.append(wr, std::span<const v::Sge>(list, count));
    lane.inflight.push_back({lane.nextSeq++, ref});
    ++lane.outstanding;
    ++op.wrsInFlight;
    lane.bytes += bytes;
    if (last) break;
  }
  return true;
}

void Endpoint::pumpLocked() {
  while (!queue_.empty() && state_ == State::kConnected) {
    std::shared_ptr<OpState> op = queue_.front();
    bool finished = op->kind() == OpKind::kSend ? postMessageLocked(*op, op) : postTransfersLocked(*op, op);
    if (!finished) break;
    op->allPosted = true;
    // The resolved ranges are not needed any more: a large batch gives its memory back now.
    std::vector<Transfer>().swap(op->transfers);
    std::vector<MessagePiece>().swap(op->pieces);
    queue_.pop_front();
    finishIfDoneLocked(op);
  }
  flushLocked();
}

void Endpoint::flushLocked() {
  for (auto& lanePtr : lanes_) {
    QpLane& lane = *lanePtr;
    if (lane.batch.empty()) continue;
    for (size_t i = 0; i < lane.batch.size(); ++i) {
      if (++lane.sinceSignal >= kSignalEvery || i + 1 == lane.batch.size()) {
        lane.batch[i].sendFlags |= v::send_flags::kSignaled;
        lane.sinceSignal = 0;
      }
    }
    lane.maxOutstanding = std::max(lane.maxOutstanding, lane.outstanding);
    size_t bad = lane.batch.size();
    Status st = lane.qp.postSend(lane.batch, &bad);
    if (st.isOk()) {
      lane.workRequests += lane.batch.size();
    } else {
      // What was not posted will never complete: take it back and fail its operations. What was
      // posted completes (flushed) once failLocked() moved the queue pairs to ERR.
      size_t posted = std::min(bad, lane.batch.size());
      lane.workRequests += posted;
      Status why(st.code(),
                 "posting to queue pair " + std::to_string(lane.index) + " failed: " + st.message(),
                 st.cause());
      std::vector<std::shared_ptr<OpState>> touched;
      for (size_t k = posted; k < lane.batch.size(); ++k) {
        QpLane::Record rec = std::move(lane.inflight.back());
        lane.inflight.pop_back();
        --lane.outstanding;
        if (rec.op) {
          --rec.op->wrsInFlight;
          if (rec.op->firstError.isOk()) rec.op->firstError = why;
          touched.push_back(std::move(rec.op));
        }
      }
      lane.batch.clear();
      lane.sges.clear();
      failLocked(why);
      for (auto& op : touched) finishIfDoneLocked(op);
      continue;
    }
    lane.batch.clear();
    lane.sges.clear();
  }
}

void Endpoint::finishIfDoneLocked(const std::shared_ptr<OpState>& op) {
  if (!op->allPosted || op->wrsInFlight != 0 || op->done()) return;
  op->complete(op->firstError, 0, op->firstError.isOk() ? op->totalBytes : 0);
}

// ---------------------------------------------------------------------------------------------
// Completions

std::shared_ptr<OpState> Endpoint::newOp(OpKind kind) {
  auto op = std::make_shared<OpState>(kind);
  op->track(metrics_, context_->metrics());
  op->setProgressor(self_);
  return op;
}

bool Endpoint::drainCompletionsLocked(Drain mode) {
  v::WorkCompletion wcs[64];
  bool armed = false;
  // A shutdown takes what is there in a bounded number of rounds: a peer that keeps sending
  // cannot hold it.
  int rounds = mode == Drain::kSuccessesBeforeShutdown ? 64 : -1;
  for (;;) {
    auto n = cq_.poll(wcs);
    if (!n.isOk()) {
      if (mode == Drain::kSuccessesBeforeShutdown) return true;  // the shutdown's status is the one
      failLocked(Status(n.status().code(), "polling the completion queue failed: " + n.status().message(),
                        n.status().cause()));
      return true;
    }
    for (int i = 0; i < *n; ++i) {
      if (mode == Drain::kSuccessesBeforeShutdown && wcs[i].status != v::WcStatus::kSuccess) continue;
      handleCompletionLocked(wcs[i]);
      if (state_ != State::kConnected && mode == Drain::kSuccessesBeforeShutdown) return false;
    }
    if (state_ == State::kShutdown) return false;
    if (rounds > 0 && --rounds == 0) return true;
    // A full batch: there may be more. A short one emptied the queue (no further, empty poll: on a
    // software device that one would run the device's progress loop for nothing).
    if (*n == static_cast<int>(std::size(wcs))) continue;
    if (mode != Drain::kTakeAndArm || armed) return true;
    // Arm, then poll once more: a completion that came in between is not missed.
    Status st = cq_.reqNotify();
    if (!st.isOk()) {
      failLocked(st);
      return true;
    }
    armed = true;
  }
}

void Endpoint::progressOnce() {
  // The worker (or another waiter) holds the lock: it is taking the completions already.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || state_ == State::kShutdown) return;
  // A CQ the worker left unarmed is armed again as soon as someone needs the worker.
  if (unarmed_.load(std::memory_order_relaxed) && watchers_.load(std::memory_order_acquire) > 0) {
    rearmLocked();
    return;
  }
  // An armed CQ stays armed for the worker: a completion taken here may still wake it once, to
  // find nothing.
  if (!drainCompletionsLocked(Drain::kTake)) return;
  pumpLocked();
  updateProbeLocked();  // completions only satisfy waits: a probe can become unneeded, never needed
}


namespace {
int64_t waitLeaseNs() {
  static const int64_t ns = config::waitLeaseUs() * 1000;
  return ns;
}
}  // namespace

// Waiters that poll take the completions themselves (progressOnce()). An armed CQ would still wake
// the worker for each of them, and on a machine of few cores the woken worker takes a core from
// the waiter. So while waiters poll, and for a lease after one of them got its operation (the
// next operation's waiter is likely to poll too), the worker leaves the CQ unarmed. Anyone who
// needs the worker ends that at once: a waiter about to sleep, a callback waiting for an
// operation (watchBegins()). Otherwise the worker looks again when the lease ends.
void Endpoint::pollBegins() { pollers_.fetch_add(1, std::memory_order_acq_rel); }

void Endpoint::pollEnds(bool operationDone) {
  if (operationDone && waitLeaseNs() > 0) {
    leaseUntilNs_.store(steadyNs() + waitLeaseNs(), std::memory_order_release);
  }
  pollers_.fetch_sub(1, std::memory_order_acq_rel);
}

void Endpoint::watchBegins(bool mayBlock) {
  watchers_.fetch_add(1, std::memory_order_acq_rel);
  // A caller that may hold locks of its own (onDone(), even from a callback running under mu_)
  // leaves the arming to the threads that take mu_ anyway: the pollers' next progressOnce(), or
  // the worker at the lease's end at the latest (unarmedDueNs()).
  if (!mayBlock || !unarmed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  rearmLocked();
}

void Endpoint::watchEnds() { watchers_.fetch_sub(1, std::memory_order_acq_rel); }

void Endpoint::rearmLocked() {
  if (state_ == State::kShutdown || !unarmed_.load(std::memory_order_relaxed)) return;
  if (!drainCompletionsLocked(Drain::kTakeAndArm)) return;
  unarmed_.store(false, std::memory_order_release);
  pumpLocked();
  updateProbeLocked();
}

bool Endpoint::pollersAttend(int64_t nowNs) const {
  if (waitLeaseNs() == 0 || watchers_.load(std::memory_order_acquire) > 0) return false;
  return pollers_.load(std::memory_order_acquire) > 0 ||
         nowNs < leaseUntilNs_.load(std::memory_order_acquire);
}

std::optional<int64_t> Endpoint::unarmedDueNs(int64_t nowNs) const {
  if (!unarmed_.load(std::memory_order_acquire)) return std::nullopt;
  if (!pollersAttend(nowNs)) return nowNs;
  // While a waiter polls, its lease (set when it stops) is not known yet: look again a lease on.
  int64_t due = leaseUntilNs_.load(std::memory_order_acquire);
  if (pollers_.load(std::memory_order_acquire) > 0) due = std::max(due, nowNs + waitLeaseNs());
  return due;
}

void Endpoint::progressFromWorker() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kShutdown) {
    unarmed_.store(false, std::memory_order_release);  // nothing left for the worker to look at
    return;
  }
  ++workerWakeups_;
  // Consume the channel's events; the CQ is polled below either way.
  while (channel_.getEvent(0).isOk()) {
  }
  // Leave the CQ unarmed while pollers attend to it; the worker looks again when they stop
  // (unarmedDueNs()).
  const bool leave = pollersAttend(steadyNs());
  const bool running = drainCompletionsLocked(leave ? Drain::kTake : Drain::kTakeAndArm);
  unarmed_.store(running && leave, std::memory_order_release);
  if (!running) return;
  pumpLocked();
  updateProbeLocked();
}

void Endpoint::handleCompletionLocked(const v::WorkCompletion& wc) {
  QpLane* lane = nullptr;
  for (auto& l : lanes_) {
    if (l->qpNum == wc.qpNum) lane = l.get();
  }
  if (lane == nullptr) return;
  if (wc.wrId & kRecvWrFlag) {
    handleRecvCompletionLocked(*lane, wc);
  } else {
    handleSendCompletionLocked(*lane, wc);
  }
}

void Endpoint::handleSendCompletionLocked(QpLane& lane, const v::WorkCompletion& wc) {
  Status error;
  if (wc.status != v::WcStatus::kSuccess) {
    error = workCompletionStatus(wc, lane.index, failure_, options_.transportFailureIsPeerGone);
  } else {
    peerSeen_ = true;
  }
  // Work requests complete in order: this completion covers every earlier (unsignaled) one.
  while (!lane.inflight.empty() && lane.inflight.front().seq <= wc.wrId) {
    QpLane::Record rec = std::move(lane.inflight.front());
    lane.inflight.pop_front();
    --lane.outstanding;
    if (!rec.op) continue;
    --rec.op->wrsInFlight;
    if (rec.seq == wc.wrId && !error.isOk() && rec.op->firstError.isOk()) rec.op->firstError = error;
    finishIfDoneLocked(rec.op);
  }
  if (!error.isOk()) failLocked(error);
}

void Endpoint::handleRecvCompletionLocked(QpLane& lane, const v::WorkCompletion& wc) {
  const uint32_t buffer = static_cast<uint32_t>(wc.wrId & 0xffffffffu);
  if (lane.receivesPosted > 0) --lane.receivesPosted;
  if (state_ != State::kConnected) return;  // flushed receives of a failed endpoint
  if (wc.status != v::WcStatus::kSuccess) {
    failLocked(workCompletionStatus(wc, lane.index, failure_, options_.transportFailureIsPeerGone));
    return;
  }
  peerSeen_ = true;
  if (wc.opcode == v::WcOpcode::kRecvRdmaWithImm) {
    lane.immediates.push_back(wc.immData);
    repostLocked(buffer);
    matchImmediatesLocked();
    return;
  }
  if (wc.opcode != v::WcOpcode::kRecv || !(wc.wcFlags & v::wc_flags::kWithImm)) {
    failLocked(protocolError("the peer sent a message without ferry's fragment header (queue pair " +
                             std::to_string(lane.index) + ")"));
    return;
  }
  const uint32_t seq31 = wc.immData & kMessageSeqMask;
  if (seq31 != (lane.nextMessage & kMessageSeqMask) || wc.byteLen > options_.recvBufferSize) {
    failLocked(protocolError("message fragment out of order or oversized on queue pair " +
                             std::to_string(lane.index)));
    return;
  }
  const uint64_t seq = lane.nextMessage;
  const bool last = (wc.immData & kLastFragment) != 0;
  if (last) lane.nextMessage += lanes_.size();
  deliverFragmentLocked(seq, last, recvSlab_.get() + uint64_t{buffer} * options_.recvBufferSize, wc.byteLen,
                        buffer);
}

void Endpoint::deliverFragmentLocked(uint64_t seq, bool last, const uint8_t* data, uint32_t length,
                                     uint32_t buffer) {
  auto waiting = recvWaiting_.find(seq);
  if (waiting != recvWaiting_.end()) {
    copyIntoRecvLocked(*waiting->second, data, length);
    repostLocked(buffer);
    if (last) {
      std::shared_ptr<OpState> op = std::move(waiting->second);
      recvWaiting_.erase(waiting);
      finishRecvLocked(op);
    }
    return;
  }
  // Ahead of its recv(): copy it aside while that stays within bounds, else keep the receive
  // buffer (the peer then slows down until a recv() takes the message).
  IncomingMessage& message = incoming_[seq];
  Fragment f;
  f.length = length;
  if (unexpectedBytes_ + length <= options_.maxUnexpectedBytes) {
    f.copy.assign(data, data + length);
    unexpectedBytes_ += length;
    repostLocked(buffer);
  } else {
    f.buffer = buffer;
  }
  message.fragments.push_back(std::move(f));
  if (last) message.complete = true;
}

void Endpoint::copyIntoRecvLocked(OpState& op, const uint8_t* data, uint64_t length) {
  op.movedBytes += length;
  while (length > 0 && op.nextPiece < op.pieces.size()) {
    const MessagePiece& p = op.pieces[op.nextPiece];
    const uint64_t take = std::min(length, p.length - op.pieceOffset);
    {
      // The copy bypasses the device: make sure the region is still registered (and stays so).
      auto pin = pool_->pinRegion(p.mr, p.lkey);
      if (!pin.owns_lock()) {
        if (op.firstError.isOk()) {
          op.firstError =
              Status(StatusCode::kNotFound, "recv: the receive region was unregistered while waiting");
        }
        op.nextPiece = op.pieces.size();
        return;
      }
      std::memcpy(reinterpret_cast<void*>(p.addr + op.pieceOffset), data, take);
    }
    data += take;
    length -= take;
    op.pieceOffset += take;
    if (op.pieceOffset == p.length) {
      ++op.nextPiece;
      op.pieceOffset = 0;
    }
  }
  if (length > 0) op.overflow = true;
}

void Endpoint::finishRecvLocked(const std::shared_ptr<OpState>& op) {
  if (!op->firstError.isOk()) {
    op->complete(op->firstError);
  } else if (op->overflow) {
    op->complete(invalidArgument("recv: the message is " + std::to_string(op->movedBytes) +
                                 " bytes, longer than the receive buffer (" + std::to_string(op->totalBytes) +
                                 " bytes); only the first " + std::to_string(op->totalBytes) +
                                 " bytes were written"));
  } else {
    op->complete(Status::ok(), 0, op->movedBytes);
  }
  std::vector<MessagePiece>().swap(op->pieces);
}

void Endpoint::matchImmediatesLocked() {
  for (;;) {
    for (const auto& lane : lanes_) {
      if (lane->immediates.empty()) return;
    }
    const uint32_t value = lanes_.front()->immediates.front();
    bool same = true;
    for (auto& lane : lanes_) {
      same = same && lane->immediates.front() == value;
      lane->immediates.pop_front();
    }
    if (!same) {
      failLocked(protocolError("the immediates of one write_with_imm differ between queue pairs"));
      return;
    }
    if (!immWaiting_.empty()) {
      std::shared_ptr<OpState> op = std::move(immWaiting_.front());
      immWaiting_.pop_front();
      op->complete(Status::ok(), value);
    } else {
      immArrived_.push_back(value);
    }
  }
}

void Endpoint::repostLocked(uint32_t buffer) {
  if (state_ == State::kShutdown || state_ == State::kFailed) return;
  QpLane& lane = *lanes_[buffer / options_.recvDepth];
  v::Sge sge{.addr = reinterpret_cast<uint64_t>(recvSlab_.get()) + uint64_t{buffer} * options_.recvBufferSize,
             .length = options_.recvBufferSize,
             .lkey = recvMr_.lkey()};
  v::RecvWr wr{.wrId = kRecvWrFlag | buffer, .sgList = std::span<const v::Sge>(&sge, 1)};
  Status st = lane.qp.postRecv(wr);
  if (!st.isOk()) {
    failLocked(
        Status(st.code(),
               "posting a receive to queue pair " + std::to_string(lane.index) + " failed: " + st.message(),
               st.cause()));
    return;
  }
  ++lane.receivesPosted;
}

void Endpoint::failLocked(const Status& why) {
  if (state_ == State::kFailed || state_ == State::kShutdown) return;
  state_ = State::kFailed;
  failure_ = why;
  FERRY_LOG(kWarn, "endpoint on %s: %s", context_->deviceName().c_str(), why.toString().c_str());
  // Stop the queue pairs: everything posted completes (flushed), so operations with work in flight
  // finish through their completions, once the device no longer touches their memory.
  for (auto& lane : lanes_) {
    v::QpAttr attr;
    attr.state = v::QpState::kErr;
    Status st = lane->qp.modify(attr, v::qp_attr_mask::kState);
    if (!st.isOk())
      FERRY_LOG(kWarn, "endpoint: moving queue pair %zu to ERR: %s", lane->index, st.toString().c_str());
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

void Endpoint::updateProbeLocked() {
  wantsProbe_.store(
      state_ == State::kConnected && peerSeen_ && (!recvWaiting_.empty() || !immWaiting_.empty()),
      std::memory_order_relaxed);
}

void Endpoint::probeFromWorker() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kConnected) return;
  // A zero-length WRITE on each idle queue pair: it touches no memory, and fails (RETRY_EXC_ERR)
  // when the peer is gone, which fails the receives waiting for it.
  for (auto& lanePtr : lanes_) {
    QpLane& lane = *lanePtr;
    if (lane.outstanding != 0) continue;
    v::SendWr wr;
    wr.wrId = lane.nextSeq;
    wr.opcode = v::WrOpcode::kRdmaWrite;
    lane.append(wr, {});
    lane.inflight.push_back({lane.nextSeq++, nullptr});
    ++lane.outstanding;
  }
  flushLocked();
}

// ---------------------------------------------------------------------------------------------
// Shutdown and introspection

void Endpoint::shutdown() { shutdown(Status(StatusCode::kCancelled, "the endpoint was shut down")); }

void Endpoint::shutdown(const Status& why) {
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
    for (auto& lane : lanes_) {
      for (auto& rec : lane->inflight) {
        if (rec.op) pending.push_back(std::move(rec.op));
      }
      lane->inflight.clear();
      lane->batch.clear();
      lane->sges.clear();
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
    for (auto& lane : lanes_) lane->qp.close();
    cq_.close();
    recvMr_.close();
    channel_.close();
  }
  const Status failed = why.isOk() ? Status(StatusCode::kCancelled, "the endpoint was shut down") : why;
  for (auto& op : pending) op->complete(failed);
  pending.clear();
  worker.reset();  // a worker of the endpoint's own ends here
}

EndpointStats Endpoint::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EndpointStats s;
  s.operations = metrics_->snapshot();
  for (const auto& lane : lanes_) {
    s.lanes.push_back({.workRequests = lane->workRequests,
                       .bytes = lane->bytes,
                       .maxOutstanding = lane->maxOutstanding,
                       .receivesPosted = lane->receivesPosted});
  }
  s.operationsQueued = queue_.size();
  s.unexpectedBytes = unexpectedBytes_;
  s.immediatesQueued = immArrived_.size();
  s.workerWakeups = workerWakeups_;
  return s;
}

}  // namespace ferry::endpoint
