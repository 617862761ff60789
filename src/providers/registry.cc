// The provider table: every device backend ferry was built with, in one explicit list
// (name, priority, probe, device listing, open). Nothing registers itself.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "ferry/common/config.h"
#include "ferry/devices.h"
#include "providers/soft/soft.h"
#ifdef FERRY_PROVIDER_IBVERBS
#include "providers/ibverbs/ibverbs.h"
#endif

namespace ferry {
namespace {

struct ProviderEntry {
  const char* name;
  int priority;
  std::function<bool(std::string*)> probe;
  std::function<std::vector<verbs::DeviceInfo>()> list;
  std::function<Result<std::shared_ptr<verbs::ContextImpl>>(const std::string&)> open;
  std::function<std::vector<std::string>()> paths = [] { return std::vector<std::string>{}; };
};

const std::vector<ProviderEntry>& providerTable() {
  static const std::vector<ProviderEntry> table = {
#ifdef FERRY_PROVIDER_IBVERBS
      // Real RDMA devices (and rxe) list before the software devices.
      {"ibverbs", 20, ibverbs::probeIbverbs, ibverbs::listIbvDevices, ibverbs::openIbvDevice},
#endif
      {"soft", 10, soft::probeSoft,
       [] {
         std::vector<verbs::DeviceInfo> out;
         for (auto& d : soft::listSoftDevices()) out.push_back(d.info);
         return out;
       },
       soft::openSoftDevice,
       [] {
         std::string sameHost;
         soft::sameHostAllowed(&sameHost);
         return std::vector<std::string>{"same-host path: " + sameHost};
       }},
  };
  return table;
}

// FERRY_DEVICES=a,b: only those names are visible. Unset or empty: all.
bool visible(const std::string& name) {
  const std::optional<std::vector<std::string>> wanted = config::devices();
  return !wanted || std::find(wanted->begin(), wanted->end(), name) != wanted->end();
}

std::vector<const ProviderEntry*> byPriority() {
  std::vector<const ProviderEntry*> entries;
  for (const auto& e : providerTable()) entries.push_back(&e);
  std::stable_sort(entries.begin(), entries.end(),
                   [](const ProviderEntry* a, const ProviderEntry* b) { return a->priority > b->priority; });
  return entries;
}

}  // namespace

std::vector<ProviderInfo> listProviders() {
  std::vector<ProviderInfo> out;
  for (const auto* e : byPriority()) {
    ProviderInfo info{e->name, e->priority, false, ""};
    info.available = e->probe(&info.reason);
    if (info.available) info.paths = e->paths();
    out.push_back(std::move(info));
  }
  return out;
}

Result<std::vector<verbs::DeviceInfo>> listDevices() {
  FERRY_RETURN_IF_ERROR(config::check());
  std::vector<verbs::DeviceInfo> out;
  for (const auto* e : byPriority()) {
    std::string reason;
    if (!e->probe(&reason)) continue;
    for (auto& d : e->list()) {
      if (visible(d.name)) out.push_back(std::move(d));
    }
  }
  return out;
}

Result<verbs::Context> openDevice(std::string_view name) {
  FERRY_RETURN_IF_ERROR(config::check());
  std::string wanted(name);
  if (!visible(wanted)) return notFound("device " + wanted + " is hidden by FERRY_DEVICES");
  for (const auto* e : byPriority()) {
    std::string reason;
    if (!e->probe(&reason)) continue;
    auto devices = e->list();
    bool found = std::any_of(devices.begin(), devices.end(),
                             [&](const verbs::DeviceInfo& d) { return d.name == wanted; });
    if (!found) continue;
    FERRY_ASSIGN_OR_RETURN(auto impl, e->open(wanted));
    return verbs::Context(std::move(impl));
  }
  return notFound("no device named " + wanted);
}

}  // namespace ferry
