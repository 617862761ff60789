// RdmaContext: one opened device port, shared by every endpoint and memory pool that uses it.
//
// Opening is cached per process: open() of a device and port that is already open returns the same
// context (while anything still holds it), so endpoints of one device share its verbs context and,
// for ferry's software devices, its progress thread and listener. The context lives as long as its
// last holder (endpoints and pools hold theirs).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/metrics.h"
#include "ferry/common/status.h"
#include "ferry/verbs/types.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

struct ContextOptions {
  std::string deviceName;  // as listDevices() reports it; "" = the first device
  int ibPort = 1;          // 1 .. the device's port count
  // The link type the caller expects: "RoCE" (or "Ethernet") for an Ethernet link layer, "IB" (or
  // "InfiniBand") for InfiniBand, the device's own transport name (e.g. "tcp" for ferry's
  // software devices), or "" for whatever the device has. Case does not matter. Anything the
  // device does not have is refused (kInvalidArgument), naming what it has.
  std::string linkType = "RoCE";
};

class RdmaContext {
 public:
  // Opens (or returns the already open) context of a device port and checks the link type.
  // kNotFound for an unknown device or when no device exists; kInvalidArgument for a port the
  // device does not have or a link type it does not have.
  static Result<std::shared_ptr<RdmaContext>> open(const ContextOptions& options);

  RdmaContext(const RdmaContext&) = delete;
  RdmaContext& operator=(const RdmaContext&) = delete;
  ~RdmaContext();

  const std::string& deviceName() const { return info_.name; }
  int ibPort() const { return port_; }
  // "RoCE" for an Ethernet link layer, "IB" for InfiniBand, else the device's transport name.
  const std::string& linkType() const { return linkType_; }
  // The NUMA node of the device; 0 where unknown.
  int socketId() const;
  const verbs::DeviceInfo& info() const { return info_; }
  const verbs::DeviceAttr& deviceAttr() const { return attr_; }
  const verbs::PortAttr& portAttr() const { return portAttr_; }
  // The verbs context (thread-safe; shared by everything built on this RdmaContext).
  verbs::Context& verbs() { return ctx_; }
  const verbs::Context& verbs() const { return ctx_; }
  // What every endpoint on this context did (see Metrics); shared with their operations.
  const std::shared_ptr<Metrics>& metrics() const { return metrics_; }
  // The contexts open in this process (for process-wide metrics).
  static std::vector<std::shared_ptr<RdmaContext>> openNow();

 private:
  RdmaContext() = default;

  verbs::Context ctx_;
  verbs::DeviceInfo info_;
  verbs::DeviceAttr attr_;
  verbs::PortAttr portAttr_;
  int port_ = 1;
  std::string linkType_;
  std::shared_ptr<Metrics> metrics_;
};

// The names of every usable device, in listDevices() order (the document's available_nic()).
Result<std::vector<std::string>> availableNics();

// The NUMA node of a device (the document's socket_id()); 0 where unknown or for an unknown name.
int socketId(std::string_view deviceName);

}  // namespace ferry::endpoint
