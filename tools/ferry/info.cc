#include <cinttypes>
#include <cstdio>

#include <cstdlib>
#include <string>

#include "cli_args.h"
#include "commands.h"
#include "common/json.h"
#include "ferry/common/config.h"
#include "ferry/common/version.h"
#include "ferry/agent/agent.h"
#include "ferry/agent/lanes.h"
#include "ferry/agent/store.h"
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

// The agent's view of this host, and with --peer the lanes to that agent (found in --store):
// what agent.lanes(peer) would say, computed here by the same function from both addresses.
int printAgent(const std::string& peer, const std::string& store, const std::string& scope) {
  auto self = agent::Agent::start({.alias = "ferry-info", .store = "", .listenHost = "127.0.0.1"});
  std::printf("\nagent:\n");
  if (!self.isOk()) {
    std::printf("  (no agent can start here: %s)\n", self.status().toString().c_str());
    return peer.empty() ? 0 : 1;
  }
  const agent::WorkerAddress& mine = (*self)->workerAddress();
  std::printf("  host identity:       %s\n", mine.hostId.c_str());
  std::string devices;
  for (const auto& d : mine.devices) devices += (devices.empty() ? "" : ", ") + d.name;
  std::printf("  devices offered:     %s\n", devices.c_str());
  const std::string forced = config::agentLanes();
  std::printf("  lane rules:          same_host, then rdma (same fabric), then tcp%s%s\n",
              forced.empty() ? "" : "; FERRY_AGENT_LANES=", forced.c_str());
  if (peer.empty()) return 0;
  if (store.empty()) {
    std::fprintf(stderr, "ferry info: --peer needs --store URL\n");
    return 2;
  }
  auto opened = agent::Store::open(store);
  if (!opened.isOk()) {
    std::fprintf(stderr, "ferry info: %s\n", opened.status().toString().c_str());
    return 2;
  }
  auto bytes = (*opened)->get("/ferry/" + scope + "/agents/" + peer);
  if (!bytes.isOk()) {
    std::fprintf(stderr, "ferry info: agent '%s' in %s: %s\n", peer.c_str(), store.c_str(),
                 bytes.status().toString().c_str());
    return 1;
  }
  auto theirs = agent::WorkerAddress::decode(*bytes);
  if (!theirs.isOk()) {
    std::fprintf(stderr, "ferry info: agent '%s': %s\n", peer.c_str(), theirs.status().toString().c_str());
    return 1;
  }
  agent::LaneOverrides overrides;
  if (!forced.empty()) {
    auto parsed = agent::parseLaneOverrides(forced);
    if (parsed.isOk()) overrides = *parsed;
  }
  std::printf("  peer '%s':           %s\n", peer.c_str(), theirs->describe().c_str());
  auto lanes = agent::selectLanes(mine, *theirs, overrides);
  if (!lanes.isOk()) {
    std::printf("  lanes:               none: %s\n", lanes.status().message().c_str());
    return 1;
  }
  for (int i = 0; i < agent::kNumOpClasses; ++i) {
    const agent::Lane& l = lanes->lanes[i];
    std::printf("  lane %-9s        %-10s %s -> %s: %s\n", agent::opClassName(static_cast<agent::OpClass>(i)),
                l.label().c_str(), l.localDevice.c_str(), l.remoteDevice.c_str(), l.why.c_str());
  }
  return 0;
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
      row.set("value", s.set ? json::Value(config::isSecret(s.variable->name) ? s.effective : s.raw) : json::Value());
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
  json::Array devices;
  auto listed = listDevices();
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

}  // namespace

int runInfo(const std::vector<std::string>& args) {
  std::string only;
  std::string peer, store, scope = "default";
  bool asJson = false, configOnly = false;
  CLI::App app("Providers, devices, ports, limits and GIDs (like ibv_devinfo -v); the agent's lanes to a peer",
               "ferry info");
  app.add_option("--device", only, "Only this device");
  app.add_flag("--json", asJson, "One JSON document on stdout");
  app.add_flag("--config", configOnly, "Every FERRY_* variable, its setting here and the value in effect");
  app.add_option("--peer", peer, "The lanes to this agent (needs --store)");
  app.add_option("--store", store, "The discovery store the peer registered in");
  app.add_option("--scope", scope, "The store's scope")->capture_default_str();
  if (auto code = parseCommand(app, "info", args)) return *code;
  if (configOnly) return printConfig(asJson);
  if (asJson) {
    if (!peer.empty()) {
      std::fprintf(stderr, "ferry info: --json does not combine with --peer\n");
      return 2;
    }
    return printJson(only);
  }
  std::printf("providers:\n");
  for (const auto& p : listProviders()) {
    std::printf("  %-8s priority %-3d %s%s%s\n", p.name.c_str(), p.priority, p.available ? "available" : "unavailable",
                p.reason.empty() ? "" : ": ", p.reason.c_str());
    for (const auto& path : p.paths) std::printf("           %s\n", path.c_str());
  }
  auto devices = listDevices();
  if (!devices.isOk()) {
    std::fprintf(stderr, "ferry info: %s\n", devices.status().toString().c_str());
    return devices.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  int shown = 0;
  for (const auto& d : *devices) {
    if (!only.empty() && d.name != only) continue;
    ++shown;
    std::printf("\nhca_id: %s\n", d.name.c_str());
    std::printf("  provider:            %s\n", d.provider.c_str());
    std::printf("  transport:           %s\n", d.transport.c_str());
    if (!d.netdev.empty()) std::printf("  netdev:              %s (%s)\n", d.netdev.c_str(), d.address.c_str());
    std::printf("  node_guid:           %016" PRIx64 "\n", d.guid);
    std::printf("  numa_node:           %d\n", d.numaNode);
    auto ctx = openDevice(d.name);
    if (!ctx.isOk()) {
      std::printf("  (cannot open: %s)\n", ctx.status().toString().c_str());
      continue;
    }
    auto attr = ctx->queryDevice();
    if (attr.isOk()) {
      const auto& a = *attr;
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
      std::printf("  atomic_cap:          %s\n", a.atomicCap == 0 ? "ATOMIC_NONE" : a.atomicCap == 1 ? "ATOMIC_HCA" : "ATOMIC_GLOB");
      for (uint8_t port = 1; port <= a.physPortCnt; ++port) {
        auto p = ctx->queryPort(port);
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
          auto gid = ctx->queryGid(port, i);
          if (gid.isOk() && (!gid->isZero() || i == 0)) {
            std::printf("    GID[%d]:            %s\n", i, gid->toString().c_str());
          }
        }
      }
    }
  }
  if (shown == 0) {
    std::printf("\nno devices%s%s\n", only.empty() ? "" : " named ", only.c_str());
    return only.empty() ? 0 : 1;
  }
  return only.empty() || !peer.empty() ? printAgent(peer, store, scope) : 0;
}

}  // namespace ferry::cli
