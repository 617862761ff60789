// The object server's core: its RDMA session (the agent), registered buffers and views, channels,
// and the clients' connections (wired up on first use, kept in an LRU).
#include "objects/server_core.h"

namespace ferry::objects {

// A completion status for a failed operation: the work completion's own when it has one.
ibv_wc_status wcOf(const Status& st) {
  if (st.isOk()) return IBV_WC_SUCCESS;
  if ((st.code() == StatusCode::kWorkCompletionError || st.code() == StatusCode::kPeerGone) &&
      st.cause() > 0 && st.cause() <= IBV_WC_GENERAL_ERR) {
    return static_cast<ibv_wc_status>(st.cause());
  }
  switch (st.code()) {
    case StatusCode::kPeerGone: return IBV_WC_RETRY_EXC_ERR;
    case StatusCode::kCancelled:
    case StatusCode::kClosed: return IBV_WC_WR_FLUSH_ERR;
    case StatusCode::kTimedOut: return IBV_WC_RESP_TIMEOUT_ERR;
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied: return IBV_WC_REM_ACCESS_ERR;
    default: return IBV_WC_GENERAL_ERR;
  }
}

int ServerCore::start(const cuObjRDMATunable& params, const std::shared_ptr<Telemetry>& telem) {
  std::lock_guard<std::mutex> lock(sessionMu_);
  if (connected_) return 0;
  telem_ = telem;
  params_ = params;
  const cuObjRDMATunableParam& p = params_.values();
  auto fail = [&](const std::string& why) {
    telem_->log(CUOBJ_LOG_PATH_ERROR, "",
                "session on [" + ip_ + "]:" + std::to_string(port_) + " failed: " + why);
    return -1;
  };
  if (!valid_) return fail("'" + ip_ + "' is not an IPv4 or IPv6 address");
  if (p.num_dcis < 1 || p.num_dcis >= INVALID_CHANNEL_ID) {
    return fail("num_dcis " + std::to_string(p.num_dcis) + " is outside 1..65534");
  }
  auto a = ag::Agent::start(agentOptions(p));
  if (!a.isOk()) return fail(a.status().toString());
  agent_ = *a;
  std::weak_ptr<ServerCore> weak = weak_from_this();
  agent_->onMessage(std::string(kGrantChannel),
                    [weak](std::shared_ptr<ag::PeerConnection> from, std::string_view body) {
                      if (auto self = weak.lock()) self->onAnswer(from, body);
                    });
  // The device limits: channels need QPs, and max_rd_atomic is capped to what the devices allow.
  const auto [maxQp, maxRd] = deviceLimits();
  if (p.num_dcis > maxQp) {
    agent_->shutdown();
    agent_.reset();
    return fail("num_dcis " + std::to_string(p.num_dcis) + " is above the device's " + std::to_string(maxQp) +
                " queue pairs");
  }
  if (maxRd != INT32_MAX) {
    int& rd = params_.values().max_rd_atomic;
    rd = rd <= 0 ? maxRd : std::min(rd, maxRd);
  }
  channels_.clear();
  for (int i = 0; i < p.num_dcis; ++i) channels_.push_back(std::make_unique<Channel>());
  const auto& control = agent_->workerAddress().control;
  if (!control.empty()) boundPort_ = control.front().port;
  connected_ = true;
  telem_->log(CUOBJ_LOG_PATH_INFO, "",
              "session on [" + ip_ + "]:" + std::to_string(boundPort_) + " with " +
                  std::to_string(p.num_dcis) + " channels, agent " + agent_->workerAddress().describe());
  return 0;
}

ag::AgentOptions ServerCore::agentOptions(const cuObjRDMATunableParam& p) {
  ag::AgentOptions o;
  o.alias = "cuobj-server-" + std::to_string(getpid()) + "-" + std::to_string(port_);
  o.listenHost = ip_;
  o.listenPort = port_;
  // The wireup deadline to a client: the connection's transport timeout (4.096 us * 2^timeout,
  // retry_cnt + 1 tries), at least 10 s.
  double tries = static_cast<double>(std::min<unsigned>(p.retry_cnt, 7) + 1);
  double seconds = 4.096e-6 * static_cast<double>(uint64_t{1} << std::min<unsigned>(p.timeout, 31)) * tries;
  connectTimeout_ = std::chrono::milliseconds(static_cast<int64_t>(std::max(10.0, seconds) * 1000));
  o.connectTimeout = connectTimeout_;
  // A client answers a claim at once: what it may take is the same transport timeout, at least
  // 100 ms (a client that never answers costs its own requests that long).
  grantTimeout_ = std::clamp(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)),
                             std::chrono::milliseconds(100), connectTimeout_);
  return o;
}

std::pair<int, int> ServerCore::deviceLimits() const {
  int maxQp = INT32_MAX, maxRd = INT32_MAX;
  for (const auto& d : agent_->workerAddress().devices) {
    auto ctx = ferry::openDevice(d.name);
    if (!ctx.isOk()) continue;
    auto attr = ctx->queryDevice();
    if (!attr.isOk()) continue;
    maxQp = std::min(maxQp, attr->maxQp);
    maxRd = std::min(maxRd, attr->maxQpInitRdAtom);
  }
  return {maxQp, maxRd};
}

