// cuObjClient (include/ferry/cuobj_client.h): a ferry agent that mints descriptors. Each
// descriptor is a registration of exactly its range, with only the remote access its direction
// needs, made for it alone and revoked (deregistered) when its use ends or expires: the device
// that serves the server's WRITE or READ (this process's soft provider, or the NIC) enforces it.
// Before a server moves a byte for a descriptor it claims it from this client's agent
// (descriptor.h, "The grant"): the client grants only a descriptor it minted, live and never
// claimed before, so a descriptor serves one request, and one forged or edited anywhere serves none.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "agent/crypto.h"
#include "ferry/agent/agent.h"
#include "ferry/common/config.h"
#include "ferry/cuobj_client.h"
#include "objects/descriptor.h"
#include "objects/telemetry.h"

namespace ag = ferry::agent;
namespace ep = ferry::endpoint;
using ferry::Result;
using ferry::Status;
using ferry::objects::Telemetry;

namespace {

// What a callback's handle points to: the call's ctx.
struct CallHandle {
  void* ctx = nullptr;
};

std::mutex& handlesMu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_set<const void*>& liveHandles() {
  static auto* set = new std::unordered_set<const void*>();
  return *set;
}

}  // namespace

namespace ferry::objects {

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  ~ClientCore() { stop(); }

