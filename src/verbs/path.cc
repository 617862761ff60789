#include "ferry/verbs/path.h"

#include <sys/random.h>

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "common/json.h"
#include "common/json_fields.h"
#include "ferry/verbs/verbs.h"

namespace ferry::verbs {

namespace {

// The version written to and required in "ferry_path". Later versions append fields and keep 1;
// a different number means a layout this decoder cannot read.
constexpr int64_t kPathVersion = 1;
constexpr uint32_t kMax24 = (1u << 24) - 1;

}  // namespace

void Path::reverse() {
  std::swap(sgid, dgid);
  std::swap(slid, dlid);
  std::swap(sqpn, dqpn);
  std::swap(sqpsn, dqpsn);
  std::swap(srdatomic, drdatomic);
}

AhAttr Path::ahAttr() const {
  AhAttr ah;
  ah.dgid = dgid;
  ah.flowLabel = flowLabel;
  ah.sgidIndex = sgidIndex;
  ah.hopLimit = hopLimit;
  ah.trafficClass = trafficClass;
  ah.isGlobal = hasGrh;
  ah.dlid = dlid;
  ah.sl = sl;
  ah.srcPathBits = 0;
  ah.staticRate = rate;
  ah.portNum = portNum;
  return ah;
}

std::string Path::toJson() const {
  json::Value v = json::Value::emptyObject();
  v.set("ferry_path", kPathVersion);
  v.set("sgid", sgid.toString());
  v.set("dgid", dgid.toString());
  v.set("sgid_index", sgidIndex);
  v.set("slid", slid);
  v.set("dlid", dlid);
  v.set("sqpn", sqpn);
  v.set("dqpn", dqpn);
  v.set("sqpsn", sqpsn);
  v.set("dqpsn", dqpsn);
  v.set("qkey", qkey);
  v.set("pkey_index", pkeyIndex);
  v.set("mtu", static_cast<int>(mtu));
  v.set("retries", retries);
  v.set("rnr_retries", rnrRetries);
  v.set("min_rnr_timer", minRnrTimer);
  v.set("packet_life_time", packetLifeTime);
  v.set("srdatomic", srdatomic);
  v.set("drdatomic", drdatomic);
  v.set("port_num", portNum);
  v.set("sl", sl);
  v.set("has_grh", hasGrh);
  v.set("hop_limit", hopLimit);
  v.set("traffic_class", trafficClass);
  v.set("flow_label", flowLabel);
  v.set("rate", rate);
  return json::serialize(v);
}

namespace {

// Members a path document leaves out keep their defaults; a present one must be of the right kind
// and in range.
json::FieldErrors pathErrors() { return {.code = StatusCode::kInvalidArgument, .prefix = "path: "}; }

// Reads member `name` as an integer in [min, max] into *out; leaves *out alone when absent.
template <typename T>
Status readInt(const json::Fields& f, const char* name, int64_t min, int64_t max, T* out) {
  FERRY_ASSIGN_OR_RETURN(int64_t i, f.integerOr(name, min, max, static_cast<int64_t>(*out)));
  *out = static_cast<T>(i);
  return Status::ok();
}

Status readBool(const json::Fields& f, const char* name, bool* out) {
  FERRY_ASSIGN_OR_RETURN(*out, f.booleanOr(name, *out));
  return Status::ok();
}

// Longer than any IPv6 text form (45 bytes with an embedded IPv4 address).
constexpr size_t kMaxGidText = 64;

Status readGid(const json::Fields& f, const char* name, Gid* out) {
  FERRY_ASSIGN_OR_RETURN(std::optional<std::string> text, f.optionalText(name, kMaxGidText));
  if (text && !Gid::parse(*text, out)) return f.refuse(name, "is not a GID (IPv6 text form)");
  return Status::ok();
}

}  // namespace

namespace {

// A path document's version, and that it names a queue pair and an address at one of its ends.
Status checkPathDocument(const json::Value& doc) {
  if (!doc.isObject()) return invalidArgument("path: expected a JSON object");
  const json::Value* version = doc.find("ferry_path");
  if (version == nullptr) return invalidArgument("path: missing \"ferry_path\" version field");
  Result<int64_t> versionNumber = version->getInt();
  if (!versionNumber.isOk()) {
    return invalidArgument("path: \"ferry_path\" must be the integer version " +
                           std::to_string(kPathVersion));
  }
  if (*versionNumber != kPathVersion) {
    return invalidArgument("path: unsupported \"ferry_path\" version " + std::to_string(*versionNumber) +
                           " (this build reads version " + std::to_string(kPathVersion) + ")");
  }
  // Other fields may be left out (they keep their defaults), but a path must name a QP and an
  // address at one of its ends: a document without them describes no peer at all.
  if (doc.find("sqpn") == nullptr && doc.find("dqpn") == nullptr) {
    return invalidArgument("path: names no queue pair (neither \"sqpn\" nor \"dqpn\")");
  }
  if (doc.find("sgid") == nullptr && doc.find("dgid") == nullptr && doc.find("slid") == nullptr &&
      doc.find("dlid") == nullptr) {
    return invalidArgument("path: names no address (none of \"sgid\", \"dgid\", \"slid\", \"dlid\")");
  }
  return Status::ok();
}

}  // namespace

Result<Path> Path::fromJson(std::string_view text) {
  Result<json::Value> parsed = json::parse(text);
  if (!parsed.isOk()) return invalidArgument("path: " + parsed.status().message());
  const json::Value& doc = *parsed;
  FERRY_RETURN_IF_ERROR(checkPathDocument(doc));

  constexpr int64_t kU8 = 0xFF;
  constexpr int64_t kU16 = 0xFFFF;
  constexpr int64_t kU32 = 0xFFFFFFFF;
  json::Fields f(doc, pathErrors());
  Path p;
  uint8_t mtuCode = static_cast<uint8_t>(p.mtu);
  FERRY_RETURN_IF_ERROR(readGid(f, "sgid", &p.sgid));
  FERRY_RETURN_IF_ERROR(readGid(f, "dgid", &p.dgid));
  FERRY_RETURN_IF_ERROR(readInt(f, "sgid_index", 0, kU8, &p.sgidIndex));
  FERRY_RETURN_IF_ERROR(readInt(f, "slid", 0, kU16, &p.slid));
  FERRY_RETURN_IF_ERROR(readInt(f, "dlid", 0, kU16, &p.dlid));
  FERRY_RETURN_IF_ERROR(readInt(f, "sqpn", 0, kMax24, &p.sqpn));
  FERRY_RETURN_IF_ERROR(readInt(f, "dqpn", 0, kMax24, &p.dqpn));
  FERRY_RETURN_IF_ERROR(readInt(f, "sqpsn", 0, kMax24, &p.sqpsn));
  FERRY_RETURN_IF_ERROR(readInt(f, "dqpsn", 0, kMax24, &p.dqpsn));
  FERRY_RETURN_IF_ERROR(readInt(f, "qkey", 0, kU32, &p.qkey));
  FERRY_RETURN_IF_ERROR(readInt(f, "pkey_index", 0, kU16, &p.pkeyIndex));
  FERRY_RETURN_IF_ERROR(
      readInt(f, "mtu", static_cast<int64_t>(Mtu::k256), static_cast<int64_t>(Mtu::k4096), &mtuCode));
  p.mtu = static_cast<Mtu>(mtuCode);
  FERRY_RETURN_IF_ERROR(readInt(f, "retries", 0, 7, &p.retries));
  FERRY_RETURN_IF_ERROR(readInt(f, "rnr_retries", 0, 7, &p.rnrRetries));
  FERRY_RETURN_IF_ERROR(readInt(f, "min_rnr_timer", 0, 31, &p.minRnrTimer));
  FERRY_RETURN_IF_ERROR(readInt(f, "packet_life_time", 0, 31, &p.packetLifeTime));
  FERRY_RETURN_IF_ERROR(readInt(f, "srdatomic", 0, kU8, &p.srdatomic));
  FERRY_RETURN_IF_ERROR(readInt(f, "drdatomic", 0, kU8, &p.drdatomic));
  FERRY_RETURN_IF_ERROR(readInt(f, "port_num", 0, kU8, &p.portNum));
  FERRY_RETURN_IF_ERROR(readInt(f, "sl", 0, kU8, &p.sl));
  FERRY_RETURN_IF_ERROR(readBool(f, "has_grh", &p.hasGrh));
  FERRY_RETURN_IF_ERROR(readInt(f, "hop_limit", 0, kU8, &p.hopLimit));
  FERRY_RETURN_IF_ERROR(readInt(f, "traffic_class", 0, kU8, &p.trafficClass));
  FERRY_RETURN_IF_ERROR(readInt(f, "flow_label", 0, (1 << 20) - 1, &p.flowLabel));
  FERRY_RETURN_IF_ERROR(readInt(f, "rate", 0, kU8, &p.rate));
  return p;
}

namespace {

// A uniformly random 24-bit PSN. Predictable PSNs would let a stale or spoofed peer's frames line
// up with a new connection, so this uses the kernel's generator.
uint32_t randomPsn() {
  uint32_t value = 0;
  if (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    std::random_device device;
    value = device();
  }
  return value & kMax24;
}

uint8_t clampDepth(int limit) { return static_cast<uint8_t>(std::clamp(limit, 1, 255)); }

}  // namespace

Status fillPath(const Context& context, const QueuePair& qp, Path& path) {
  if (!qp.valid()) return closedError("fillPath: the QueuePair handle is empty or closed");
  // Index 0 is the default: the device's choice (a RoCE v2 GID on RoCE), 0 on other devices.
  uint8_t gidIndex = path.sgidIndex;
  if (gidIndex == 0 && context.impl()) {
    gidIndex = static_cast<uint8_t>(std::clamp(context.impl()->defaultGidIndex(path.portNum), 0, 255));
  }
  FERRY_ASSIGN_OR_RETURN(Gid gid, context.queryGid(path.portNum, gidIndex));
  FERRY_ASSIGN_OR_RETURN(PortAttr port, context.queryPort(path.portNum));
  FERRY_ASSIGN_OR_RETURN(DeviceAttr device, context.queryDevice());

  uint8_t initiatorDepth = clampDepth(device.maxQpInitRdAtom);
  uint8_t responderDepth = clampDepth(device.maxQpRdAtom);
  Mtu mtu = port.activeMtu;
  // A path that already names its peer (received and reversed) carries the peer's limits: after
  // reverse(), srdatomic is what the peer accepts as responder, drdatomic what it issues as
  // requester, mtu its active MTU. Keeping the smaller of both sides makes the two ends agree.
  if (path.dqpn != 0) {
    initiatorDepth = std::min(initiatorDepth, clampDepth(path.srdatomic));
    responderDepth = std::min(responderDepth, clampDepth(path.drdatomic));
    mtu = std::min(mtu, path.mtu);
  }

  path.sgid = gid;
  path.sgidIndex = gidIndex;
  path.slid = port.lid;  // InfiniBand: the peer's AV needs this port's LID (0 on RoCE)
  path.sqpn = qp.qpNum();
  path.sqpsn = randomPsn();
  path.mtu = mtu;
  path.srdatomic = initiatorDepth;
  path.drdatomic = responderDepth;
  return Status::ok();
}

}  // namespace ferry::verbs
