// The endpoint metadata codec (metadata.h).
#include "endpoint/metadata.h"

#include <limits>

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

Result<int64_t> intField(const json::Value& object, const char* key, int64_t lo, int64_t hi,
                         const std::string& where, bool required = true, int64_t fallback = 0) {
  const json::Value* value = object.find(key);
  if (value == nullptr) {
    if (!required) return fallback;
    return invalidArgument(where + ": missing \"" + key + "\"");
  }
  auto i = value->getInt();
  if (!i.isOk()) return invalidArgument(where + ": \"" + key + "\" is not an integer");
  if (*i < lo || *i > hi) {
    return invalidArgument(where + ": \"" + key + "\" = " + std::to_string(*i) + " is outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return *i;
}

std::string textField(const json::Value& object, const char* key) {
  const json::Value* value = object.find(key);
  auto s = value ? value->getString() : Result<std::string_view>(invalidArgument(""));
  return s.isOk() ? std::string(*s) : std::string();
}

}  // namespace

Result<RegionMetadata> decodeRegion(std::string name, const json::Value& entry, const std::string& where) {
  if (!entry.isObject()) return invalidArgument(where + ": not an object");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  RegionMetadata r;
  r.name = std::move(name);
  FERRY_ASSIGN_OR_RETURN(int64_t addr, intField(entry, "addr", 0, kMax, where));
  FERRY_ASSIGN_OR_RETURN(int64_t length, intField(entry, "length", 0, kMax, where));
  FERRY_ASSIGN_OR_RETURN(int64_t rkey, intField(entry, "rkey", 0, 0xffffffffll, where));
  if (length > kMax - addr) return invalidArgument(where + ": addr + length overflows");
  r.addr = static_cast<uint64_t>(addr);
  r.length = static_cast<uint64_t>(length);
  r.rkey = static_cast<uint32_t>(rkey);
  if (entry.find("handle") != nullptr) {
    FERRY_ASSIGN_OR_RETURN(int64_t handle, intField(entry, "handle", 0, kMax, where));
    r.handle = static_cast<MrHandle>(handle);
  }
  if (const json::Value* w = entry.find("writable")) {
    auto b = w->getBool();
    if (!b.isOk()) return invalidArgument(where + ": \"writable\" is not a boolean");
    r.writable = *b;
  }
  return r;
}

std::string encodeMetadata(const EndpointMetadata& m, std::string_view mrInfo) {
  json::Value info = json::Value::emptyObject();
  info.set("ferry_endpoint", kMetadataVersion);
  info.set("device", m.device);
  info.set("ib_port", m.ibPort);
  info.set("link_type", m.linkType);
  info.set("num_qp", static_cast<int64_t>(m.numQp));
  info.set("recv_buffer_size", static_cast<int64_t>(m.recvBufferSize));
  info.set("recv_depth", static_cast<int64_t>(m.recvDepth));
  json::Value paths = json::Value::emptyArray();
  for (const auto& p : m.paths) {
    auto path = json::parse(p.toJson());
    paths.push(path.isOk() ? std::move(*path) : json::Value());
  }
  info.set("qp_paths", std::move(paths));
  auto regions = json::parse(mrInfo);
  info.set("mr_info", regions.isOk() ? std::move(*regions) : json::Value::emptyObject());
  return json::serialize(info);
}

Result<EndpointMetadata> decodeMetadata(std::string_view text, const std::string& where) {
  auto error = [&](const std::string& what) { return invalidArgument(where + ": " + what); };
  auto parsed = json::parse(text);
  if (!parsed.isOk()) return error(parsed.status().message());
  const json::Value& info = *parsed;
  if (!info.isObject()) return error("not a JSON object");
  const json::Value* version = info.find("ferry_endpoint");
  if (version == nullptr) return error("not ferry endpoint metadata (no \"ferry_endpoint\" version)");
  auto ver = version->getInt();
  if (!ver.isOk() || *ver < 1) return error("\"ferry_endpoint\" is not a version number");
  if (*ver > kMetadataVersion) {
    return error("version " + std::to_string(*ver) + " is newer than this ferry understands (" +
                 std::to_string(kMetadataVersion) + ")");
  }
  EndpointMetadata m;
  m.device = textField(info, "device");
  m.linkType = textField(info, "link_type");
  if (m.device.empty() || m.device.size() > 255)
    return error("\"device\" is missing, not text, or longer than 255 bytes");
  if (m.linkType.size() > 64) return error("\"link_type\" is longer than 64 bytes");
  FERRY_ASSIGN_OR_RETURN(int64_t ibPort, intField(info, "ib_port", 1, 255, where, false, 1));
  m.ibPort = static_cast<int>(ibPort);
  FERRY_ASSIGN_OR_RETURN(int64_t numQp, intField(info, "num_qp", 1, 64, where));
  m.numQp = static_cast<uint32_t>(numQp);
  FERRY_ASSIGN_OR_RETURN(int64_t recvBufferSize,
                         intField(info, "recv_buffer_size", 64, int64_t{1} << 30, where));
  m.recvBufferSize = static_cast<uint32_t>(recvBufferSize);
  FERRY_ASSIGN_OR_RETURN(int64_t recvDepth, intField(info, "recv_depth", 0, 1 << 20, where, false, 0));
  m.recvDepth = static_cast<uint32_t>(recvDepth);
  const json::Value* pathsValue = info.find("qp_paths");
  if (pathsValue == nullptr || !pathsValue->isArray())
    return error("\"qp_paths\" is missing or not an array");
  const json::Array& pathArray = *pathsValue->array();
  if (pathArray.size() != m.numQp) {
    return error("\"qp_paths\" has " + std::to_string(pathArray.size()) +
                 " entries for num_qp=" + std::to_string(numQp));
  }
  for (size_t i = 0; i < pathArray.size(); ++i) {
    if (!pathArray[i].isObject()) return error("qp_paths[" + std::to_string(i) + "] is not an object");
    auto path = v::Path::fromJson(json::serialize(pathArray[i]));
    if (!path.isOk()) return error("qp_paths[" + std::to_string(i) + "]: " + path.status().message());
    if (path->sqpn == 0) return error("qp_paths[" + std::to_string(i) + "] has no queue pair number");
    if (path->sgid.isZero()) return error("qp_paths[" + std::to_string(i) + "] has no GID");
    m.paths.push_back(*path);
  }
  const json::Value* mrs = info.find("mr_info");
  if (mrs == nullptr)
    return error("\"mr_info\" is missing (an endpoint's metadata lists its regions, maybe none)");
  {
    if (!mrs->isObject()) return error("\"mr_info\" is not an object");
    for (const auto& [name, entry] : *mrs->object()) {
      if (name.empty()) return error("\"mr_info\" has a region without a name");
      FERRY_ASSIGN_OR_RETURN(RegionMetadata r,
                             decodeRegion(name, entry, where + ": mr_info['" + name + "']"));
      m.regions.push_back(std::move(r));
    }
  }
  return m;
}

}  // namespace ferry::endpoint