  bool start() {
    telem_ = Telemetry::acquire();
    ag::AgentOptions o;
    o.alias = "cuobj-client-" + std::to_string(getpid()) + "-" + ferry::agent::randomHex(4);
    auto a = ag::Agent::start(std::move(o));
    if (!a.isOk()) {
      telem_->log(CUOBJ_LOG_PATH_ERROR, "", "client session failed: " + a.status().toString());
      return false;
    }
    agent_ = *a;
    // The handler runs on the agent's thread and only looks up the token table.
    std::weak_ptr<ClientCore> weak = weak_from_this();
    agent_->onMessage(std::string(kGrantChannel),
                      [weak](std::shared_ptr<ag::PeerConnection> from, std::string_view body) {
                        if (auto self = weak.lock()) self->onClaim(from, body);
                      });
    ttlNs_ = static_cast<uint64_t>(ferry::config::objectsTokenTtlSeconds()) * 1000000000ull;
    reaper_ = std::thread([this] { reap(); });
    return true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [text, t] : tokens_) names.push_back(t.region);
      for (auto& [addr, r] : regs_) names.push_back(r.region);
      tokens_.clear();
      regs_.clear();
    }
    if (agent_) {
      agent_->onMessage(std::string(kGrantChannel), nullptr);
      for (const auto& n : names) (void)agent_->unregisterMemoryRegion(n);
      agent_->shutdown();
    }
  }

  bool connected() const { return agent_ != nullptr; }
  Telemetry& telem() { return *telem_; }

  cuObjErr_t registerMemory(void* ptr, size_t size) {
    if (!agent_ || ptr == nullptr || size == 0)
      return fail("cuMemObjGetDescriptor: no session, null pointer or size 0");
    uint64_t a = reinterpret_cast<uint64_t>(ptr);
    std::string name = "cuobj.mem." + ferry::agent::randomHex(8);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [addr, r] : regs_) {
        if (a < addr + r.length && addr < a + size)
          return fail("cuMemObjGetDescriptor: overlaps a registration");
      }
      regs_[a] = Registration{.length = size, .region = name};
    }
    ep::RegionOptions ro;
    ro.remote = ep::RegionOptions::Remote::kNone;  // only tokens grant access
    ro.published = false;
    Status st = agent_->registerMemoryRegion(name, ptr, size, ro);
    if (!st.isOk()) {
      std::lock_guard<std::mutex> lock(mu_);
      regs_.erase(a);
      return fail("cuMemObjGetDescriptor: " + st.toString());
    }
    return CU_OBJ_SUCCESS;
  }

  cuObjErr_t unregisterMemory(void* ptr) {
    uint64_t a = reinterpret_cast<uint64_t>(ptr);
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = regs_.find(a);
      if (it == regs_.end()) return fail("cuMemObjPutDescriptor: no registration starts at this address");
      for (auto t = tokens_.begin(); t != tokens_.end();) {
        if (t->second.registration == a) {
          names.push_back(t->second.region);
          t = tokens_.erase(t);
        } else {
          ++t;
        }
      }
      names.push_back(it->second.region);
      regs_.erase(it);
    }
    for (const auto& n : names) (void)agent_->unregisterMemoryRegion(n);
    return CU_OBJ_SUCCESS;
  }

  // The registration holding [a, +size): its start, or nullopt.
  std::optional<uint64_t> containing(uint64_t a, uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regs_.upper_bound(a);
    if (it == regs_.begin()) return std::nullopt;
    --it;
    if (a < it->first || size > it->second.length || a - it->first > it->second.length - size)
      return std::nullopt;
    return it->first;
  }

  ssize_t maxCallbackSize(void* ptr) {
    uint64_t a = reinterpret_cast<uint64_t>(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regs_.upper_bound(a);
    if (it == regs_.begin()) return -EINVAL;
    --it;
    if (a - it->first >= it->second.length) return -EINVAL;
    return static_cast<ssize_t>(std::min<uint64_t>(it->second.length, CUOBJ_MAX_REQUEST_SIZE));
  }

  // A token for [a, +size) in direction op: its descriptor text.
  Result<std::string> mint(cuObjOpType_t op, uint64_t a, uint64_t size) {
    if (!agent_) return Status(ferry::StatusCode::kUnavailable, "no session");
    if (op != CUOBJ_GET && op != CUOBJ_PUT)
      return ferry::invalidArgument("the op is neither CUOBJ_GET nor CUOBJ_PUT");
    if (size == 0 || size > CUOBJ_MAX_REQUEST_SIZE) return ferry::invalidArgument("size 0 or above 1 GiB");
    auto reg = containing(a, size);
    if (!reg) return ferry::invalidArgument("the range is not inside memory of cuMemObjGetDescriptor()");
    std::string name = "cuobj.tok." + ferry::agent::randomHex(8);
    ep::RegionOptions ro;
    ro.published = false;
    if (op == CUOBJ_GET) {
      ro.remote = ep::RegionOptions::Remote::kWriteOnly;  // the server writes the object here
    } else {
      ro.writable = false;  // the server reads the object from here, and may not write it
    }
    FERRY_RETURN_IF_ERROR(agent_->registerMemoryRegion(name, reinterpret_cast<void*>(a), size, ro));
    auto keys = agent_->regionKeys(name);
    if (!keys.isOk()) {
      (void)agent_->unregisterMemoryRegion(name);
      return keys.status();
    }
    Descriptor d;
    d.op = static_cast<uint8_t>(op);
    d.addr = a;
    d.length = size;
    d.expiresNs = realtimeNs() + ttlNs_;
    for (const auto& [device, view] : *keys) d.keys.emplace_back(device, view.rkey);
    d.agentAddress = agent_->address();
    std::string text = encodeDescriptor(d);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!regs_.count(*reg)) {  // put back meanwhile
        (void)agent_->unregisterMemoryRegion(name);
        return ferry::invalidArgument("the registration was put back");
      }
      tokens_[descriptorDigest(text)] = Token{.region = name, .registration = *reg, .descriptor = d};
    }
    cv_.notify_all();
    return text;
  }

  bool revoke(const std::string& text) {
    std::string name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = tokens_.find(descriptorDigest(text));
      if (it == tokens_.end()) return false;
      name = it->second.region;
      tokens_.erase(it);
    }
    (void)agent_->unregisterMemoryRegion(name);
    return true;
  }

  cuObjErr_t fail(const std::string& why) {
    if (telem_) telem_->log(CUOBJ_LOG_PATH_ERROR, "", why);
    return CU_OBJ_FAIL;
  }

 private:
  struct Registration {
    uint64_t length = 0;
    std::string region;
  };
  struct Token {
    std::string region;
    uint64_t registration = 0;
    Descriptor descriptor;
    bool claimed = false;  // a server claimed it for a request: no other request may use it
  };

  // A server's claim of a descriptor (descriptor.h, "The grant"), on the agent's thread: granted
  // once, for a descriptor of this client that is live; the answer goes back on the same link.
  void onClaim(const std::shared_ptr<ag::PeerConnection>& from, std::string_view body) {
    auto claim = decodeClaim(body);
    if (!claim.isOk()) {
      telem_->log(CUOBJ_LOG_PATH_ERROR, "",
                  "a claim from " + from->peerAlias() + " refused: " + claim.status().message());
      return;
    }
    GrantAnswer answer;
    answer.id = claim->id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = tokens_.find(claim->digest);
      if (it == tokens_.end()) {
        answer.reason =
            "no live descriptor of this client has that digest (not minted here, edited, "
            "revoked or expired)";
      } else if (it->second.claimed) {
        answer.reason = "the descriptor was used by a request already";
      } else if (it->second.descriptor.expiresNs <= realtimeNs()) {
        answer.reason = "the descriptor expired";
      } else {
        it->second.claimed = true;
        answer.granted = true;
        answer.descriptor = it->second.descriptor;
      }
    }
    if (!answer.granted) {
      telem_->log(CUOBJ_LOG_PATH_DEBUG, "",
                  "a claim from " + from->peerAlias() + " refused: " + answer.reason);
    }
    Status st = from->sendMessage(kGrantChannel, encodeAnswer(answer));
    if (!st.isOk()) telem_->log(CUOBJ_LOG_PATH_ERROR, "", "a grant answer was not sent: " + st.toString());
  }

  // Revokes tokens at their expiry.
  void reap() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      uint64_t now = realtimeNs(), next = UINT64_MAX;
      std::vector<std::string> expired;
      for (auto it = tokens_.begin(); it != tokens_.end();) {
        if (it->second.descriptor.expiresNs <= now) {
          expired.push_back(it->second.region);
          it = tokens_.erase(it);
        } else {
          next = std::min(next, it->second.descriptor.expiresNs);
          ++it;
        }
      }
      if (!expired.empty()) {
        lock.unlock();
        for (const auto& n : expired) (void)agent_->unregisterMemoryRegion(n);
        telem_->log(CUOBJ_LOG_PATH_DEBUG, "",
                    std::to_string(expired.size()) + " token(s) expired and were revoked");
        lock.lock();
        continue;
      }
      if (next == UINT64_MAX) {
        cv_.wait(lock);
      } else {
        cv_.wait_for(lock, std::chrono::nanoseconds(next - now));
      }
    }
  }

  std::shared_ptr<Telemetry> telem_;
  std::shared_ptr<ag::Agent> agent_;
  uint64_t ttlNs_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<uint64_t, Registration> regs_;          // by start address
  std::unordered_map<std::string, Token> tokens_;  // by descriptorDigest() of the text
  std::thread reaper_;
};

}  // namespace ferry::objects

