// Device discovery: every device of every provider ferry was built with, through one table.
//
// FERRY_DEVICES=name,... (comma-separated) restricts which devices are visible, like the visible-
// devices variables of accelerator runtimes; unset or empty shows all.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"
#include "ferry/verbs/verbs.h"

namespace ferry {

struct ProviderInfo {
  std::string name;  // "soft", "ibverbs"
  int priority = 0;  // higher is listed first
  bool available = false;
  std::string reason;  // why it is unavailable (empty when available)
  // The data paths the provider will use here, one "name: state" line each (the soft provider's
  // same-host path, for instance).
  std::vector<std::string> paths;
};

// The providers in the table, with whether each is usable here and why not.
std::vector<ProviderInfo> listProviders();

// Every visible device, highest-priority provider first; within a provider in its own order.
Result<std::vector<verbs::DeviceInfo>> listDevices();

// Opens a device by name (as listDevices() reports it). kNotFound for an unknown or hidden name.
Result<verbs::Context> openDevice(std::string_view name);

}  // namespace ferry
