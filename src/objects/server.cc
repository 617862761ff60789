// cuObjServer (include/ferry/cuobj_server.h) on ferry's agent: the server's agent connects to each
// client its descriptors name, and moves a request's bytes with one WRITE (GET) or READ (PUT)
// batch of the Endpoint API against the range's keys. Those keys are the ones the client confirmed:
// before a byte moves, the server claims the descriptor from the client agent it names, over the
// link the wireup authenticated (descriptor.h, "The grant"), and a descriptor the client did not
// mint, or that served a request already, is refused.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"
#include "common/json.h"
#include "ferry/agent/agent.h"
#include "ferry/cuobj_server.h"
#include "ferry/devices.h"
#include "objects/descriptor.h"
#include "objects/telemetry.h"

namespace ep = ferry::endpoint;
namespace ag = ferry::agent;
using ferry::Status;
using ferry::StatusCode;
using ferry::objects::Telemetry;

namespace {

constexpr size_t kMaxSgEntries = 10;
constexpr int kPollCap = 16;


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

const char* opName(cuObjOpType_t op) { return op == CUOBJ_GET ? "GET" : "PUT"; }

}  // namespace

// One piece of a registered buffer or view: a span of a region the server's agent registered.
struct ObjectPiece {
  uint64_t addr = 0;
  uint64_t size = 0;
  std::string region;  // the agent's region holding it
  uint64_t regionOffset = 0;
};

struct rdma_buffer {
  bool view = false;
  rdma_buffer* base = nullptr;  // a view's registered buffer
  std::vector<ObjectPiece> pieces;
  uint64_t total = 0;
  uint32_t views = 0;  // views of a registered buffer still out
};

cuObjRDMATunable::cuObjRDMATunable() {
  p_ = cuObjRDMATunableParam{};
  p_.num_dcis = 128;
  p_.cq_depth = 640;
  p_.dc_key = 0xffeeddcc;
  p_.ibv_poll_max_comp_event = 0;
  p_.service_level = 0;
  p_.timeout = 16;
  p_.hop_limit = 4;
  p_.pkey_index = 0;
  p_.max_wr = 0;
  p_.max_sge = 10;
  p_.delay_interval = 5000;
  p_.delay_mode = CUOBJ_DELAY_BATCH;
  p_.qp_reset_on_failure = true;
  p_.retry_cnt = 7;
  p_.traffic_class = 96;
  p_.max_rd_atomic = 0;
}

void cuObjRDMATunable::setTrafficClass(unsigned v) {
  if (v >= 256) {
    Telemetry::logError("", "setTrafficClass(" + std::to_string(v) + "): invalid (0..255), left at " +
                                std::to_string(p_.traffic_class));
    return;
  }
  p_.traffic_class = v;
}

namespace ferry::objects {

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  struct Pending {
    ep::Future future;
    void* handle = nullptr;
    std::shared_ptr<ep::Endpoint> endpoint;
    ep::MrHandle remote = 0;
    std::string key;
    cuObjOpType_t op = CUOBJ_GET;
    size_t size = 0;
    std::string client;  // the client's address bytes
    int64_t startUs = 0;
  };
  struct Channel {
    std::mutex mu;
    bool allocated = false;
    std::deque<Pending> pending;
  };
  struct Client {
    std::shared_ptr<ag::PeerConnection> conn;
    std::list<std::string>::iterator lru;
    uint32_t inflight = 0;
  };

  ServerCore(const char* ip, unsigned short port) : port_(port) {
    if (ip != nullptr) {
      ip_ = ip;
      in6_addr a6{};
      in_addr a4{};
      if (inet_pton(AF_INET, ip, &a4) == 1) {
        valid_ = true;
      } else if (inet_pton(AF_INET6, ip, &a6) == 1) {
        valid_ = true;
        ipv6_ = true;
      }
    }
  }
  ~ServerCore() { close(); }

