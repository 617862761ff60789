#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli_args.h"
#include "commands.h"
#include "common/cuda_driver.h"
#include "common/json.h"
#include "ferry/agent/agent.h"
#include "ferry/agent/lanes.h"
#include "ferry/agent/store.h"
#include "ferry/common/config.h"
#include "ferry/common/version.h"
#include "ferry/devices.h"
#include "ferry/verbs/verbs.h"

namespace ferry::cli {
namespace {

const char* portStateName(verbs::PortState s) {
  switch (s) {
    case verbs::PortState::kDown: return "PORT_DOWN";
    case verbs::PortState::kInit: return "PORT_INIT";
    case verbs::PortState::kArmed: return "PORT_ARMED";
    case verbs::PortState::kActive: return "PORT_ACTIVE";
    default: return "PORT_NOP";
  }
}

const char* linkLayerName(verbs::LinkLayer l) {
  switch (l) {
    case verbs::LinkLayer::kInfiniband: return "InfiniBand";
    case verbs::LinkLayer::kEthernet: return "Ethernet";
    default: return "Unspecified";
  }
}

bool hasDevice(const std::vector<verbs::DeviceInfo>& devices, const std::string& name) {
  return std::any_of(devices.begin(), devices.end(),
                     [&](const verbs::DeviceInfo& d) { return d.name == name; });
}

int noSuchDevice(const std::string& name) {
  std::fprintf(stderr, "ferry info: no device named '%s' (ferry info lists them)\n", name.c_str());
  return 1;
}

// What `ferry info --peer ALIAS` answers: the peer's address in the store and the lanes to it,
// computed by the function agent.lanes(peer) uses, from both addresses.
struct PeerAnswer {
  std::shared_ptr<agent::Agent> self;
  agent::WorkerAddress theirs;
  Result<agent::LaneSet> lanes = Status(StatusCode::kUnavailable, "not computed");
};

// Everything --peer needs, fetched before a line is printed: an error here is the command's only output.
Result<PeerAnswer> askPeer(const std::string& peer, const std::string& store, const std::string& scope) {
  auto opened = agent::Store::open(store);
  if (!opened.isOk()) return Status(opened.status().code(), "--store: " + opened.status().message());
  auto bytes = (*opened)->get("/ferry/" + scope + "/agents/" + peer);
  if (!bytes.isOk()) {
    if (bytes.status().code() == StatusCode::kNotFound)
      return Status(StatusCode::kNotFound, "no agent '" + peer + "' in " + store + " (scope " + scope + ")");
    return bytes.status();
  }
  auto theirs = agent::WorkerAddress::decode(*bytes);
  if (!theirs.isOk()) {
    return Status(theirs.status().code(),
                  "agent '" + peer + "' in " + store + ": " + theirs.status().message());
  }
  auto self = agent::Agent::start({.alias = "ferry-info", .store = "", .listenHost = "127.0.0.1"});
  if (!self.isOk())
    return Status(self.status().code(), "no agent can start here: " + self.status().message());
  agent::LaneOverrides overrides;
  if (const std::string forced = config::agentLanes(); !forced.empty()) {
    auto parsed = agent::parseLaneOverrides(forced);
    if (parsed.isOk()) overrides = *parsed;
  }
  PeerAnswer answer{.self = *self, .theirs = *theirs};
  answer.lanes = agent::selectLanes((*self)->workerAddress(), answer.theirs, overrides);
  return answer;
}

// Returns 1 when no lanes reach the peer.
int printPeer(const std::string& peer, const std::string& store, const PeerAnswer& answer) {
  std::printf("peer '%s' in %s:\n", peer.c_str(), store.c_str());
  std::printf("  address:             %s\n", answer.theirs.describe().c_str());
  if (!answer.lanes.isOk()) {
    std::printf("  lanes:               none: %s\n", answer.lanes.status().message().c_str());
    return 1;
  }
  for (int i = 0; i < agent::kNumOpClasses; ++i) {
    const agent::Lane& l = answer.lanes->lanes[i];
    std::printf("  lane %-9s        %-10s %s -> %s: %s\n", agent::opClassName(static_cast<agent::OpClass>(i)),
                l.label().c_str(), l.localDevice.c_str(), l.remoteDevice.c_str(), l.why.c_str());
  }
  return 0;
}

// The agent's view of this host: what it offers peers and how it picks lanes.
void printAgent(const agent::Agent* self, const Status& whyNone) {
  std::printf("\nagent:\n");
  if (self == nullptr) {
    std::printf("  (no agent can start here: %s)\n", whyNone.toString().c_str());
    return;
  }
  const agent::WorkerAddress& mine = self->workerAddress();
  std::printf("  host identity:       %s\n", mine.hostId.c_str());
  std::string devices;
  for (const auto& d : mine.devices) devices += (devices.empty() ? "" : ", ") + d.name;
  std::printf("  devices offered:     %s\n", devices.c_str());
  const std::string forced = config::agentLanes();
  std::printf("  lane rules:          same_host, then rdma (same fabric), then tcp%s%s\n",
              forced.empty() ? "" : "; FERRY_AGENT_LANES=", forced.c_str());
}

// `ferry info --config`: every FERRY_* variable, its setting here and the value in effect.
int printConfig(bool asJson) {
  const std::vector<config::Setting> settings = config::settings();
  bool allValid = true;
  json::Array rows;
  for (const config::Setting& s : settings) {
    allValid = allValid && s.error.empty();
    if (asJson) {
      json::Value row = json::Value::emptyObject();
      row.set("name", s.variable->name);
      row.set("meaning", s.variable->meaning);
      row.set("default", s.variable->defaultText);
      row.set("valid", s.variable->validValues);
      row.set("set", s.set);
      row.set("value",
              s.set ? json::Value(config::isSecret(s.variable->name) ? s.effective : s.raw) : json::Value());
      row.set("effective", s.effective);
      row.set("error", s.error.empty() ? json::Value() : json::Value(s.error));
      rows.push_back(std::move(row));
      continue;
    }
    const std::string shown = config::isSecret(s.variable->name) && s.set ? s.effective : s.raw;
    std::printf("%-22s %s%s\n", s.variable->name, s.set ? shown.c_str() : "(unset)",
                s.set ? "" : (std::string(": ") + s.effective).c_str());
    if (!s.error.empty()) std::printf("%-22s   INVALID: %s\n", "", s.error.c_str());
  }
  // FERRY_* names ferry does not read (a misspelling is ignored otherwise), then the ones its own
  // tests and tools read. Neither changes the exit code: only a refused value does.
  const std::vector<config::UnknownVariable> unknown = config::unknownVariables();
  if (asJson) {
    json::Array unknownRows;
    for (const config::UnknownVariable& u : unknown) {
      json::Value row = json::Value::emptyObject();
      row.set("name", u.name);
      row.set("suggestion", u.suggestion.empty() ? json::Value() : json::Value(u.suggestion));
      row.set("warning", u.warning());
      unknownRows.push_back(std::move(row));
    }
    json::Array reservedRows;
    for (const config::ReservedVariable& r : config::reservedVariables()) {
      json::Value row = json::Value::emptyObject();
      row.set("name", r.name);
      row.set("read_by", r.readBy);
      row.set("set", std::getenv(r.name) != nullptr);
      reservedRows.push_back(std::move(row));
    }
    json::Value doc = json::Value::emptyObject();
    doc.set("version", version());
    doc.set("config", json::Value(std::move(rows)));
    doc.set("unknown", json::Value(std::move(unknownRows)));
    doc.set("reserved", json::Value(std::move(reservedRows)));
    std::printf("%s\n", json::serialize(doc).c_str());
    return allValid ? 0 : 2;
  }
  if (!unknown.empty()) {
    std::printf("\nnot ferry variables (set here, never read):\n");
    for (const config::UnknownVariable& u : unknown) {
      // The value is not shown: a misspelt secret is still a secret.
      if (u.suggestion.empty()) {
        std::printf("%-24s no ferry variable is close\n", u.name.c_str());
      } else {
        std::printf("%-24s did you mean %s?\n", u.name.c_str(), u.suggestion.c_str());
      }
    }
  }
  std::printf("\nread by ferry's own tests and tools, never by the library:\n");
  for (const config::ReservedVariable& r : config::reservedVariables()) {
    const char* value = std::getenv(r.name);
    std::printf("%-24s %s: %s\n", r.name, value != nullptr ? value : "(unset)", r.readBy);
  }
  return allValid ? 0 : 2;
}

// `ferry info --json`: providers, devices with their attributes, ports and GIDs, and the settings.
int printJson(const std::string& only) {
  auto listed = listDevices();
  if (listed.isOk() && !only.empty() && !hasDevice(*listed, only)) return noSuchDevice(only);
  json::Value doc = json::Value::emptyObject();
  doc.set("version", version());
  Status valid = config::check();
  doc.set("config_error", valid.isOk() ? json::Value() : json::Value(valid.message()));
  json::Array providers;
  for (const auto& p : listProviders()) {
    json::Value o = json::Value::emptyObject();
    o.set("name", p.name);
    o.set("priority", p.priority);
    o.set("available", p.available);
    o.set("reason", p.reason);
    json::Array paths;
    for (const auto& path : p.paths) paths.push_back(path);
    o.set("paths", json::Value(std::move(paths)));
    providers.push_back(std::move(o));
  }
  doc.set("providers", json::Value(std::move(providers)));
  const cuda::DriverInfo& cudaDriver = cuda::driver();
  json::Value cudaDoc = json::Value::emptyObject();
  cudaDoc.set("usable", cudaDriver.usable);
  cudaDoc.set("library", cudaDriver.library);
  cudaDoc.set("reason", cudaDriver.reason);
  cudaDoc.set("driver_version", cudaDriver.version);
  cudaDoc.set("devices", cudaDriver.devices);
  doc.set("cuda", std::move(cudaDoc));
  json::Array devices;
  for (const auto& d : listed.isOk() ? *listed : std::vector<verbs::DeviceInfo>{}) {
    if (!only.empty() && d.name != only) continue;
    json::Value o = json::Value::emptyObject();
    o.set("name", d.name);
    o.set("provider", d.provider);
    o.set("transport", d.transport);
    o.set("netdev", d.netdev);
    o.set("address", d.address);
    char guid[17];
    std::snprintf(guid, sizeof guid, "%016" PRIx64, d.guid);
    o.set("node_guid", guid);
    o.set("numa_node", d.numaNode);
    auto ctx = openDevice(d.name);
    if (!ctx.isOk()) {
      o.set("error", ctx.status().toString());
      devices.push_back(std::move(o));
      continue;
    }
    o.set("cuda_memory", ctx->info().deviceMemory);  // "" where the device refuses CUDA memory
    if (auto attr = ctx->queryDevice(); attr.isOk()) {
      const auto& a = *attr;
      o.set("fw_ver", a.fwVer);
      o.set("vendor_id", static_cast<int64_t>(a.vendorId));
      o.set("max_mr_size", static_cast<int64_t>(a.maxMrSize));
      o.set("max_qp", a.maxQp);
      o.set("max_qp_wr", a.maxQpWr);
      o.set("max_sge", a.maxSge);
      o.set("max_cq", a.maxCq);
      o.set("max_cqe", a.maxCqe);
      o.set("max_mr", a.maxMr);
      o.set("max_pd", a.maxPd);
      o.set("max_qp_rd_atom", a.maxQpRdAtom);
      o.set("max_srq", a.maxSrq);
      o.set("max_inline_data", static_cast<int64_t>(a.maxInlineData));
      json::Array ports;
      for (uint8_t port = 1; port <= a.physPortCnt; ++port) {
        auto p = ctx->queryPort(port);
        if (!p.isOk()) continue;
        json::Value po = json::Value::emptyObject();
        po.set("port", static_cast<int64_t>(port));
        po.set("state", portStateName(p->state));
        po.set("active_mtu", static_cast<int64_t>(verbs::mtuBytes(p->activeMtu)));
        po.set("link_layer", linkLayerName(p->linkLayer));
        po.set("lid", static_cast<int64_t>(p->lid));
        json::Array gids;
        for (int i = 0; i < p->gidTblLen; ++i) {
          auto gid = ctx->queryGid(port, i);
          if (gid.isOk() && (!gid->isZero() || i == 0)) {
            json::Value g = json::Value::emptyObject();
            g.set("index", i);
            g.set("gid", gid->toString());
            gids.push_back(std::move(g));
          }
        }
        po.set("gids", json::Value(std::move(gids)));
        ports.push_back(std::move(po));
      }
      o.set("ports", json::Value(std::move(ports)));
    }
    devices.push_back(std::move(o));
  }
  doc.set("devices", json::Value(std::move(devices)));
  std::printf("%s\n", json::serialize(doc).c_str());
  if (!listed.isOk()) {
    std::fprintf(stderr, "ferry info: %s\n", listed.status().toString().c_str());
    return valid.isOk() ? 1 : 2;
  }
  return 0;
}

// A device's limits and each port, with the GIDs in use.
void printAttributes(const verbs::Context& ctx, const verbs::DeviceAttr& a) {
  std::printf("  fw_ver:              %s\n", a.fwVer.c_str());
  std::printf("  vendor_id:           0x%04x\n", a.vendorId);
  std::printf("  phys_port_cnt:       %u\n", a.physPortCnt);
  std::printf("  max_mr_size:         0x%" PRIx64 "\n", a.maxMrSize);
  std::printf("  max_qp:              %d\n", a.maxQp);
  std::printf("  max_qp_wr:           %d\n", a.maxQpWr);
  std::printf("  max_sge:             %d\n", a.maxSge);
  std::printf("  max_cq:              %d\n", a.maxCq);
  std::printf("  max_cqe:             %d\n", a.maxCqe);
  std::printf("  max_mr:              %d\n", a.maxMr);
  std::printf("  max_pd:              %d\n", a.maxPd);
  std::printf("  max_qp_rd_atom:      %d\n", a.maxQpRdAtom);
  std::printf("  max_qp_init_rd_atom: %d\n", a.maxQpInitRdAtom);
  std::printf("  max_srq:             %d\n", a.maxSrq);
  std::printf("  max_srq_wr:          %d\n", a.maxSrqWr);
  std::printf("  max_inline_data:     %u\n", a.maxInlineData);
  std::printf("  atomic_cap:          %s\n", a.atomicCap == 0   ? "ATOMIC_NONE"
                                             : a.atomicCap == 1 ? "ATOMIC_HCA"
                                                                : "ATOMIC_GLOB");
  for (uint8_t port = 1; port <= a.physPortCnt; ++port) {
    auto p = ctx.queryPort(port);
    if (!p.isOk()) continue;
    std::printf("  port: %u\n", port);
    std::printf("    state:             %s\n", portStateName(p->state));
    std::printf("    max_mtu:           %u\n", verbs::mtuBytes(p->maxMtu));
    std::printf("    active_mtu:        %u\n", verbs::mtuBytes(p->activeMtu));
    std::printf("    max_msg_sz:        0x%x\n", p->maxMsgSz);
    std::printf("    link_layer:        %s\n", linkLayerName(p->linkLayer));
    std::printf("    lid:               %u\n", p->lid);
    // Only the GIDs in use: NICs have tables of hundreds of entries, mostly empty.
    for (int i = 0; i < p->gidTblLen; ++i) {
      auto gid = ctx.queryGid(port, i);
      if (gid.isOk() && (!gid->isZero() || i == 0)) {
        std::printf("    GID[%d]:            %s\n", i, gid->toString().c_str());
      }
    }
  }
}

// Providers, then each device with its attributes, ports and GIDs (like ibv_devinfo -v).
void printDevices(const std::vector<verbs::DeviceInfo>& devices, const std::string& only) {
  std::printf("providers:\n");
  for (const auto& p : listProviders()) {
    std::printf("  %-8s priority %-3d %s%s%s\n", p.name.c_str(), p.priority,
                p.available ? "available" : "unavailable", p.reason.empty() ? "" : ": ", p.reason.c_str());
    for (const auto& path : p.paths) std::printf("           %s\n", path.c_str());
  }
  std::printf("cuda: %s\n", cuda::describe().c_str());
  for (const auto& d : devices) {
    if (!only.empty() && d.name != only) continue;
    std::printf("\nhca_id: %s\n", d.name.c_str());
    std::printf("  provider:            %s\n", d.provider.c_str());
    std::printf("  transport:           %s\n", d.transport.c_str());
    if (!d.netdev.empty())
      std::printf("  netdev:              %s (%s)\n", d.netdev.c_str(), d.address.c_str());
    std::printf("  node_guid:           %016" PRIx64 "\n", d.guid);
    std::printf("  numa_node:           %d\n", d.numaNode);
    auto ctx = openDevice(d.name);
    if (!ctx.isOk()) {
      std::printf("  (cannot open: %s)\n", ctx.status().toString().c_str());
      continue;
    }
    const std::string& moves = ctx->info().deviceMemory;
    std::printf("  cuda memory:         %s\n", moves.empty() ? "refused (host memory only)" : moves.c_str());
    if (auto attr = ctx->queryDevice(); attr.isOk()) printAttributes(*ctx, *attr);
  }
  if (devices.empty()) std::printf("\nno devices\n");
}

// `ferry info --peer`: the peer's answer, this host's agent, then the devices when `devices` is given.
int infoOfPeer(const std::string& peer, const std::string& store, const std::string& scope,
               const std::vector<verbs::DeviceInfo>* devices, const std::string& only) {
  auto answer = askPeer(peer, store, scope);
  if (!answer.isOk() && answer.status().code() == StatusCode::kInvalidArgument)
    return usageError("ferry info", answer.status().message());
  if (!answer.isOk()) {
    std::fprintf(stderr, "ferry info: %s\n", answer.status().toString().c_str());
    return 1;
  }
  int code = printPeer(peer, store, *answer);
  printAgent(answer->self.get(), Status::ok());
  if (devices != nullptr) {
    std::printf("\n");
    printDevices(*devices, only);
  }
  return code;
}

}  // namespace

int runInfo(const std::vector<std::string>& args) {
  std::string only;
  std::string peer, store, scope = "default";
  bool asJson = false, configOnly = false, withDevices = false;
  CLI::App app(
      "Providers, devices, ports, limits and GIDs (like ibv_devinfo -v), then this host's agent. With "
      "--peer, only the answer about that peer: its address in the store and the lane of each operation "
      "class, and why (the devices follow with --devices).",
      "ferry info");
  app.add_option("--device", only, "only this device")->option_text("NAME");
  app.add_flag("--json", asJson, "one JSON document on stdout (not with --peer)");
  app.add_flag("--config", configOnly, "every FERRY_* variable, its setting here and the value in effect");
  app.add_option("--peer", peer, "the lanes to the agent of this alias (needs --store)")
      ->option_text("ALIAS");
  app.add_option("--store", store, "the discovery store the peer registered in")->option_text("URL");
  app.add_option("--scope", scope, "the peer's scope in the store")
      ->option_text("NAME")
      ->capture_default_str();
  app.add_flag("--devices", withDevices, "with --peer: the providers and devices too, after the peer");
  const CommandHelp help{
      .usage = {"ferry info [--device NAME] [--json]", "ferry info --config [--json]",
                "ferry info --peer ALIAS --store URL [--scope NAME] [--devices] [--device NAME]"},
      .commands = {},
      .done = "listed (with --peer: the lanes to the peer are known)",
      .failed =
          "no devices can be listed, no device has --device's name, or (--peer) the store does not "
          "answer, has no such agent, or no lane reaches it"};
  if (auto code = parseCommand(app, help, args)) return *code;
  const bool peerOptions = !store.empty() || app.count("--scope") > 0 || withDevices;
  if (configOnly && (!only.empty() || !peer.empty() || peerOptions))
    return usageError("ferry info",
                      "--config lists the FERRY_* variables only: drop --device, --peer and its options");
  if (configOnly) return printConfig(asJson);
  if (peer.empty() && peerOptions)
    return usageError("ferry info", "--store, --scope and --devices go with --peer ALIAS");
  if (!peer.empty() && asJson) return usageError("ferry info", "--json does not combine with --peer");
  if (!peer.empty() && store.empty()) return usageError("ferry info", "--peer needs --store URL");
  if (asJson) return printJson(only);

  auto devices = listDevices();
  if (!devices.isOk()) {
    std::fprintf(stderr, "ferry info: %s\n", devices.status().toString().c_str());
    return devices.status().code() == StatusCode::kInvalidArgument ? kBadUsage : 1;
  }
  if (!only.empty() && !hasDevice(*devices, only)) return noSuchDevice(only);
  if (!peer.empty())
    return infoOfPeer(peer, store, scope, withDevices || !only.empty() ? &*devices : nullptr, only);
  printDevices(*devices, only);
  if (!only.empty() || devices->empty()) return 0;
  auto self = agent::Agent::start({.alias = "ferry-info", .store = "", .listenHost = "127.0.0.1"});
  printAgent(self.isOk() ? self->get() : nullptr, self.status());
  return 0;
}

}  // namespace ferry::cli
