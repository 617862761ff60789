// Lane selection (lanes.h).
#include "ferry/agent/lanes.h"

#include <arpa/inet.h>

#include <optional>

namespace ferry::agent {
namespace {

using DevicePair = std::pair<const DeviceAddress*, const DeviceAddress*>;

// The first pair `accept` takes: `first`'s devices in order, each with `second`'s in order.
template <typename Accept>
std::optional<DevicePair> firstPair(const WorkerAddress& first, const WorkerAddress& second,
                                    Accept&& accept) {
  for (const auto& a : first.devices) {
    for (const auto& b : second.devices) {
      if (accept(a, b)) return std::make_pair(&a, &b);
    }
  }
  return std::nullopt;
}

// The pair of software TCP devices: in one IPv4 subnet if there is one, else any (routed).
std::optional<DevicePair> tcpPair(const WorkerAddress& first, const WorkerAddress& second, std::string* why) {
  auto v4 = [](const std::string& ip) {
    in_addr a{};
    inet_pton(AF_INET, ip.c_str(), &a);
    return ntohl(a.s_addr);
  };
  auto soft = [](const DeviceAddress& d) { return d.kind == DeviceAddress::Kind::kSoft; };
  bool sameHost = !first.hostId.empty() && first.hostId == second.hostId;
  auto sameSubnet = [&](const DeviceAddress& a, const DeviceAddress& b) {
    if (!soft(a) || !soft(b)) return false;
    // Loopback reaches only this host's own loopback.
    if (a.loopback() || b.loopback()) return sameHost && a.loopback() && b.loopback();
    uint8_t len = std::min(a.prefixLength, b.prefixLength);
    uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
    return (v4(a.ip) & mask) == (v4(b.ip) & mask);
  };
  if (auto p = firstPair(first, second, sameSubnet)) {
    *why = "software TCP devices in one IPv4 subnet";
    return p;
  }
  auto routed = firstPair(first, second, [&](const DeviceAddress& a, const DeviceAddress& b) {
    return soft(a) && soft(b) && !a.loopback() && !b.loopback();
  });
  if (routed) *why = "software TCP devices (different subnets: routed)";
  return routed;
}

// The device pair of one kind, or nothing. `first` is the side with the smaller uuid: candidates
// are enumerated in its device order, then the other's, so both sides find the same pair.
std::optional<DevicePair> findPair(LaneKind kind, const WorkerAddress& first, const WorkerAddress& second,
                                   std::string* why) {
  switch (kind) {
    case LaneKind::kSameHost: {
      if (first.hostId.empty() || first.hostId != second.hostId) return std::nullopt;
      auto p = firstPair(first, second, [](const DeviceAddress& a, const DeviceAddress& b) {
        return a.loopback() && b.loopback();
      });
      if (p) *why = "both agents run on this host (same kernel and network namespace)";
      return p;
    }
    case LaneKind::kRdma: {
      auto p = firstPair(first, second, [](const DeviceAddress& a, const DeviceAddress& b) {
        return a.kind == DeviceAddress::Kind::kRdma && b.kind == DeviceAddress::Kind::kRdma &&
               a.linkLayer == b.linkLayer && std::equal(a.gid.begin(), a.gid.begin() + 8, b.gid.begin());
      });
      if (p) *why = "both have an RDMA port on the same fabric (link layer and GID subnet prefix)";
      return p;
    }
    case LaneKind::kTcp: return tcpPair(first, second, why);
  }
  return std::nullopt;
}

std::string deviceList(const WorkerAddress& a) {
  std::string s;
  for (const auto& d : a.devices) s += (s.empty() ? "" : ", ") + d.name;
  return s.empty() ? "none" : s;
}

}  // namespace

const char* opClassName(OpClass c) {
  switch (c) {
    case OpClass::kMessages: return "messages";
    case OpClass::kRma: return "rma";
    case OpClass::kAtomics: return "atomics";
  }
  return "?";
}

const char* laneKindName(LaneKind k) {
  switch (k) {
    case LaneKind::kSameHost: return "same_host";
    case LaneKind::kRdma: return "rdma";
    case LaneKind::kTcp: return "tcp";
  }
  return "?";
}

Result<LaneKind> parseLaneKind(std::string_view text) {
  if (text == "same_host") return LaneKind::kSameHost;
  if (text == "rdma") return LaneKind::kRdma;
  if (text == "tcp") return LaneKind::kTcp;
  return invalidArgument("unknown lane kind '" + std::string(text) + "' (same_host, rdma or tcp)");
}

std::string Lane::label() const {
  return kind == LaneKind::kRdma ? "rdma:" + localDevice : std::string(laneKindName(kind));
}

Result<LaneOverrides> parseLaneOverrides(std::string_view text) {
  LaneOverrides out;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return invalidArgument("lane override '" + std::string(item) + "' is not CLASS=KIND");
    }
    std::string_view cls = item.substr(0, eq);
    OpClass c;
    if (cls == "messages") {
      c = OpClass::kMessages;
    } else if (cls == "rma") {
      c = OpClass::kRma;
    } else if (cls == "atomics") {
      c = OpClass::kAtomics;
    } else {
      return invalidArgument("lane override: unknown operation class '" + std::string(cls) +
                             "' (messages, rma or atomics)");
    }
    FERRY_ASSIGN_OR_RETURN(LaneKind k, parseLaneKind(item.substr(eq + 1)));
    out[c] = k;
  }
  return out;
}

Result<LaneSet> selectLanes(const WorkerAddress& local, const WorkerAddress& remote,
                            const LaneOverrides& overrides) {
  const bool localFirst = local.uuid < remote.uuid;
  const WorkerAddress& first = localFirst ? local : remote;
  const WorkerAddress& second = localFirst ? remote : local;
  LaneSet set;
  for (int i = 0; i < kNumOpClasses; ++i) {
    OpClass c = static_cast<OpClass>(i);
    std::vector<LaneKind> order{LaneKind::kSameHost, LaneKind::kRdma, LaneKind::kTcp};
    auto forced = overrides.find(c);
    if (forced != overrides.end()) order = {forced->second};
    bool found = false;
    for (LaneKind k : order) {
      std::string why;
      auto pair = findPair(k, first, second, &why);
      if (!pair) continue;
      const DeviceAddress* mine = localFirst ? pair->first : pair->second;
      const DeviceAddress* theirs = localFirst ? pair->second : pair->first;
      if (forced != overrides.end()) why = "configured (" + why + ")";
      set.lanes[i] = Lane{.kind = k, .localDevice = mine->name, .remoteDevice = theirs->name, .why = why};
      found = true;
      break;
    }
    if (!found) {
      if (forced != overrides.end()) {
        return invalidArgument(std::string("lane override ") + opClassName(c) + "=" +
                               laneKindName(forced->second) + " cannot reach '" + remote.alias +
                               "' (devices here: " + deviceList(local) + "; there: " + deviceList(remote) +
                               ")");
      }
      return Status(StatusCode::kUnavailable, "no device pair reaches agent '" + remote.alias +
                                                  "' (devices here: " + deviceList(local) +
                                                  "; there: " + deviceList(remote) + ")");
    }
  }
  return set;
}

}  // namespace ferry::agent