  int start(const cuObjRDMATunable& params, const std::shared_ptr<Telemetry>& telem) {
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
    auto a = ag::Agent::start(std::move(o));
    if (!a.isOk()) return fail(a.status().toString());
    agent_ = *a;
    std::weak_ptr<ServerCore> weak = weak_from_this();
    agent_->onMessage(std::string(kGrantChannel),
                      [weak](std::shared_ptr<ag::PeerConnection> from, std::string_view body) {
                        if (auto self = weak.lock()) self->onAnswer(from, body);
                      });
    // The device limits: channels need QPs, and max_rd_atomic is capped to what the devices allow.
    int maxQp = INT32_MAX, maxRd = INT32_MAX;
    for (const auto& d : agent_->workerAddress().devices) {
      auto ctx = ferry::openDevice(d.name);
      if (!ctx.isOk()) continue;
      auto attr = ctx->queryDevice();
      if (!attr.isOk()) continue;
      maxQp = std::min(maxQp, attr->maxQp);
      maxRd = std::min(maxRd, attr->maxQpInitRdAtom);
    }
    if (p.num_dcis > maxQp) {
      agent_->shutdown();
      agent_.reset();
      return fail("num_dcis " + std::to_string(p.num_dcis) + " is above the device's " +
                  std::to_string(maxQp) + " queue pairs");
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

  void close() {
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

  bool connected() const { return connected_; }
  const std::string& ip() const { return ip_; }
  int port() const { return connected_ ? boundPort_ : port_; }
  cuObjRDMATunable& params() { return params_; }
  const std::shared_ptr<Telemetry>& telem() const { return telem_; }

  void log(unsigned flag, const std::string& key, const std::string& text) {
    if (telem_)
      telem_->log(flag, key, text);
    else
      Telemetry::logError(key, text);
  }

  // ---- buffers ----
  rdma_buffer* registerPieces(const std::vector<std::pair<void*, size_t>>& entries) {
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

  bool isBuffer(rdma_buffer* b) {
    std::lock_guard<std::mutex> lock(bufMu_);
    return b != nullptr && buffers_.count(b) != 0;
  }

  rdma_buffer* view(rdma_buffer* base, const std::vector<cuObjScatterGatherEntryWithOffset_t>& sg) {
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

  void putView(rdma_buffer* v) {
    std::lock_guard<std::mutex> lock(bufMu_);
    if (v == nullptr) return log(CUOBJ_LOG_PATH_ERROR, "", "putRDMABufferFromSgList: null buffer");
    if (!buffers_.count(v) || !v->view) {
      return log(CUOBJ_LOG_PATH_ERROR, "",
                 "putRDMABufferFromSgList: not a view of getRDMABufferFromSgList()");
    }
    buffers_.erase(v);
    if (buffers_.count(v->base)) --v->base->views;
    delete v;
  }

  void deregister(rdma_buffer* b) {
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

  // ---- channels ----
  uint16_t allocate() {
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

  void free(uint16_t id) {
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

  Channel* channel(uint16_t id) {
    std::lock_guard<std::mutex> lock(chanMu_);
    if (id >= channels_.size() || !channels_[id]->allocated) return nullptr;
    return channels_[id].get();
  }

  // ---- requests ----
  ssize_t request(cuObjOpType_t op, const std::string& key, rdma_buffer* buf, uint64_t remoteStart,
                  size_t size, const std::string& descr, uint32_t pollDelay, uint16_t channelId,
                  uint64_t localOffset, ibv_wc_status* status, void* asyncHandle) {
    auto refuse = [&](ssize_t rc, const std::string& why) {
      log(CUOBJ_LOG_PATH_ERROR, key,
          "op=" + std::string(opName(op)) + " size=" + std::to_string(size) +
              " channel=" + std::to_string(channelId) + " refused: " + why);
      return rc;
    };
    if (!connected_) return refuse(-ENODEV, "no RDMA session");
    Channel* ch = channel(channelId);
    if (ch == nullptr) return refuse(-EIO, "channel " + std::to_string(channelId) + " is not allocated");
    if (remoteStart == 0 || size == 0) return refuse(-EIO, "remote_buf_start and size must be nonzero");
    if (size > CUOBJ_MAX_REQUEST_SIZE) return refuse(-EIO, "size above the 1 GiB limit");
    // The local pieces, resolved under the buffer lock (a buffer may be deregistered meanwhile).
    std::vector<ObjectPiece> pieces;
    {
      std::lock_guard<std::mutex> lock(bufMu_);
      if (buf == nullptr || !buffers_.count(buf)) return refuse(-EIO, "not a registered buffer or view");
      if (buf->pieces.size() > static_cast<size_t>(std::max(0, params_.getMaxSge()))) {
        return refuse(-EIO, std::to_string(buf->pieces.size()) + " entries, above max_sge " +
                                std::to_string(params_.getMaxSge()));
      }
      if (localOffset > buf->total || size > buf->total - localOffset) {
        return refuse(-EIO,
                      "size + local_offset is beyond the buffer's " + std::to_string(buf->total) + " bytes");
      }
      if (buf->pieces.size() > 1 && localOffset != 0) {
        log(CUOBJ_LOG_PATH_ERROR, key,
            "local_offset " + std::to_string(localOffset) + " on a buffer of several entries is taken as 0");
        localOffset = 0;
      }
      pieces = buf->pieces;
    }
    auto d = decodeDescriptor(descr);
    if (!d.isOk()) return refuse(-EIO, d.status().message());
    if (d->op != static_cast<uint8_t>(op)) {
      return refuse(-EIO, std::string("the descriptor grants ") + (d->op == CUOBJ_GET ? "GET" : "PUT") +
                              ", not " + opName(op));
    }
    if (realtimeNs() > d->expiresNs) return refuse(-EIO, "the descriptor expired");
    if (remoteStart < d->addr || size > d->length || remoteStart - d->addr > d->length - size) {
      return refuse(-EIO, "the remote range is outside the descriptor's");
    }
    auto address = ag::WorkerAddress::decode(d->agentAddress);
    if (!address.isOk()) return refuse(-EIO, address.status().message());
    bool family = false;
    for (const auto& c : address->control) family = family || c.ipv6 == ipv6_ || isWildcard();
    if (!family) {
      return refuse(-EAFNOSUPPORT,
                    std::string("the client has no ") + (ipv6_ ? "IPv6" : "IPv4") + " address");
    }

    // The client's connection (wired up on first use, then reused). A connection that just ended
    // (a failed request reset it, the client restarted) is replaced: the agent retires it within
    // moments, and the next lookup wires up anew.
    auto release = [&] { releaseClient(d->agentAddress); };
    std::optional<Descriptor> granted;  // the client's own copy, once it granted this request
    for (int attempt = 0;; ++attempt) {
      std::shared_ptr<ag::PeerConnection> peer;
      std::shared_ptr<ep::Endpoint> endpoint;
      ferry::Result<ag::LaneSet> lanes = Status(StatusCode::kUnavailable, "not connected");
      const auto deadline = std::chrono::steady_clock::now() + connectTimeout_;
      int retries = 0;
      for (;;) {
        auto conn = clientFor(d->agentAddress, key);
        if (!conn.isOk()) {
          if (status) *status = wcOf(conn.status());
          return refuse(conn.status().code() == StatusCode::kResourceExhausted ? -ENOMEM : -EIO,
                        conn.status().toString());
        }
        peer = *conn;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        Status ready = peer->waitReady(std::max(left, std::chrono::milliseconds(1)));
        bool ended = false;  // wired up once, and its endpoint failed or shut down since
        if (ready.isOk()) {
          endpoint = peer->endpoint(ag::OpClass::kRma);
          lanes = peer->lanes();
          if (!endpointEnded(endpoint) && lanes.isOk()) break;
          // The agent's next lookup retires it and wires up anew.
          Status failed = endpoint ? endpoint->failure() : Status::ok();
          ready = Status(StatusCode::kPeerGone,
                         "the connection ended" + (failed.isOk() ? std::string() : ": " + failed.message()));
          ended = true;
        }
        release();
        // A connection that ended is replaced (by the next clientFor), until the deadline. A wireup
        // that failed is tried again a few times only: a dead client fails each new one at once.
        if (std::chrono::steady_clock::now() >= deadline || ready.code() != StatusCode::kPeerGone ||
            (!ended && ++retries > 3)) {
          if (status) *status = wcOf(ready);
          return refuse(-EIO, "client " + address->alias + ": " + ready.toString());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!granted) {
        auto g = claim(peer, ag::uuidText(address->uuid), descr, *d);
        if (!g.isOk()) {
          release();
          if (status) *status = wcOf(g.status());
          return refuse(-EIO, "client " + address->alias + ": " + g.status().toString());
        }
        granted = std::move(*g);
      }
      const std::string& device = lanes->of(ag::OpClass::kRma).remoteDevice;
      const uint32_t* rkey = nullptr;
      for (const auto& k : granted->keys) {
        if (k.first == device) rkey = &k.second;
      }
      if (rkey == nullptr) {
        release();
        return refuse(-EIO, "the descriptor has no key for the client's device " + device);
      }
      ferry::json::Value info = ferry::json::Value::emptyObject();
      info.set("addr", static_cast<int64_t>(granted->addr));
      info.set("length", static_cast<int64_t>(granted->length));
      info.set("rkey", static_cast<int64_t>(*rkey));
      info.set("writable", op == CUOBJ_GET);
      auto remote = endpoint->registerRemoteMemoryRegion(
          "cuobj.req." + std::to_string(nextRequest_.fetch_add(1)), ferry::json::serialize(info));
      if (!remote.isOk()) {
        release();
        return refuse(-EIO, remote.status().toString());
      }
      std::vector<ep::Assignment> batch;
      uint64_t skip = localOffset, left = size, remoteOffset = remoteStart - granted->addr;
      for (const auto& p : pieces) {
        if (left == 0) break;
        if (skip >= p.size) {
          skip -= p.size;
          continue;
        }
        auto local = endpoint->localHandle(p.region);
        if (!local.isOk()) {
          (void)endpoint->unregisterRemoteMemoryRegion(*remote);
          release();
          return refuse(-EIO, "the buffer was deregistered: " + local.status().message());
        }
        uint64_t n = std::min(left, p.size - skip);
        batch.push_back({.local = *local,
                         .remote = *remote,
                         .localOffset = p.regionOffset + skip,
                         .remoteOffset = remoteOffset,
                         .length = n});
        remoteOffset += n;
        left -= n;
        skip = 0;
      }
      Pending pending{.future = {},
                      .handle = asyncHandle,
                      .endpoint = endpoint,
                      .remote = *remote,
                      .key = key,
                      .op = op,
                      .size = size,
                      .client = d->agentAddress,
                      .startUs = steadyUs()};
      std::unique_lock<std::mutex> chLock(ch->mu, std::defer_lock);
      if (asyncHandle != nullptr) {
        chLock.lock();
        if (ch->pending.size() >= std::max(1u, params_.getCqDepth())) {
          chLock.unlock();
          (void)endpoint->unregisterRemoteMemoryRegion(*remote);
          release();
          return refuse(-EIO, "channel " + std::to_string(channelId) + " has cq_depth " +
                                  std::to_string(params_.getCqDepth()) + " requests outstanding");
        }
      }
      auto posted = op == CUOBJ_GET ? endpoint->write(batch) : endpoint->read(batch);
      if (!posted.isOk()) {
        if (chLock.owns_lock()) chLock.unlock();
        (void)endpoint->unregisterRemoteMemoryRegion(*remote);
        release();
        // The connection ended between the check and the post: once more on a new one.
        if (endpointEnded(endpoint) && attempt < 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        return refuse(posted.status().code() == StatusCode::kResourceExhausted ? -ENOMEM : -EIO,
                      "submission failed: " + posted.status().toString());
      }
      pending.future = *posted;
      log(CUOBJ_LOG_PATH_DEBUG, key,
          "op=" + std::string(opName(op)) + " size=" + std::to_string(size) +
              " channel=" + std::to_string(channelId) + " client=" + address->alias + " lane=" +
              lanes->of(ag::OpClass::kRma).label() + " submitted" + (asyncHandle ? " (async)" : ""));
      if (asyncHandle != nullptr) {
        ch->pending.push_back(std::move(pending));
        return 0;
      }
      Status st = waitFor(pending.future, pollDelay, pieces.size());
      ibv_wc_status wc = finish(pending, st, channelId);
      if (status) *status = wc;
      return st.isOk() ? static_cast<ssize_t>(size) : -EIO;
    }
  }

  int poll(cuObjAsyncEvent_t* events, int maxEvents, uint16_t channelId) {
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

 private:
  // A claim sent to a client, waiting for its answer.
  struct Claim {
    std::string peerUuid;  // the client the claim went to: only its answer counts
    bool answered = false;
    GrantAnswer answer;
    std::condition_variable cv;
  };

  // Claims the descriptor `text` (decoded: d) from the client agent it names, on that client's
  // connection: the client's own copy of it, which equals d. kPermissionDenied when the client
  // refused (not minted there, edited, revoked, expired, used already) or granted something else;
  // kTimedOut when no answer came within grantTimeout_; kPeerGone when the claim was not sent.
  ferry::Result<Descriptor> claim(const std::shared_ptr<ag::PeerConnection>& peer,
                                  const std::string& peerUuid, const std::string& text, const Descriptor& d) {
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
      return Status(StatusCode::kPermissionDenied,
                    "the client granted another descriptor than the request's");
    }
    return a.descriptor;
  }

  // An answer to a claim, on the agent's thread. One from another peer than the claim went to, or
  // to a claim no longer waited for (it timed out), is dropped.
  void onAnswer(const std::shared_ptr<ag::PeerConnection>& from, std::string_view body) {
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

  bool isWildcard() const { return ip_ == "0.0.0.0" || ip_ == "::"; }

  // Waits for a synchronous request as the delay mode says.
  Status waitFor(const ep::Future& f, uint32_t delayNs, size_t entries) {
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
  ibv_wc_status finish(Pending& p, const Status& st, uint16_t channelId) {
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

  static const char* ibv_wc_status_name(ibv_wc_status wc) {
    static const char* names[] = {
        "SUCCESS",          "LOC_LEN_ERR",       "LOC_QP_OP_ERR",     "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",     "WR_FLUSH_ERR",      "MW_BIND_ERR",       "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",   "REM_INV_REQ_ERR",   "REM_ACCESS_ERR",    "REM_OP_ERR",
        "RETRY_EXC_ERR",    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",  "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",    "INV_EECN_ERR",      "INV_EEC_STATE_ERR", "FATAL_ERR",
        "RESP_TIMEOUT_ERR", "GENERAL_ERR"};
    int i = static_cast<int>(wc);
    return i >= 0 && i <= IBV_WC_GENERAL_ERR ? names[i] : "UNKNOWN";
  }

  // Whether the endpoint of a connection that was wired up has ended since (failed or shut down).
  static bool endpointEnded(const std::shared_ptr<ep::Endpoint>& endpoint) {
    return !endpoint || endpoint->isShutdown() || !endpoint->failure().isOk();
  }

  // The connection to the client of `address`, counted as in use until releaseClient(). At most
  // num_dcis clients are kept: the least recently used idle one is closed to make room.
  ferry::Result<std::shared_ptr<ag::PeerConnection>> clientFor(const std::string& address,
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

  void releaseClient(const std::string& address) {
    std::lock_guard<std::mutex> lock(clientMu_);
    auto it = clients_.find(address);
    if (it != clients_.end() && it->second.inflight > 0) --it->second.inflight;
  }

  // Forgets a client's connection (it failed): the next request connects anew.
  void dropClient(const std::string& address, const std::shared_ptr<ag::PeerConnection>& conn) {
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

  std::string ip_;
  uint16_t port_ = 0;
  uint16_t boundPort_ = 0;
  bool valid_ = false;
  bool ipv6_ = false;
  std::mutex sessionMu_;
  std::atomic<bool> connected_{false};
  cuObjRDMATunable params_;
  std::shared_ptr<Telemetry> telem_;
  std::shared_ptr<ag::Agent> agent_;
  std::chrono::milliseconds connectTimeout_{10000};
  std::chrono::milliseconds grantTimeout_{2000};

  std::mutex grantMu_;
  std::unordered_map<uint64_t, std::shared_ptr<Claim>> claims_;  // by claim id
  std::atomic<uint64_t> nextClaim_{0};

  std::mutex bufMu_;
  std::unordered_set<rdma_buffer*> buffers_;
  std::atomic<uint64_t> nextRegion_{0};
  std::atomic<uint64_t> nextRequest_{0};

  std::mutex chanMu_;
  std::vector<std::unique_ptr<Channel>> channels_;

  std::mutex clientMu_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, Client> clients_;
};

}  // namespace ferry::objects

using ferry::objects::ServerCore;

// ---- RDMAConnection ----

RDMAConnection::RDMAConnection() = default;

RDMAConnection::RDMAConnection(const char* ip, unsigned short port)
    : core_(std::make_shared<ServerCore>(ip, port)) {}

RDMAConnection::~RDMAConnection() {
  if (core_) core_->close();
}

int RDMAConnection::startRDMASession() {
  if (!core_) return -1;
  return core_->start(params, Telemetry::acquire());
}

void RDMAConnection::initRDMAConfigParams(cuObjRDMATunable config_params) { params = config_params; }

void RDMAConnection::closeRDMASession() {
  if (core_) core_->close();
}

void RDMAConnection::handleDisconnectEvent(struct rdma_cm_id* id) {
  if (core_)
    core_->log(CUOBJ_LOG_PATH_DEBUG, "",
               std::string("disconnect event for rdma_cm_id ") + (id ? "(not one of ferry's)" : "(null)") +
                   ": nothing to drop");
}

namespace {

// The text and port of a sockaddr (IPv4 or IPv6).
bool sockaddrText(const sockaddr* sa, char* out, size_t n, int* port) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(sa);
    if (port) *port = ntohs(s->sin_port);
    return inet_ntop(AF_INET, &s->sin_addr, out, static_cast<socklen_t>(n)) != nullptr;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(sa);
    if (port) *port = ntohs(s->sin6_port);
    return inet_ntop(AF_INET6, &s->sin6_addr, out, static_cast<socklen_t>(n)) != nullptr;
  }
  return false;
}

}  // namespace

char* RDMAConnection::getChannelIP(struct rdma_cm_id* id) {
  static thread_local char text[INET6_ADDRSTRLEN + 1];
  text[0] = '\0';
  if (id != nullptr) {
    if (!sockaddrText(&id->route.addr.src_addr, text, sizeof text, nullptr)) text[0] = '\0';
  } else if (core_) {
    std::snprintf(text, sizeof text, "%s", core_->ip().c_str());
  }
  return text;
}

int RDMAConnection::getChannelPort(struct rdma_cm_id* id) {
  if (id != nullptr) {
    char text[INET6_ADDRSTRLEN + 1];
    int port = 0;
    return sockaddrText(&id->route.addr.src_addr, text, sizeof text, &port) ? port : -1;
  }
  return core_ ? core_->port() : -1;
}

void RDMAConnection::getConfigTunableParam(struct cuObjRDMATunableParam* param) {
  if (param == nullptr) {
    Telemetry::logError("", "getConfigTunableParam: null param");
    return;
  }
  *param = core_ && core_->connected() ? core_->params().values() : params.values();
}

// ---- cuObjServer ----

cuObjServer::cuObjServer(const char* ip, unsigned short port, unsigned /*proto: one protocol*/)
    : RDMAConnection(ip, port) {
  (void)startRDMASession();
}

cuObjServer::cuObjServer(const char* ip, unsigned short port, unsigned /*proto*/, cuObjRDMATunable p)
    : RDMAConnection(ip, port) {
  initRDMAConfigParams(p);
  (void)startRDMASession();
}

cuObjServer::~cuObjServer() {
  if (core_) core_->close();
}

void* cuObjServer::allocHostBuffer(size_t size) {
  if (size == 0) return nullptr;
  long page = sysconf(_SC_PAGESIZE);
  void* p = nullptr;
  if (posix_memalign(&p, page > 0 ? static_cast<size_t>(page) : 4096, size) != 0) return nullptr;
  return p;
}

struct rdma_buffer* cuObjServer::registerBuffer(void* ptr, size_t size) {
  if (!core_ || !core_->connected()) return nullptr;
  if (ptr == nullptr || size == 0) {
    core_->log(CUOBJ_LOG_PATH_ERROR, "", "registerBuffer: null pointer or size 0");
    return nullptr;
  }
  return core_->registerPieces({{ptr, size}});
}

struct rdma_buffer* cuObjServer::registerBuffer(std::vector<cuObjScatterGatherEntry_t> sglist) {
  if (!core_ || !core_->connected()) return nullptr;
  if (sglist.empty() || sglist.size() > kMaxSgEntries) {
    core_->log(CUOBJ_LOG_PATH_ERROR, "",
               "registerBuffer: " + std::to_string(sglist.size()) + " entries (1..10 allowed)");
    return nullptr;
  }
  std::vector<std::pair<void*, size_t>> entries;
  for (const auto& e : sglist) {
    if (e.addr == nullptr || e.size == 0) {
      core_->log(CUOBJ_LOG_PATH_ERROR, "", "registerBuffer: an entry has a null address or size 0");
      return nullptr;
    }
    entries.emplace_back(e.addr, e.size);
  }
  return core_->registerPieces(entries);
}

struct rdma_buffer* cuObjServer::getRDMABufferFromSgList(
    struct rdma_buffer* rdma_buffer, std::vector<cuObjScatterGatherEntryWithOffset_t> sglist) {
  if (!core_) return nullptr;
  return core_->view(rdma_buffer, sglist);
}

void cuObjServer::putRDMABufferFromSgList(struct rdma_buffer* rdma_buffer) {
  if (core_) core_->putView(rdma_buffer);
}

void cuObjServer::deRegisterBuffer(struct rdma_buffer* rdma_buff) {
  if (core_) core_->deregister(rdma_buff);
}

ssize_t cuObjServer::handleGetObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                                     uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                                     uint32_t poll_delay, uint16_t channel, uint64_t local_offset,
                                     ibv_wc_status* status, void* async_handle) {
  if (!core_) return -ENODEV;
  return core_->request(CUOBJ_GET, key, local_rdma_buff, remote_buf_start, size, rdma_descr, poll_delay,
                        channel, local_offset, status, async_handle);
}

ssize_t cuObjServer::handleGetObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                                     uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                                     uint16_t channel, uint64_t local_offset, ibv_wc_status* status,
                                     void* async_handle) {
  if (!core_) return -ENODEV;
  return core_->request(CUOBJ_GET, key, local_rdma_buff, remote_buf_start, size, rdma_descr,
                        core_->params().getDelayInterval(), channel, local_offset, status, async_handle);
}

ssize_t cuObjServer::handlePutObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                                     uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                                     uint32_t poll_delay, uint16_t channel, uint64_t local_offset,
                                     ibv_wc_status* status, void* async_handle) {
  if (!core_) return -ENODEV;
  return core_->request(CUOBJ_PUT, key, local_rdma_buff, remote_buf_start, size, rdma_descr, poll_delay,
                        channel, local_offset, status, async_handle);
}

ssize_t cuObjServer::handlePutObject(const std::string& key, struct rdma_buffer* local_rdma_buff,
                                     uint64_t remote_buf_start, size_t size, const std::string& rdma_descr,
                                     uint16_t channel, uint64_t local_offset, ibv_wc_status* status,
                                     void* async_handle) {
  if (!core_) return -ENODEV;
  return core_->request(CUOBJ_PUT, key, local_rdma_buff, remote_buf_start, size, rdma_descr,
                        core_->params().getDelayInterval(), channel, local_offset, status, async_handle);
}

int cuObjServer::poll(cuObjAsyncEvent_t* events, int max_events, uint16_t channel) {
  if (!core_) return -ENODEV;
  return core_->poll(events, max_events, channel);
}

bool cuObjServer::isConnected() { return core_ && core_->connected(); }

uint16_t cuObjServer::allocateChannelId() {
  return core_ ? core_->allocate() : static_cast<uint16_t>(INVALID_CHANNEL_ID);
}

void cuObjServer::freeChannelId(uint16_t channel_id) {
  if (core_) core_->free(channel_id);
}

void cuObjServer::setupTelemetry(bool use_OTEL, std::ostream* os) { Telemetry::setup(use_OTEL, os); }
void cuObjServer::shutdownTelemetry() { Telemetry::shutdown(); }
void cuObjServer::setTelemFlags(unsigned flags) { Telemetry::setFlags(flags); }