using ferry::objects::ClientCore;

cuObjClient::cuObjClient(CUObjOps_t& ops, cuObjProto_t /*proto: one protocol*/) : ops_(ops) {
  auto core = std::make_shared<ClientCore>();
  if (core->start()) core_ = std::move(core);
}

cuObjClient::~cuObjClient() {
  if (core_) core_->stop();
}

bool cuObjClient::isConnected() { return core_ != nullptr; }

cuObjErr_t cuObjClient::cuMemObjGetDescriptor(void* ptr, size_t size) {
  return core_ ? core_->registerMemory(ptr, size) : CU_OBJ_FAIL;
}

cuObjErr_t cuObjClient::cuMemObjPutDescriptor(void* ptr) {
  return core_ ? core_->unregisterMemory(ptr) : CU_OBJ_FAIL;
}

ssize_t cuObjClient::cuMemObjGetMaxRequestCallbackSize(void* ptr) {
  return core_ ? core_->maxCallbackSize(ptr) : -EINVAL;
}

ssize_t cuObjClient::transfer(cuObjOpType_t op, void* ctx, void* ptr, size_t size, loff_t offset,
                              loff_t bufOffset) {
  if (!core_ || ptr == nullptr || size == 0 || offset < 0 || bufOffset < 0) return -EINVAL;
  if ((op == CUOBJ_GET && ops_.get == nullptr) || (op == CUOBJ_PUT && ops_.put == nullptr)) return -EINVAL;
  uint64_t start = reinterpret_cast<uint64_t>(ptr) + static_cast<uint64_t>(bufOffset);
  if (start < reinterpret_cast<uint64_t>(ptr) || !core_->containing(start, size)) {
    core_->fail(std::string(op == CUOBJ_GET ? "cuObjGet" : "cuObjPut") +
                ": the range is not inside memory of cuMemObjGetDescriptor()");
    return -EINVAL;
  }
  ssize_t chunk = core_->maxCallbackSize(reinterpret_cast<void*>(start));
  if (chunk <= 0) return -EINVAL;
  CallHandle handle{.ctx = ctx};
  {
    std::lock_guard<std::mutex> lock(handlesMu());
    liveHandles().insert(&handle);
  }
  ssize_t total = 0;
  while (static_cast<size_t>(total) < size) {
    size_t n = std::min<size_t>(static_cast<size_t>(chunk), size - static_cast<size_t>(total));
    uint64_t at = start + static_cast<uint64_t>(total);
    auto text = core_->mint(op, at, n);
    if (!text.isOk()) {
      core_->fail("token: " + text.status().toString());
      total = total > 0 ? total : -ENOMEM;
      break;
    }
    cufileRDMAInfo_t info{
        .version = 1, .desc_len = static_cast<int>(text->size() + 1), .desc_str = text->c_str()};
    loff_t objectOffset = offset + static_cast<loff_t>(total);
    ssize_t r = op == CUOBJ_GET
                    ? ops_.get(&handle, reinterpret_cast<char*>(at), n, objectOffset, &info)
                    : ops_.put(&handle, reinterpret_cast<const char*>(at), n, objectOffset, &info);
    core_->revoke(*text);  // the server may no longer touch the range once the callback returned
    if (r < 0) {
      total = r;
      break;
    }
    total += std::min<ssize_t>(r, static_cast<ssize_t>(n));
    if (static_cast<size_t>(r) < n) break;  // a short count ends the transfer (the object's end)
  }
  {
    std::lock_guard<std::mutex> lock(handlesMu());
    liveHandles().erase(&handle);
  }
  return total;
}