void ServerCore::close() {
  std::lock_guard<std::mutex> lock(sessionMu_);
  if (!connected_) return;
  connected_ = false;
  for (auto& ch : channels_) {
    std::lock_guard<std::mutex> l(ch->mu);
    for (auto& p : ch->pending) (void)p.future.wait(std::chrono::seconds(60));
    ch->pending.clear();
  }
  if (agent_) {
    agent_->onMessage(std::string(kGrantChannel), nullptr);
    agent_->shutdown();
  }
  agent_.reset();
  {
    std::lock_guard<std::mutex> l(clientMu_);
    clients_.clear();
    lru_.clear();
  }
}

void ServerCore::log(unsigned flag, const std::string& key, const std::string& text) {
  if (telem_)
    telem_->log(flag, key, text);
  else
    Telemetry::logError(key, text);
}

rdma_buffer* ServerCore::registerPieces(const std::vector<std::pair<void*, size_t>>& entries) {
  if (!connected_) return nullptr;
  auto buf = std::make_unique<rdma_buffer>();
  std::vector<std::string> done;
  for (const auto& [addr, size] : entries) {
    std::string name = "cuobj.buf." + std::to_string(nextRegion_.fetch_add(1));
    ep::RegionOptions ro;
    ro.remote = ep::RegionOptions::Remote::kNone;  // the server's memory is never reachable by a client
    ro.published = false;
    Status st = agent_->registerMemoryRegion(name, addr, size, ro);
    if (!st.isOk()) {
      for (const auto& n : done) (void)agent_->unregisterMemoryRegion(n);
      log(CUOBJ_LOG_PATH_ERROR, "", "registerBuffer: " + st.toString());
      return nullptr;
    }
    done.push_back(name);
    buf->pieces.push_back({.addr = reinterpret_cast<uint64_t>(addr), .size = size, .region = name});
    buf->total += size;
  }
  rdma_buffer* raw = buf.release();
  std::lock_guard<std::mutex> lock(bufMu_);
  buffers_.insert(raw);
  return raw;
}

bool ServerCore::isBuffer(rdma_buffer* b) {
  std::lock_guard<std::mutex> lock(bufMu_);
  return b != nullptr && buffers_.count(b) != 0;
}

rdma_buffer* ServerCore::view(rdma_buffer* base, const std::vector<cuObjScatterGatherEntryWithOffset_t>& sg) {
  std::lock_guard<std::mutex> lock(bufMu_);
  auto refuse = [&](const std::string& why) -> rdma_buffer* {
    log(CUOBJ_LOG_PATH_ERROR, "", "getRDMABufferFromSgList: " + why);
    return nullptr;
  };
  if (sg.empty()) return refuse("empty list");
  if (base == nullptr) return refuse("null buffer");
  if (!buffers_.count(base)) return refuse("not a buffer of registerBuffer()");
  if (base->view) return refuse("a view, not a registered buffer");
  if (base->pieces.size() != 1)
    return refuse("the buffer has " + std::to_string(base->pieces.size()) + " entries");
  uint64_t sum = 0;
  auto v = std::make_unique<rdma_buffer>();
  v->view = true;
  v->base = base;
  const ObjectPiece& whole = base->pieces.front();
  for (const auto& e : sg) {
    if (e.offset < 0 || e.size == 0 || static_cast<uint64_t>(e.offset) > whole.size ||
        e.size > whole.size - static_cast<uint64_t>(e.offset)) {
      return refuse("piece (" + std::to_string(e.offset) + ", " + std::to_string(e.size) +
                    ") is empty or outside the buffer of " + std::to_string(whole.size) + " bytes");
    }
    sum += e.size;
    v->pieces.push_back({.addr = whole.addr + static_cast<uint64_t>(e.offset),
                         .size = e.size,
                         .region = whole.region,
                         .regionOffset = static_cast<uint64_t>(e.offset)});
  }
  if (sum > whole.size)
    return refuse("the pieces add up to " + std::to_string(sum) + " bytes, above " +
                  std::to_string(whole.size));
  v->total = sum;
  ++base->views;
  rdma_buffer* raw = v.release();
  buffers_.insert(raw);
  return raw;
}

void ServerCore::putView(rdma_buffer* v) {
  std::lock_guard<std::mutex> lock(bufMu_);
  if (v == nullptr) return log(CUOBJ_LOG_PATH_ERROR, "", "putRDMABufferFromSgList: null buffer");
  if (!buffers_.count(v) || !v->view) {
    return log(CUOBJ_LOG_PATH_ERROR, "", "putRDMABufferFromSgList: not a view of getRDMABufferFromSgList()");
  }
  buffers_.erase(v);
  if (buffers_.count(v->base)) --v->base->views;
  delete v;
}

