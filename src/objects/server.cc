// cuObjServer (include/ferry/cuobj_server.h) on ferry's agent: the server's agent connects to each
// client its descriptors name, and moves a request's bytes with one WRITE (GET) or READ (PUT)
// batch of the Endpoint API against the range's keys. Those keys are the ones the client confirmed:
// before a byte moves, the server claims the descriptor from the client agent it names, over the
// link the wireup authenticated (descriptor.h, "The grant"), and a descriptor the client did not
// mint, or that served a request already, is refused.
// This file holds the public classes (the tunables, RDMAConnection, cuObjServer) over
// ServerCore (server_core.h).
#include "objects/server_core.h"

using ferry::Status;
using ferry::StatusCode;
using ferry::objects::Telemetry;

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
  if (sglist.empty() || sglist.size() > ferry::objects::kMaxSgEntries) {
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
