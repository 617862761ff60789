#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/cuda_driver.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/ibverbs/ibverbs.h"
#include "providers/ibverbs/wait.h"

namespace ferry::ibverbs {

// ferry's verbs numbers are libibverbs' (types.h): the provider passes them through unchanged.
static_assert(verbs::access::kLocalWrite == IBV_ACCESS_LOCAL_WRITE);
static_assert(verbs::access::kRemoteWrite == IBV_ACCESS_REMOTE_WRITE);
static_assert(verbs::access::kRemoteRead == IBV_ACCESS_REMOTE_READ);
static_assert(verbs::access::kRemoteAtomic == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(static_cast<int>(verbs::PortState::kActive) == IBV_PORT_ACTIVE);
static_assert(static_cast<int>(verbs::LinkLayer::kEthernet) == IBV_LINK_LAYER_ETHERNET);
static_assert(static_cast<int>(verbs::LinkLayer::kInfiniband) == IBV_LINK_LAYER_INFINIBAND);
static_assert(static_cast<int>(verbs::Mtu::k4096) == IBV_MTU_4096);
static_assert(static_cast<int>(verbs::AsyncEventType::kCqErr) == IBV_EVENT_CQ_ERR);
static_assert(static_cast<int>(verbs::AsyncEventType::kSrqLimitReached) == IBV_EVENT_SRQ_LIMIT_REACHED);
static_assert(static_cast<int>(verbs::AsyncEventType::kGidChange) == IBV_EVENT_GID_CHANGE);
static_assert(static_cast<int>(verbs::WcStatus::kGeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(verbs::WcOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(verbs::wc_flags::kGrh == IBV_WC_GRH && verbs::wc_flags::kWithImm == IBV_WC_WITH_IMM);

namespace {

using verbs::AsyncEventType;

// GID entries scanned when choosing the default GID index.
constexpr int kMaxGidScan = 256;

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string ipv4Of(const std::string& netdev) {
  if (netdev.empty()) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string address;
  for (ifaddrs* it = list; it != nullptr && address.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET || netdev != it->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text, sizeof text);
    address = text;
  }
  freeifaddrs(list);
  return address;
}

int readInt(const std::string& path, int fallback) {
  std::ifstream f(path);
  int value = fallback;
  if (f >> value) return value;
  return fallback;
}

// What listIbvDevices reports of one libibverbs device.
verbs::DeviceInfo describe(const Api& api, ibv_device* device) {
  verbs::DeviceInfo info;
  info.name = api.getDeviceName(device);
  info.provider = "ibverbs";
  const std::string sysfs = device->ibdev_path;
  const std::string linkLayer = readLine(sysfs + "/ports/1/link_layer");
  if (device->transport_type == IBV_TRANSPORT_IWARP) {
    info.transport = "iWARP";
  } else if (linkLayer == "Ethernet") {
    info.transport = "RoCE";
  } else {
    info.transport = "InfiniBand";
  }
  // The netdev of port 1: the one its first GID is bound to (RoCE), else the PCI function's.
  info.netdev = readLine(sysfs + "/ports/1/gid_attrs/ndevs/0");
  if (info.netdev.empty()) {
    if (DIR* dir = opendir((sysfs + "/device/net").c_str())) {
      while (dirent* entry = readdir(dir)) {
        if (entry->d_name[0] != '.') {
          info.netdev = entry->d_name;
          break;
        }
      }
      closedir(dir);
    }
  }
  info.address = ipv4Of(info.netdev);
  info.guid = be64toh(api.getDeviceGuid(device));
  info.numaNode = readInt(sysfs + "/device/numa_node", -1);
  if (info.numaNode < 0 && !info.netdev.empty()) {
    info.numaNode = readInt("/sys/class/net/" + info.netdev + "/device/numa_node", -1);
  }
  if (info.numaNode < 0) info.numaNode = -1;
  return info;
}

// Opens the first device that gets as far as an RC QP; "" or why none did.
std::string probeDevices(const Api& api) {
  int count = 0;
  ibv_device** list = api.getDeviceList(&count);
  if (list == nullptr) {
    const int err = errno;
    std::string why = std::string("ibv_get_device_list failed: ") + std::strerror(err);
    if (err == ENOSYS) why = "no RDMA devices: this kernel has no RDMA subsystem loaded (" + why + ")";
    return why;
  }
  std::string reason = count == 0 ? "libibverbs lists no RDMA device (none in /sys/class/infiniband)" : "";
  for (int i = 0; i < count; ++i) {
    const std::string name = api.getDeviceName(list[i]);
    auto failed = [&](const char* step) {
      const int err = errno;
      if (!reason.empty()) reason += "; ";
      reason += name + ": " + step + " failed: " + std::strerror(err);
    };
    ibv_context* context = api.openDevice(list[i]);
    if (context == nullptr) {
      failed("ibv_open_device");
      continue;
    }
    bool viable = false;
    if (ibv_pd* pd = api.allocPd(context); pd == nullptr) {
      failed("ibv_alloc_pd");
    } else {
      if (ibv_cq* cq = api.createCq(context, 1, nullptr, nullptr, 0); cq == nullptr) {
        failed("ibv_create_cq");
      } else {
        ibv_qp_init_attr init{};
        init.send_cq = cq;
        init.recv_cq = cq;
        init.cap = {
            .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
        init.qp_type = IBV_QPT_RC;
        if (ibv_qp* qp = api.createQp(pd, &init); qp == nullptr) {
          failed("ibv_create_qp");
        } else {
          viable = true;
          api.destroyQp(qp);
        }
        api.destroyCq(cq);
      }
      api.deallocPd(pd);
    }
    api.closeDevice(context);
    if (viable) {
      reason.clear();
      break;
    }
  }
  api.freeDeviceList(list);
  return reason;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Devices.

std::vector<verbs::DeviceInfo> listIbvDevices() {
  std::vector<verbs::DeviceInfo> devices;
  const Api* api = loadApi(nullptr);
  if (api == nullptr) return devices;
  int count = 0;
  ibv_device** list = api->getDeviceList(&count);
  if (list == nullptr) return devices;
  for (int i = 0; i < count; ++i) devices.push_back(describe(*api, list[i]));
  api->freeDeviceList(list);
  return devices;
}

bool probeIbverbs(std::string* reason) {
  // Decided once: opening a device and creating a QP costs system calls, and listing devices asks
  // for the probe every time.
  static const std::string kFailure = [] {
    std::string why;
    const Api* api = loadApi(&why);
    return api == nullptr ? why : probeDevices(*api);
  }();
  if (!kFailure.empty() && reason != nullptr) *reason = kFailure;
  return kFailure.empty();
}

Result<std::shared_ptr<verbs::ContextImpl>> openIbvDevice(const std::string& name) {
  std::string why;
  const Api* api = loadApi(&why);
  if (api == nullptr) return Status(StatusCode::kUnavailable, "ibverbs provider: " + why);
  int count = 0;
  ibv_device** list = api->getDeviceList(&count);
  if (list == nullptr) return verbsError("ibv_get_device_list", errnoOf(-1));
  Result<std::shared_ptr<verbs::ContextImpl>> result = notFound("no ibverbs device named " + name);
  for (int i = 0; i < count; ++i) {
    if (name != api->getDeviceName(list[i])) continue;
    verbs::DeviceInfo info = describe(*api, list[i]);
    ibv_context* context = api->openDevice(list[i]);
    if (context == nullptr) {
      result = verbsError("ibv_open_device(" + name + ")", errnoOf(-1));
    } else {
      result =
          std::shared_ptr<verbs::ContextImpl>(std::make_shared<IbvContext>(*api, context, std::move(info)));
    }
    break;
  }
  api->freeDeviceList(list);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Context.

IbvContext::IbvContext(const Api& api, ibv_context* context, verbs::DeviceInfo info)
    : api_(api), context_(context), info_(std::move(info)), asyncFd_(context->async_fd) {
  // Waits poll the fd with a timeout, then read without blocking.
  if (int err = setNonBlocking(asyncFd_); err != 0) {
    FERRY_LOG(kWarn, "%s: cannot make the async event fd non-blocking: %s", info_.name.c_str(),
              std::strerror(err));
  }
  ibv_device_attr attr{};
  if (api_.queryDevice(context_, &attr) == 0) portCount_ = attr.phys_port_cnt;
  probeDeviceMemory();
}

// Asked as UCX asks it: registering no buffer (fd -1) fails with EBADF on a device that takes
// dma-bufs, and with EOPNOTSUPP (EPROTONOSUPPORT: the kernel has no such method for this device)
// on one that does not.
void IbvContext::probeDmaBuf() {
  if (api_.regDmabufMr == nullptr) {
    dmaBufRefusal_ = "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)";
    return;
  }
  ibv_pd* pd = api_.allocPd(context_);
  if (pd == nullptr) {
    dmaBufRefusal_ = std::string("ibv_alloc_pd failed while asking whether it registers dma-bufs: ") +
                     std::strerror(errnoOf(-1));
    return;
  }
  errno = 0;
  ibv_mr* mr =
      api_.regDmabufMr(pd, 0, static_cast<size_t>(sysconf(_SC_PAGESIZE)), 0, -1, IBV_ACCESS_LOCAL_WRITE);
  const int err = errno;
  if (mr != nullptr) (void)api_.deregMr(mr);
  (void)api_.deallocPd(pd);
  if (mr == nullptr && (err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == ENOSYS || err == 0)) {
    dmaBufRefusal_ = info_.name + " does not register dma-bufs (ibv_reg_dmabuf_mr: " +
                     (err != 0 ? std::strerror(err) : "refused") + ")";
    return;
  }
  info_.deviceMemory = "dma-buf";
}

void IbvContext::probeDeviceMemory() {
  probeDmaBuf();
  if (info_.deviceMemory.empty()) {
    // No dma-bufs: the NVIDIA peer memory module, where loaded, lets ibv_reg_mr take device
    // pointers (GPUDirect RDMA as it was before dma-bufs).
    peerMemory_ = cuda::peerMemoryModule();
    if (!peerMemory_.empty()) info_.deviceMemory = "peer-memory";
  }
}

IbvContext::~IbvContext() { close(); }

void IbvContext::close() {
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  // PDs (with their QPs, SRQs, MRs, AHs) first, then CQs, then completion channels.
  children_.closeAll();
  std::unique_lock<std::shared_mutex> device(deviceMu_);
  deviceOpen_ = false;
  if (int rc = api_.closeDevice(context_); rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_close_device failed: %s", info_.name.c_str(), std::strerror(errnoOf(rc)));
  }
}

Result<verbs::DeviceAttr> IbvContext::queryDevice() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("query device: the context is closed");
  return queryDeviceLocked();
}

Result<verbs::DeviceAttr> IbvContext::queryDeviceLocked() {
  ibv_device_attr a{};
  if (int rc = api_.queryDevice(context_, &a); rc != 0) return verbsError("ibv_query_device", errnoOf(rc));
  verbs::DeviceAttr d;
  d.fwVer = a.fw_ver;
  d.nodeGuid = be64toh(a.node_guid);
  d.sysImageGuid = be64toh(a.sys_image_guid);
  d.maxMrSize = a.max_mr_size;
  d.pageSizeCap = a.page_size_cap;
  d.vendorId = a.vendor_id;
  d.vendorPartId = a.vendor_part_id;
  d.hwVer = a.hw_ver;
  d.maxQp = a.max_qp;
  d.maxQpWr = a.max_qp_wr;
  d.deviceCapFlags = a.device_cap_flags;
  d.maxSge = a.max_sge;
  d.maxSgeRd = a.max_sge_rd;
  d.maxCq = a.max_cq;
  d.maxCqe = a.max_cqe;
  d.maxMr = a.max_mr;
  d.maxPd = a.max_pd;
  d.maxQpRdAtom = a.max_qp_rd_atom;
  d.maxQpInitRdAtom = a.max_qp_init_rd_atom;
  d.maxSrq = a.max_srq;
  d.maxSrqWr = a.max_srq_wr;
  d.maxSrqSge = a.max_srq_sge;
  d.maxPkeys = a.max_pkeys;
  d.physPortCnt = a.phys_port_cnt;
  d.atomicCap = static_cast<uint8_t>(a.atomic_cap);
  d.maxInlineData = maxInlineData();
  d.localCaAckDelay = a.local_ca_ack_delay;
  return d;
}

uint32_t IbvContext::maxInlineData() {
  // libibverbs does not report the limit; a QP creation refuses a larger max_inline_data. The
  // answer is the largest value one 1-SGE RC QP accepts, found once per device and process.
  static std::mutex processMu;
  static std::map<std::string, int> byDevice;
  {
    std::lock_guard<std::mutex> lock(cacheMu_);
    if (maxInline_ >= 0) return static_cast<uint32_t>(maxInline_);
  }
  std::lock_guard<std::mutex> processLock(processMu);
  int found = 0;
  if (auto it = byDevice.find(info_.name); it != byDevice.end()) {
    found = it->second;
  } else {
    ibv_pd* pd = api_.allocPd(context_);
    ibv_cq* cq = pd != nullptr ? api_.createCq(context_, 1, nullptr, nullptr, 0) : nullptr;
    auto accepts = [&](uint32_t inlineBytes) {
      ibv_qp_init_attr init{};
      init.send_cq = cq;
      init.recv_cq = cq;
      init.cap = {.max_send_wr = 1,
                  .max_recv_wr = 1,
                  .max_send_sge = 1,
                  .max_recv_sge = 1,
                  .max_inline_data = inlineBytes};
      init.qp_type = IBV_QPT_RC;
      ibv_qp* qp = api_.createQp(pd, &init);
      if (qp == nullptr) return false;
      api_.destroyQp(qp);
      return true;
    };
    if (cq != nullptr && accepts(0)) {
      // Largest accepted value in [lo, hi): lo is accepted, hi is not (or is the search bound).
      uint32_t lo = 0;
      uint32_t hi = 4096;
      if (accepts(hi)) {
        lo = hi;
      } else {
        while (hi - lo > 1) {
          const uint32_t mid = lo + (hi - lo) / 2;
          (accepts(mid) ? lo : hi) = mid;
        }
      }
      found = static_cast<int>(lo);
    }
    if (cq != nullptr) api_.destroyCq(cq);
    if (pd != nullptr) api_.deallocPd(pd);
    byDevice[info_.name] = found;
  }
  std::lock_guard<std::mutex> lock(cacheMu_);
  maxInline_ = found;
  return static_cast<uint32_t>(found);
}

Result<verbs::PortAttr> IbvContext::queryPort(uint8_t portNum) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("query port: the context is closed");
  if (portNum == 0 || (portCount_ != 0 && portNum > portCount_)) {
    return invalidArgument("query port: " + info_.name + " has ports 1.." + std::to_string(portCount_));
  }
  ibv_port_attr a{};
  if (int rc = api_.queryPort(context_, portNum, &a); rc != 0)
    return verbsError("ibv_query_port", errnoOf(rc));
  verbs::PortAttr p;
  p.state = static_cast<verbs::PortState>(a.state);
  p.maxMtu = static_cast<verbs::Mtu>(a.max_mtu);
  p.activeMtu = static_cast<verbs::Mtu>(a.active_mtu);
  p.gidTblLen = a.gid_tbl_len;
  p.portCapFlags = a.port_cap_flags;
  p.maxMsgSz = a.max_msg_sz;
  p.lid = a.lid;
  p.smLid = a.sm_lid;
  p.pkeyTblLen = a.pkey_tbl_len;
  p.linkLayer = static_cast<verbs::LinkLayer>(a.link_layer);
  p.activeSpeed = a.active_speed;
  p.activeWidth = a.active_width;
  return p;
}

Result<verbs::Gid> IbvContext::queryGid(uint8_t portNum, int index) {
  int tableLength = -1;
  {
    std::lock_guard<std::mutex> lock(cacheMu_);
    if (auto it = gidTblLen_.find(portNum); it != gidTblLen_.end()) tableLength = it->second;
  }
  if (tableLength < 0) {
    FERRY_ASSIGN_OR_RETURN(verbs::PortAttr port, queryPort(portNum));
    tableLength = port.gidTblLen;
    std::lock_guard<std::mutex> lock(cacheMu_);
    gidTblLen_[portNum] = tableLength;
  }
  if (index < 0 || index >= tableLength) {
    return invalidArgument("query GID: index " + std::to_string(index) + " outside the GID table (" +
                           std::to_string(tableLength) + " entries)");
  }
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("query GID: the context is closed");
  ibv_gid raw{};
  if (api_.queryGid(context_, portNum, index, &raw) != 0) return verbsError("ibv_query_gid", errnoOf(-1));
  verbs::Gid gid;
  std::memcpy(gid.raw.data(), raw.raw, gid.raw.size());
  return gid;
}

std::string IbvContext::gidTypeOf(uint8_t portNum, int index) const {
  return readLine(std::string(context_->device->ibdev_path) + "/ports/" + std::to_string(portNum) +
                  "/gid_attrs/types/" + std::to_string(index));
}

int IbvContext::defaultGidIndex(uint8_t portNum) {
  // FERRY_IB_GID_INDEX names the index outright (as NCCL_IB_GID_INDEX does for NCCL).
  if (std::optional<int> forced = config::ibGidIndex()) return *forced;
  {
    std::lock_guard<std::mutex> lock(cacheMu_);
    if (auto it = defaultGid_.find(portNum); it != defaultGid_.end()) return it->second;
  }
  Result<verbs::PortAttr> port = queryPort(portNum);
  if (!port.isOk()) return 0;
  int best = 0;
  if (port->linkLayer == verbs::LinkLayer::kEthernet) {
    // RoCE: a RoCE v2 GID (routable, UDP) over a RoCE v1 one; among v2, an IPv4-mapped address,
    // then a global IPv6 one, then the IPv6 link-local one.
    int bestScore = -1;
    for (int i = 0; i < std::min(port->gidTblLen, kMaxGidScan); ++i) {
      Result<verbs::Gid> gid = queryGid(portNum, i);
      if (!gid.isOk() || gid->isZero()) continue;
      const auto& raw = gid->raw;
      const bool v2 = gidTypeOf(portNum, i) == "RoCE v2";
      const bool ipv4 = std::all_of(raw.begin(), raw.begin() + 10, [](uint8_t b) { return b == 0; }) &&
                        raw[10] == 0xff && raw[11] == 0xff;
      const bool linkLocal = raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
      const int score = !v2 ? 0 : ipv4 ? 3 : linkLocal ? 1 : 2;
      if (score > bestScore) {
        bestScore = score;
        best = i;
      }
    }
  }
  std::lock_guard<std::mutex> lock(cacheMu_);
  defaultGid_[portNum] = best;
  return best;
}

uint32_t IbvContext::activeMtuBytes(uint8_t portNum) {
  {
    std::lock_guard<std::mutex> lock(cacheMu_);
    if (auto it = mtuBytes_.find(portNum); it != mtuBytes_.end()) return it->second;
  }
  Result<verbs::PortAttr> port = queryPort(portNum);
  if (!port.isOk()) return 0;
  const uint32_t bytes = verbs::mtuBytes(port->activeMtu);
  std::lock_guard<std::mutex> lock(cacheMu_);
  mtuBytes_[portNum] = bytes;
  return bytes;
}

Result<std::shared_ptr<verbs::PdImpl>> IbvContext::allocPd() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("alloc PD: the context is closed");
  ibv_pd* raw = api_.allocPd(context_);
  if (raw == nullptr) return verbsError("ibv_alloc_pd", errnoOf(-1));
  auto pd = std::make_shared<IbvPd>(shared_from_this(), raw);
  children_.add(pd);
  return std::shared_ptr<verbs::PdImpl>(pd);
}

Result<std::shared_ptr<verbs::CompChannelImpl>> IbvContext::createCompChannel() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("create completion channel: the context is closed");
  ibv_comp_channel* raw = api_.createCompChannel(context_);
  if (raw == nullptr) return verbsError("ibv_create_comp_channel", errnoOf(-1));
  auto channel = std::make_shared<IbvCompChannel>(shared_from_this(), raw);
  children_.add(channel);
  return std::shared_ptr<verbs::CompChannelImpl>(channel);
}

Result<std::shared_ptr<verbs::CqImpl>> IbvContext::createCq(int cqe,
                                                            std::shared_ptr<verbs::CompChannelImpl> channel,
                                                            void* userContext) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("create CQ: the context is closed");
  std::shared_ptr<IbvCompChannel> ours;
  if (channel) {
    ours = std::dynamic_pointer_cast<IbvCompChannel>(channel);
    if (!ours || ours->context() != this) {
      return invalidArgument("create CQ: the completion channel belongs to another context");
    }
  }
  auto cq = std::make_shared<IbvCq>(shared_from_this(), ours, userContext);
  // The channel stays open while the CQ is created on it.
  std::shared_lock<std::shared_mutex> channelLock;
  ibv_comp_channel* rawChannel = nullptr;
  if (ours) {
    channelLock = ours->use();
    if (ours->closed()) return closedError("create CQ: the completion channel is closed");
    rawChannel = ours->raw();
  }
  ibv_cq* raw = api_.createCq(context_, cqe, nullptr, rawChannel, 0);
  if (raw == nullptr) return verbsError("ibv_create_cq(cqe " + std::to_string(cqe) + ")", errnoOf(-1));
  cq->attach(raw);
  addCq(raw, cq);
  children_.add(cq);
  return std::shared_ptr<verbs::CqImpl>(cq);
}

void IbvContext::addCq(ibv_cq* cq, const std::shared_ptr<IbvCq>& owner) {
  std::lock_guard<std::mutex> lock(registryMu_);
  cqs_[cq] = owner;
}

void IbvContext::removeCq(ibv_cq* cq) {
  std::lock_guard<std::mutex> lock(registryMu_);
  cqs_.erase(cq);
}

std::shared_ptr<IbvCq> IbvContext::findCq(ibv_cq* cq) {
  std::lock_guard<std::mutex> lock(registryMu_);
  auto it = cqs_.find(cq);
  return it == cqs_.end() ? nullptr : it->second.lock();
}

void IbvContext::addSrq(ibv_srq* srq, const void* id) {
  std::lock_guard<std::mutex> lock(registryMu_);
  srqs_[srq] = id;
}

void IbvContext::removeSrq(ibv_srq* srq) {
  std::lock_guard<std::mutex> lock(registryMu_);
  srqs_.erase(srq);
}

bool IbvContext::describeAsyncEvent(const ibv_async_event& event, verbs::AsyncEvent* out,
                                    std::shared_ptr<IbvCq>* cq) {
  out->type = static_cast<AsyncEventType>(event.event_type);
  switch (event.event_type) {
    case IBV_EVENT_CQ_ERR:
      if ((*cq = findCq(event.element.cq))) {
        (*cq)->markOverflowed();
        out->cqId = (*cq)->id();
      }
      return true;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED: out->qpNum = event.element.qp->qp_num; return true;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      std::lock_guard<std::mutex> registry(registryMu_);
      auto it = srqs_.find(event.element.srq);
      out->srqId = it == srqs_.end() ? nullptr : it->second;
      return true;
    }
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      out->portNum = static_cast<uint8_t>(event.element.port_num);
      if (event.event_type == IBV_EVENT_GID_CHANGE) {
        std::lock_guard<std::mutex> cache(cacheMu_);
        defaultGid_.erase(out->portNum);
      }
      return true;
    case IBV_EVENT_DEVICE_FATAL: return true;
    default: return false;  // an event type ferry has no name for (WQ_FATAL, ...)
  }
}

Result<verbs::AsyncEvent> IbvContext::getAsyncEvent(int timeoutMs) {
  if (timeoutMs < 0) return invalidArgument("get async event: a wait needs a timeout (>= 0 ms)");
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (closed_) return closedError("get async event: the context is closed");
      ibv_async_event event{};
      // The fd is non-blocking: this returns at once when nothing is queued.
      while (api_.getAsyncEvent(context_, &event) == 0) {
        verbs::AsyncEvent out;
        // Released only after the acknowledgement: dropping the last reference destroys the CQ,
        // and ibv_destroy_cq waits for this very event to be acknowledged.
        std::shared_ptr<IbvCq> cq;
        const bool known = describeAsyncEvent(event, &out, &cq);
        // Acknowledged at once: libibverbs' destroy calls wait for every event they delivered.
        api_.ackAsyncEvent(&event);
        cq.reset();
        if (known) return out;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return verbsError("ibv_get_async_event", errnoOf(-1));
      }
    }
    const int left = msLeft(deadline);
    if (left == 0) return Status(StatusCode::kTimedOut, "no async event within the timeout", ETIMEDOUT);
    waitReadable(asyncFd_, left);
  }
}

}  // namespace ferry::ibverbs
