#include "ferry/endpoint/context.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <utility>

#include "common/log.h"
#include "ferry/devices.h"
#include "ferry/endpoint/assignment.h"

namespace ferry::endpoint {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Which names a caller may use for a port's link layer; the first is the canonical one.
std::vector<std::string> linkNames(verbs::LinkLayer layer, const verbs::DeviceInfo& info) {
  std::vector<std::string> names;
  switch (layer) {
    case verbs::LinkLayer::kEthernet: names = {"RoCE", "Ethernet", "Eth", "RoCEv2"}; break;
    case verbs::LinkLayer::kInfiniband: names = {"IB", "InfiniBand"}; break;
    case verbs::LinkLayer::kUnspecified: break;
  }
  if (!info.transport.empty()) names.push_back(info.transport);
  return names;
}

// The process-wide table of open contexts: endpoints of one device port share one.
std::mutex gContextsMu;
std::map<std::pair<std::string, int>, std::weak_ptr<RdmaContext>>& openContexts() {
  static auto* table = new std::map<std::pair<std::string, int>, std::weak_ptr<RdmaContext>>();
  return *table;
}

}  // namespace

RdmaContext::~RdmaContext() = default;

std::vector<std::shared_ptr<RdmaContext>> RdmaContext::openNow() {
  std::vector<std::shared_ptr<RdmaContext>> out;
  std::lock_guard<std::mutex> lock(gContextsMu);
  for (auto& [key, weak] : openContexts()) {
    if (auto ctx = weak.lock()) out.push_back(std::move(ctx));
  }
  return out;
}

int RdmaContext::socketId() const { return info_.numaNode < 0 ? 0 : info_.numaNode; }

Result<std::shared_ptr<RdmaContext>> RdmaContext::open(const ContextOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::vector<verbs::DeviceInfo> devices, listDevices());
  if (devices.empty()) return notFound("no RDMA device is available (listDevices() is empty)");
  const verbs::DeviceInfo* device = nullptr;
  if (options.deviceName.empty()) {
    device = &devices.front();
  } else {
    for (const auto& d : devices) {
      if (d.name == options.deviceName) device = &d;
    }
  }
  if (device == nullptr) {
    std::string known;
    for (const auto& d : devices) known += (known.empty() ? "" : ", ") + d.name;
    return notFound("no device '" + options.deviceName + "' (devices: " + known + ")");
  }
  if (options.ibPort < 1 || options.ibPort > 255) {
    return invalidArgument("ib_port " + std::to_string(options.ibPort) + " is not a port number (1..255)");
  }

  std::shared_ptr<RdmaContext> ctx;
  {
    std::lock_guard<std::mutex> lock(gContextsMu);
    auto key = std::make_pair(device->name, options.ibPort);
    auto it = openContexts().find(key);
    if (it != openContexts().end()) ctx = it->second.lock();
    if (!ctx) {
      FERRY_ASSIGN_OR_RETURN(verbs::Context opened, openDevice(device->name));
      FERRY_ASSIGN_OR_RETURN(verbs::DeviceAttr attr, opened.queryDevice());
      if (options.ibPort > attr.physPortCnt) {
        return invalidArgument("device " + device->name + " has " + std::to_string(attr.physPortCnt) +
                               " port(s); ib_port " + std::to_string(options.ibPort) + " does not exist");
      }
      FERRY_ASSIGN_OR_RETURN(verbs::PortAttr port, opened.queryPort(static_cast<uint8_t>(options.ibPort)));
      ctx.reset(new RdmaContext());
      ctx->metrics_ = std::make_shared<Metrics>(opKindNames());
      ctx->ctx_ = std::move(opened);
      ctx->info_ = *device;
      ctx->attr_ = attr;
      ctx->portAttr_ = port;
      ctx->port_ = options.ibPort;
      auto names = linkNames(port.linkLayer, *device);
      ctx->linkType_ = names.empty() ? std::string("unspecified") : names.front();
      openContexts()[key] = ctx;
      // Forget entries whose context is gone.
      for (auto e = openContexts().begin(); e != openContexts().end();) {
        e = e->second.expired() ? openContexts().erase(e) : std::next(e);
      }
    }
  }

  if (!options.linkType.empty()) {
    auto names = linkNames(ctx->portAttr_.linkLayer, ctx->info_);
    bool ok = names.empty();  // a device that does not say accepts any
    for (const auto& n : names) ok = ok || lower(n) == lower(options.linkType);
    if (!ok) {
      std::string accepted;
      for (const auto& n : names) accepted += (accepted.empty() ? "'" : ", '") + n + "'";
      return invalidArgument("link_type '" + options.linkType + "' does not match device " + ctx->info_.name +
                             " port " + std::to_string(ctx->port_) + " (it accepts " + accepted + ")");
    }
  }
  return ctx;
}

Result<std::vector<std::string>> availableNics() {
  FERRY_ASSIGN_OR_RETURN(std::vector<verbs::DeviceInfo> devices, listDevices());
  std::vector<std::string> names;
  names.reserve(devices.size());
  for (auto& d : devices) names.push_back(std::move(d.name));
  return names;
}

int socketId(std::string_view deviceName) {
  auto devices = listDevices();
  if (!devices.isOk()) return 0;
  for (const auto& d : *devices) {
    if (d.name == deviceName) return d.numaNode < 0 ? 0 : d.numaNode;
  }
  return 0;
}

}  // namespace ferry::endpoint