void ServerCore::deregister(rdma_buffer* b) {
  if (b == nullptr) return;
  std::unique_lock<std::mutex> lock(bufMu_);
  if (!buffers_.count(b) || b->view) {
    lock.unlock();
    return log(CUOBJ_LOG_PATH_ERROR, "", "deRegisterBuffer: not a buffer of registerBuffer()");
  }
  buffers_.erase(b);
  // Its views stop working: they name regions that are gone (a request on one fails -EIO).
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if ((*it)->view && (*it)->base == b) {
      delete *it;
      it = buffers_.erase(it);
    } else {
      ++it;
    }
  }
  lock.unlock();
  if (agent_) {
    for (const auto& p : b->pieces) (void)agent_->unregisterMemoryRegion(p.region);
  }
  delete b;
}

uint16_t ServerCore::allocate() {
  std::lock_guard<std::mutex> lock(chanMu_);
  if (!connected_) return INVALID_CHANNEL_ID;
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (!channels_[i]->allocated) {
      channels_[i]->allocated = true;
      return static_cast<uint16_t>(i);
    }
  }
  return INVALID_CHANNEL_ID;
}

void ServerCore::free(uint16_t id) {
  Channel* ch = nullptr;
  {
    std::lock_guard<std::mutex> lock(chanMu_);
    if (id >= channels_.size() || !channels_[id]->allocated) return;
    ch = channels_[id].get();
  }
  std::lock_guard<std::mutex> l(ch->mu);
  while (!ch->pending.empty()) {
    Pending p = std::move(ch->pending.front());
    ch->pending.pop_front();
    Status st = p.future.wait();
    finish(p, st, id);
  }
  std::lock_guard<std::mutex> lock(chanMu_);
  ch->allocated = false;
}

ServerCore::Channel* ServerCore::channel(uint16_t id) {
  std::lock_guard<std::mutex> lock(chanMu_);
  if (id >= channels_.size() || !channels_[id]->allocated) return nullptr;
  return channels_[id].get();
}

// The connection to the client of `address`, counted as in use until releaseClient(). At most
// num_dcis clients are kept: the least recently used idle one is closed to make room.
ferry::Result<std::shared_ptr<ag::PeerConnection>> ServerCore::clientFor(const std::string& address,
                                                                         const std::string& key) {
  std::shared_ptr<ag::PeerConnection> evict;
  std::shared_ptr<ag::PeerConnection> conn;
  {
    std::lock_guard<std::mutex> lock(clientMu_);
    auto it = clients_.find(address);
    if (it != clients_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      // Connected or wiring: reuse. Failed (the client died, or a request failed and reset it),
      // or ended since it was wired up (with requests still in flight on it, which keep the
      // entry): the agent's live connection to that address, or a new one (the lookup retires
      // an ended one).
      Status st = it->second.conn->waitReady(std::chrono::milliseconds(0));
      const bool failed = !st.isOk() && st.code() != StatusCode::kTimedOut;
      if (failed || (st.isOk() && endpointEnded(it->second.conn->endpoint(ag::OpClass::kRma)))) {
        auto c = agent_->connectAddress(address, 1);
        if (!c.isOk()) return c.status();
        it->second.conn = *c;
      }
      ++it->second.inflight;
      return it->second.conn;
    }
    if (clients_.size() >= static_cast<size_t>(params_.getNumDcis())) {
      for (auto r = lru_.rbegin(); r != lru_.rend(); ++r) {
        auto c = clients_.find(*r);
        if (c != clients_.end() && c->second.inflight == 0) {
          evict = c->second.conn;
          lru_.erase(c->second.lru);
          clients_.erase(c);
          break;
        }
      }
      if (!evict) {
        return Status(StatusCode::kResourceExhausted,
                      "all " + std::to_string(params_.getNumDcis()) + " client connections are busy");
      }
    }
    auto c = agent_->connectAddress(address, 1);
    if (!c.isOk()) return c.status();
    conn = *c;
    lru_.push_front(address);
    clients_[address] = Client{.conn = conn, .lru = lru_.begin(), .inflight = 1};
  }
  if (evict) {
    log(CUOBJ_LOG_PATH_DEBUG, key,
        "closing the least recently used client connection (num_dcis " +
            std::to_string(params_.getNumDcis()) + ")");
    agent_->disconnect(evict, "the object server keeps at most " + std::to_string(params_.getNumDcis()) +
                                  " client connections");
  }
  return conn;
}

void ServerCore::releaseClient(const std::string& address) {
  std::lock_guard<std::mutex> lock(clientMu_);
  auto it = clients_.find(address);
  if (it != clients_.end() && it->second.inflight > 0) --it->second.inflight;
}

// Forgets a client's connection (it failed): the next request connects anew.
void ServerCore::dropClient(const std::string& address, const std::shared_ptr<ag::PeerConnection>& conn) {
  {
    std::lock_guard<std::mutex> lock(clientMu_);
    auto it = clients_.find(address);
    if (it == clients_.end() || it->second.conn != conn) return;
    if (it->second.inflight == 0) {
      lru_.erase(it->second.lru);
      clients_.erase(it);
    }
  }
  if (agent_) agent_->disconnect(conn, "a request to it failed");
}

}  // namespace ferry::objects
