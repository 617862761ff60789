// The object server's requests: the checks a request passes, the client's connection, the claim
// of its descriptor, the batch it posts, and its completion (waited for, or polled on a channel).
#include "objects/server_core.h"

namespace ferry::objects {

ssize_t ServerCore::request(cuObjOpType_t op, const std::string& key, rdma_buffer* buf, uint64_t remoteStart,
                            size_t size, const std::string& descr, uint32_t pollDelay, uint16_t channelId,
                            uint64_t localOffset, ibv_wc_status* status, void* asyncHandle) {
  RequestCall call{.op = op,
                   .key = key,
                   .buf = buf,
                   .remoteStart = remoteStart,
                   .size = size,
                   .descr = descr,
                   .pollDelay = pollDelay,
                   .channelId = channelId,
                   .localOffset = localOffset,
                   .status = status,
                   .asyncHandle = asyncHandle};
  CheckedRequest req;
  if (auto refused = checkRequest(call, req)) return *refused;
  // The client's connection (wired up on first use, then reused). A connection that just ended
  // (a failed request reset it, the client restarted) is replaced: the agent retires it within
  // moments, and the next lookup wires up anew.
  std::optional<Descriptor> granted;  // the client's own copy, once it granted this request
  for (int attempt = 0;; ++attempt) {
    ClientRoute route;
    if (auto refused = connectClient(call, req, route)) return *refused;
    if (!granted) {
      auto g = claim(route.peer, ag::uuidText(req.address.uuid), call.descr, req.d);
      if (!g.isOk()) {
        releaseClient(req.d.agentAddress);
        if (call.status) *call.status = wcOf(g.status());
        return refuse(call, -EIO, "client " + req.address.alias + ": " + g.status().toString());
      }
      granted = std::move(*g);
    }
    ep::MrHandle remote = 0;
    if (auto refused = registerGrant(call, req, route, *granted, remote)) return *refused;
    std::vector<ep::Assignment> batch;
    if (auto refused = assembleBatch(call, req, route, *granted, remote, batch)) return *refused;
    if (auto answer = submit(call, req, route, remote, batch, attempt)) return *answer;
  }
}

int ServerCore::poll(cuObjAsyncEvent_t* events, int maxEvents, uint16_t channelId) {
  if (!connected_) return -ENODEV;
  if (events == nullptr || maxEvents < 0) return -EINVAL;
  Channel* ch = channel(channelId);
  if (ch == nullptr) return -EINVAL;
  int cap = std::min(maxEvents, kPollCap), n = 0;
  bool failed = false;
  std::lock_guard<std::mutex> lock(ch->mu);
  for (auto it = ch->pending.begin(); it != ch->pending.end() && n < cap && !failed;) {
    if (!it->future.done()) {
      ++it;
      continue;
    }
    Pending p = std::move(*it);
    it = ch->pending.erase(it);
    Status st = p.future.status();
    ibv_wc_status wc = finish(p, st, channelId);
    events[n].async_handle = p.handle;
    events[n].status = wc;
    ++n;
    failed = wc != IBV_WC_SUCCESS;
  }
  return failed ? -EIO : n;
}

// Logs why a request was refused and returns rc.
ssize_t ServerCore::refuse(const RequestCall& c, ssize_t rc, const std::string& why) {
  log(CUOBJ_LOG_PATH_ERROR, c.key,
      "op=" + std::string(opName(c.op)) + " size=" + std::to_string(c.size) +
          " channel=" + std::to_string(c.channelId) + " refused: " + why);
  return rc;
}

// The checks a request passes before any connection: the session, the channel, the sizes, the
// local buffer, then the descriptor. A refusal's return code, or nothing when it passed.
std::optional<ssize_t> ServerCore::checkRequest(RequestCall& c, CheckedRequest& req) {
  if (!connected_) return refuse(c, -ENODEV, "no RDMA session");
  req.ch = channel(c.channelId);
  if (req.ch == nullptr) {
    return refuse(c, -EIO, "channel " + std::to_string(c.channelId) + " is not allocated");
  }
  if (c.remoteStart == 0 || c.size == 0) {
    return refuse(c, -EIO, "remote_buf_start and size must be nonzero");
  }
  if (c.size > CUOBJ_MAX_REQUEST_SIZE) return refuse(c, -EIO, "size above the 1 GiB limit");
  if (auto refused = resolvePieces(c, req)) return refused;
  return checkDescriptor(c, req);
}

// The local pieces, resolved under the buffer lock (a buffer may be deregistered meanwhile).
std::optional<ssize_t> ServerCore::resolvePieces(RequestCall& c, CheckedRequest& req) {
  std::lock_guard<std::mutex> lock(bufMu_);
  rdma_buffer* buf = c.buf;
  if (buf == nullptr || !buffers_.count(buf)) return refuse(c, -EIO, "not a registered buffer or view");
  if (buf->pieces.size() > static_cast<size_t>(std::max(0, params_.getMaxSge()))) {
    return refuse(c, -EIO,
                  std::to_string(buf->pieces.size()) + " entries, above max_sge " +
                      std::to_string(params_.getMaxSge()));
  }
  if (c.localOffset > buf->total || c.size > buf->total - c.localOffset) {
    return refuse(c, -EIO,
                  "size + local_offset is beyond the buffer's " + std::to_string(buf->total) + " bytes");
  }
  if (buf->pieces.size() > 1 && c.localOffset != 0) {
    log(CUOBJ_LOG_PATH_ERROR, c.key,
        "local_offset " + std::to_string(c.localOffset) + " on a buffer of several entries is taken as 0");
    c.localOffset = 0;
  }
  req.pieces = buf->pieces;
  return std::nullopt;
}

// The descriptor: it decodes, grants this operation, has not expired, covers the remote range,
// and names a client reachable over this server's address family.
std::optional<ssize_t> ServerCore::checkDescriptor(const RequestCall& c, CheckedRequest& req) {
  auto d = decodeDescriptor(c.descr);
  if (!d.isOk()) return refuse(c, -EIO, d.status().message());
  if (d->op != static_cast<uint8_t>(c.op)) {
    return refuse(c, -EIO,
                  std::string("the descriptor grants ") + (d->op == CUOBJ_GET ? "GET" : "PUT") + ", not " +
                      opName(c.op));
  }
  if (realtimeNs() > d->expiresNs) return refuse(c, -EIO, "the descriptor expired");
  if (c.remoteStart < d->addr || c.size > d->length || c.remoteStart - d->addr > d->length - c.size) {
    return refuse(c, -EIO, "the remote range is outside the descriptor's");
  }
  auto address = ag::WorkerAddress::decode(d->agentAddress);
  if (!address.isOk()) return refuse(c, -EIO, address.status().message());
  bool family = false;
  for (const auto& a : address->control) family = family || a.ipv6 == ipv6_ || isWildcard();
  if (!family) {
    return refuse(c, -EAFNOSUPPORT,
                  std::string("the client has no ") + (ipv6_ ? "IPv6" : "IPv4") + " address");
  }
  req.d = std::move(*d);
  req.address = std::move(*address);
  return std::nullopt;
}

// The client's connection, ready, with a live endpoint and lanes; a refusal's return code when
// none could be had before the connect timeout.
std::optional<ssize_t> ServerCore::connectClient(const RequestCall& c, const CheckedRequest& req,
                                                 ClientRoute& route) {
  const auto deadline = std::chrono::steady_clock::now() + connectTimeout_;
  int retries = 0;
  for (;;) {
    auto conn = clientFor(req.d.agentAddress, c.key);
    if (!conn.isOk()) {
      if (c.status) *c.status = wcOf(conn.status());
      return refuse(c, conn.status().code() == StatusCode::kResourceExhausted ? -ENOMEM : -EIO,
                    conn.status().toString());
    }
    route.peer = *conn;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    Status ready = route.peer->waitReady(std::max(left, std::chrono::milliseconds(1)));
    bool ended = false;  // wired up once, and its endpoint failed or shut down since
    if (ready.isOk()) {
      route.endpoint = route.peer->endpoint(ag::OpClass::kRma);
      auto lanes = route.peer->lanes();
      if (!endpointEnded(route.endpoint) && lanes.isOk()) {
        route.lanes = std::move(*lanes);
        return std::nullopt;
      }
      // The agent's next lookup retires it and wires up anew.
      Status failed = route.endpoint ? route.endpoint->failure() : Status::ok();
      ready = Status(StatusCode::kPeerGone,
                     "the connection ended" + (failed.isOk() ? std::string() : ": " + failed.message()));
      ended = true;
    }
    releaseClient(req.d.agentAddress);
    // A connection that ended is replaced (by the next clientFor), until the deadline. A wireup
    // that failed is tried again a few times only: a dead client fails each new one at once.
    if (std::chrono::steady_clock::now() >= deadline || ready.code() != StatusCode::kPeerGone ||
        (!ended && ++retries > 3)) {
      if (c.status) *c.status = wcOf(ready);
      return refuse(c, -EIO, "client " + req.address.alias + ": " + ready.toString());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Registers the granted range, with the key of the client's device on the RMA lane, as a remote
// region of the endpoint (writable for a GET).
std::optional<ssize_t> ServerCore::registerGrant(const RequestCall& c, const CheckedRequest& req,
                                                 const ClientRoute& route, const Descriptor& granted,
                                                 ep::MrHandle& remote) {
  const std::string& device = route.lanes.of(ag::OpClass::kRma).remoteDevice;
  const uint32_t* rkey = nullptr;
  for (const auto& k : granted.keys) {
    if (k.first == device) rkey = &k.second;
  }
  if (rkey == nullptr) {
    releaseClient(req.d.agentAddress);
    return refuse(c, -EIO, "the descriptor has no key for the client's device " + device);
  }
  ferry::json::Value info = ferry::json::Value::emptyObject();
  info.set("addr", static_cast<int64_t>(granted.addr));
  info.set("length", static_cast<int64_t>(granted.length));
  info.set("rkey", static_cast<int64_t>(*rkey));
  info.set("writable", c.op == CUOBJ_GET);
  auto registered = route.endpoint->registerRemoteMemoryRegion(
      "cuobj.req." + std::to_string(nextRequest_.fetch_add(1)), ferry::json::serialize(info));
  if (!registered.isOk()) {
    releaseClient(req.d.agentAddress);
    return refuse(c, -EIO, registered.status().toString());
  }
  remote = *registered;
  return std::nullopt;
}

// The batch: one assignment per local piece the request's range touches, from localOffset on,
// against consecutive offsets of the remote region.
std::optional<ssize_t> ServerCore::assembleBatch(const RequestCall& c, const CheckedRequest& req,
                                                 const ClientRoute& route, const Descriptor& granted,
                                                 ep::MrHandle remote, std::vector<ep::Assignment>& batch) {
  uint64_t skip = c.localOffset, left = c.size, remoteOffset = c.remoteStart - granted.addr;
  for (const auto& p : req.pieces) {
    if (left == 0) break;
    if (skip >= p.size) {
      skip -= p.size;
      continue;
    }
    auto local = route.endpoint->localHandle(p.region);
    if (!local.isOk()) {
      (void)route.endpoint->unregisterRemoteMemoryRegion(remote);
      releaseClient(req.d.agentAddress);
      return refuse(c, -EIO, "the buffer was deregistered: " + local.status().message());
    }
    uint64_t n = std::min(left, p.size - skip);
    batch.push_back({.local = *local,
                     .remote = remote,
                     .localOffset = p.regionOffset + skip,
                     .remoteOffset = remoteOffset,
                     .length = n});
    remoteOffset += n;
    left -= n;
    skip = 0;
  }
  return std::nullopt;
}

// Posts the batch (WRITE for a GET, READ for a PUT): an asynchronous request is queued on its
// channel, a synchronous one waited for. The request's answer, or nothing when the connection
// ended between the check and the post and the request should go once more on a new one.
std::optional<ssize_t> ServerCore::submit(const RequestCall& c, const CheckedRequest& req,
                                          const ClientRoute& route, ep::MrHandle remote,
                                          const std::vector<ep::Assignment>& batch, int attempt) {
  const auto& endpoint = route.endpoint;
  Pending pending{.future = {},
                  .handle = c.asyncHandle,
                  .endpoint = endpoint,
                  .remote = remote,
                  .key = c.key,
                  .op = c.op,
                  .size = c.size,
                  .client = req.d.agentAddress,
                  .startUs = steadyUs()};
  std::unique_lock<std::mutex> chLock(req.ch->mu, std::defer_lock);
  if (c.asyncHandle != nullptr) {
    chLock.lock();
    if (req.ch->pending.size() >= std::max(1u, params_.getCqDepth())) {
      chLock.unlock();
      (void)endpoint->unregisterRemoteMemoryRegion(remote);
      releaseClient(req.d.agentAddress);
      return refuse(c, -EIO,
                    "channel " + std::to_string(c.channelId) + " has cq_depth " +
                        std::to_string(params_.getCqDepth()) + " requests outstanding");
    }
  }
  auto posted = c.op == CUOBJ_GET ? endpoint->write(batch) : endpoint->read(batch);
  if (!posted.isOk()) {
    if (chLock.owns_lock()) chLock.unlock();
    (void)endpoint->unregisterRemoteMemoryRegion(remote);
    releaseClient(req.d.agentAddress);
    // The connection ended between the check and the post: once more on a new one.
    if (endpointEnded(endpoint) && attempt < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return std::nullopt;
    }
    return refuse(c, posted.status().code() == StatusCode::kResourceExhausted ? -ENOMEM : -EIO,
                  "submission failed: " + posted.status().toString());
  }
  pending.future = *posted;
  log(CUOBJ_LOG_PATH_DEBUG, c.key,
      "op=" + std::string(opName(c.op)) + " size=" + std::to_string(c.size) +
          " channel=" + std::to_string(c.channelId) + " client=" + req.address.alias + " lane=" +
          route.lanes.of(ag::OpClass::kRma).label() + " submitted" + (c.asyncHandle ? " (async)" : ""));
  if (c.asyncHandle != nullptr) {
    req.ch->pending.push_back(std::move(pending));
    return 0;
  }
  Status st = waitFor(pending.future, c.pollDelay, req.pieces.size());
  ibv_wc_status wc = finish(pending, st, c.channelId);
  if (c.status) *c.status = wc;
  return st.isOk() ? static_cast<ssize_t>(c.size) : -EIO;
}

// Claims the descriptor `text` (decoded: d) from the client agent it names, on that client's
// connection: the client's own copy of it, which equals d. kPermissionDenied when the client
// refused (not minted there, edited, revoked, expired, used already) or granted something else;
// kTimedOut when no answer came within grantTimeout_; kPeerGone when the claim was not sent.
ferry::Result<Descriptor> ServerCore::claim(const std::shared_ptr<ag::PeerConnection>& peer,
                                            const std::string& peerUuid, const std::string& text,
                                            const Descriptor& d) {
  auto waiter = std::make_shared<Claim>();
  waiter->peerUuid = peerUuid;
  const uint64_t id = nextClaim_.fetch_add(1) + 1;
  {
    std::lock_guard<std::mutex> lock(grantMu_);
    claims_[id] = waiter;
  }
  Status sent = peer->sendMessage(kGrantChannel, encodeClaim({.id = id, .digest = descriptorDigest(text)}));
  std::unique_lock<std::mutex> lock(grantMu_);
  if (sent.isOk()) waiter->cv.wait_for(lock, grantTimeout_, [&] { return waiter->answered; });
  claims_.erase(id);
  if (!sent.isOk()) return Status(StatusCode::kPeerGone, "the claim was not sent: " + sent.message());
  if (!waiter->answered) {
    return Status(StatusCode::kTimedOut,
                  "no answer to the claim within " + std::to_string(grantTimeout_.count()) + " ms");
  }
  const GrantAnswer& a = waiter->answer;
  if (!a.granted) {
    return Status(StatusCode::kPermissionDenied, "the client refused the descriptor: " + a.reason);
  }
  if (!(a.descriptor == d)) {
    return Status(StatusCode::kPermissionDenied, "the client granted another descriptor than the request's");
  }
  return a.descriptor;
}

// An answer to a claim, on the agent's thread. One from another peer than the claim went to, or
// to a claim no longer waited for (it timed out), is dropped.
void ServerCore::onAnswer(const std::shared_ptr<ag::PeerConnection>& from, std::string_view body) {
  auto a = decodeAnswer(body);
  if (!a.isOk()) {
    log(CUOBJ_LOG_PATH_ERROR, "",
        "an answer from " + from->peerAlias() + " dropped: " + a.status().message());
    return;
  }
  std::lock_guard<std::mutex> lock(grantMu_);
  auto it = claims_.find(a->id);
  if (it == claims_.end()) return;
  if (from->peerUuid() != it->second->peerUuid) {
    log(CUOBJ_LOG_PATH_ERROR, "",
        "an answer from " + from->peerAlias() + " to a claim sent to another client dropped");
    return;
  }
  it->second->answer = std::move(*a);
  it->second->answered = true;
  it->second->cv.notify_all();
}

// Waits for a synchronous request as the delay mode says.
Status ServerCore::waitFor(const ep::Future& f, uint32_t delayNs, size_t entries) {
  cuObjDelayMode_t mode = params_.getDelayMode();
  if (mode != CUOBJ_DELAY_NONE && mode != CUOBJ_DELAY_ENTRY && mode != CUOBJ_DELAY_ADAPTIVE)
    mode = CUOBJ_DELAY_BATCH;
  // A pause is a wait on the request itself, bounded by the delay: the check interval is the
  // delay's, and a completion ends the pause at once (a sleep of a few microseconds costs the
  // kernel's timer slack, 50 us, every time).
  auto pause = [&f](uint64_t ns) {
    if (ns == 0) {
      std::this_thread::yield();
      return;
    }
    (void)f.wait(std::chrono::milliseconds(std::max<uint64_t>(1, ns / 1000000)));
  };
  const int64_t start = steadyUs();
  uint64_t backoff = 1000;
  while (!f.done()) {
    switch (mode) {
      case CUOBJ_DELAY_NONE: std::this_thread::yield(); break;
      case CUOBJ_DELAY_ENTRY: pause(uint64_t{delayNs} * std::max<size_t>(entries, 1)); break;
      case CUOBJ_DELAY_ADAPTIVE:
        if (steadyUs() - start < static_cast<int64_t>(delayNs / 1000)) break;  // spin first
        pause(std::min<uint64_t>(backoff, delayNs));
        backoff = std::min<uint64_t>(backoff * 2, std::max<uint64_t>(delayNs, 1000));
        break;
      default: pause(delayNs); break;
    }
  }
  return f.status();
}

// Ends a request: forgets the remote range, releases the client, logs, resets on failure.
ibv_wc_status ServerCore::finish(Pending& p, const Status& st, uint16_t channelId) {
  (void)p.endpoint->unregisterRemoteMemoryRegion(p.remote);
  releaseClient(p.client);
  ibv_wc_status wc = wcOf(st);
  std::string line = "op=" + std::string(opName(p.op)) + " size=" + std::to_string(p.size) +
                     " channel=" + std::to_string(channelId) + " status=" + ibv_wc_status_name(wc) +
                     " us=" + std::to_string(steadyUs() - p.startUs);
  if (st.isOk()) {
    log(CUOBJ_LOG_PATH_INFO, p.key, line);
  } else {
    log(CUOBJ_LOG_PATH_ERROR, p.key, line + ": " + st.toString());
    if (params_.getQPResetOnFailure()) {
      std::shared_ptr<ag::PeerConnection> conn;
      {
        std::lock_guard<std::mutex> lock(clientMu_);
        auto it = clients_.find(p.client);
        if (it != clients_.end()) conn = it->second.conn;
      }
      if (conn) dropClient(p.client, conn);
    }
  }
  return wc;
}

}  // namespace ferry::objects
