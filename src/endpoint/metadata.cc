// The endpoint metadata codec (metadata.h).
#include "endpoint/metadata.h"

#include <limits>

#include "common/json_fields.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

json::FieldErrors errorsAt(const std::string& where) {
  return {.code = StatusCode::kInvalidArgument, .prefix = where + ": "};
}

}  // namespace

Result<RegionMetadata> decodeRegion(std::string name, const json::Value& entry, const std::string& where) {
  json::Fields f(entry, errorsAt(where));
  if (!entry.isObject()) return f.refuse("not an object");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  RegionMetadata r;
  r.name = std::move(name);
  FERRY_ASSIGN_OR_RETURN(int64_t addr, f.integer("addr", 0, kMax));
  FERRY_ASSIGN_OR_RETURN(int64_t length, f.integer("length", 0, kMax));
  FERRY_ASSIGN_OR_RETURN(int64_t rkey, f.integer("rkey", 0, 0xffffffffll));
  if (length > kMax - addr) return f.refuse("addr + length overflows");
  r.addr = static_cast<uint64_t>(addr);
  r.length = static_cast<uint64_t>(length);
  r.rkey = static_cast<uint32_t>(rkey);
  if (f.has("handle")) {
    FERRY_ASSIGN_OR_RETURN(int64_t handle, f.integer("handle", 0, kMax));
    r.handle = static_cast<MrHandle>(handle);
  }
  FERRY_ASSIGN_OR_RETURN(r.writable, f.booleanOr("writable", r.writable));
  return r;
}

json::Value metadataValue(const EndpointMetadata& m, std::string_view mrInfo) {
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
  return info;
}

std::string encodeMetadata(const EndpointMetadata& m, std::string_view mrInfo) {
  return json::serialize(metadataValue(m, mrInfo));
}

Result<EndpointMetadata> decodeMetadata(std::string_view text, const std::string& where) {
  auto parsed = json::parse(text);
  if (!parsed.isOk()) return errorsAt(where).refuse(parsed.status().message());
  return decodeMetadataValue(*parsed, where);
}

Result<EndpointMetadata> decodeMetadataValue(const json::Value& info, const std::string& where) {
  json::FieldErrors errors = errorsAt(where);
  json::Fields f(info, errors);
  if (!info.isObject()) return f.refuse("not a JSON object");
  // Members are not checked with only(): a later version adds some, and the version number says
  // whether this ferry can read the rest.
  if (!f.has("ferry_endpoint"))
    return f.refuse("not ferry endpoint metadata (no \"ferry_endpoint\" version)");
  FERRY_ASSIGN_OR_RETURN(int64_t version,
                         f.integer("ferry_endpoint", 1, std::numeric_limits<int64_t>::max()));
  if (version > kMetadataVersion) {
    return f.refuse("version " + std::to_string(version) + " is newer than this ferry understands (" +
                    std::to_string(kMetadataVersion) + ")");
  }
  EndpointMetadata m;
  FERRY_ASSIGN_OR_RETURN(m.device, f.text("device", 255));
  if (m.device.empty()) return f.refuse("device", "is empty");
  FERRY_ASSIGN_OR_RETURN(m.linkType, f.textOr("link_type", 64, ""));
  FERRY_ASSIGN_OR_RETURN(int64_t ibPort, f.integerOr("ib_port", 1, 255, 1));
  m.ibPort = static_cast<int>(ibPort);
  FERRY_ASSIGN_OR_RETURN(int64_t numQp, f.integer("num_qp", 1, 64));
  m.numQp = static_cast<uint32_t>(numQp);
  FERRY_ASSIGN_OR_RETURN(int64_t recvBufferSize, f.integer("recv_buffer_size", 64, int64_t{1} << 30));
  m.recvBufferSize = static_cast<uint32_t>(recvBufferSize);
  FERRY_ASSIGN_OR_RETURN(int64_t recvDepth, f.integerOr("recv_depth", 0, 1 << 20, 0));
  m.recvDepth = static_cast<uint32_t>(recvDepth);
  FERRY_ASSIGN_OR_RETURN(const json::Array* pathArray, f.exactArray("qp_paths", m.numQp));
  for (size_t i = 0; i < pathArray->size(); ++i) {
    const json::Value& entry = (*pathArray)[i];
    std::string at = "qp_paths[" + std::to_string(i) + "]";
    if (!entry.isObject()) return f.refuse(at + " is not an object");
    auto path = v::Path::fromJson(json::serialize(entry));
    if (!path.isOk()) return f.refuse(at + ": " + path.status().message());
    if (path->sqpn == 0) return f.refuse(at + " has no queue pair number");
    if (path->sgid.isZero()) return f.refuse(at + " has no GID");
    m.paths.push_back(*path);
  }
  // An endpoint's metadata lists its regions, maybe none: the member itself is required.
  FERRY_ASSIGN_OR_RETURN(const json::Value* mrs, f.object("mr_info"));
  for (const auto& [name, entry] : *mrs->object()) {
    if (name.empty()) return f.refuse("mr_info", "has a region without a name");
    FERRY_ASSIGN_OR_RETURN(RegionMetadata r, decodeRegion(name, entry, where + ": mr_info['" + name + "']"));
    m.regions.push_back(std::move(r));
  }
  return m;
}

}  // namespace ferry::endpoint