ssize_t cuObjClient::cuObjGet(void* ctx, void* ptr, size_t size, loff_t offset, loff_t buf_offset) {
  return transfer(CUOBJ_GET, ctx, ptr, size, offset, buf_offset);
}

ssize_t cuObjClient::cuObjPut(void* ctx, void* ptr, size_t size, loff_t offset, loff_t buf_offset) {
  return transfer(CUOBJ_PUT, ctx, ptr, size, offset, buf_offset);
}

void* cuObjClient::getCtx(const void* handle) {
  std::lock_guard<std::mutex> lock(handlesMu());
  if (handle == nullptr || !liveHandles().count(handle)) return nullptr;
  return static_cast<const CallHandle*>(handle)->ctx;
}

cuObjErr_t cuObjClient::cuMemObjGetRDMAToken(void* ptr, size_t size, size_t buffer_offset, cuObjOpType_t op,
                                             char** desc_str) {
  if (!core_ || desc_str == nullptr || ptr == nullptr) return CU_OBJ_FAIL;
  uint64_t start = reinterpret_cast<uint64_t>(ptr) + buffer_offset;
  if (start < reinterpret_cast<uint64_t>(ptr)) return core_->fail("cuMemObjGetRDMAToken: the offset wraps");
  auto text = core_->mint(op, start, size);
  if (!text.isOk()) return core_->fail("cuMemObjGetRDMAToken: " + text.status().toString());
  char* out = strdup(text->c_str());
  if (out == nullptr) {
    core_->revoke(*text);
    return CU_OBJ_FAIL;
  }
  *desc_str = out;
  return CU_OBJ_SUCCESS;
}

cuObjErr_t cuObjClient::cuMemObjPutRDMAToken(char* desc_str) {
  if (!core_ || desc_str == nullptr) return CU_OBJ_FAIL;
  if (!core_->revoke(desc_str)) return core_->fail("cuMemObjPutRDMAToken: not a live token of this client");
  std::free(desc_str);
  return CU_OBJ_SUCCESS;
}

void cuObjClient::setupTelemetry(bool use_OTEL, std::ostream* os) { Telemetry::setup(use_OTEL, os); }
void cuObjClient::shutdownTelemetry() { Telemetry::shutdown(); }
void cuObjClient::setTelemFlags(unsigned flags) { Telemetry::setFlags(flags); }
