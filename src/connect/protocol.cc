// Connector metadata and message codecs (protocol.h).
#include "connect/protocol.h"

#include <set>

#include "agent/crypto.h"
#include "common/json.h"

namespace ferry::connect {
namespace {

Status badMetadata(const std::string& what) { return invalidArgument("RdmaMetadata: " + what); }
Status badMessage(const std::string& what) {
  return Status(StatusCode::kProtocolError, "connector message: " + what);
}

// Field readers over an object that must have exactly the expected members.
class Fields {
 public:
  Fields(const json::Value& v, Status (*fail)(const std::string&)) : v_(v), fail_(fail) {}

  Status only(std::initializer_list<std::string_view> allowed) const {
    for (const auto& [key, value] : *v_.object()) {
      bool ok = false;
      for (auto a : allowed) ok = ok || key == a;
      if (!ok) return fail_("unknown member \"" + key + "\"");
    }
    return Status::ok();
  }
  Result<std::string> text(const char* key, size_t maxLength) const {
    const json::Value* v = v_.find(key);
    if (v == nullptr) return fail_(std::string("no \"") + key + "\"");
    auto s = v->getString();
    if (!s.isOk()) return fail_(std::string("\"") + key + "\" is not a string");
    if (s->size() > maxLength)
      return fail_(std::string("\"") + key + "\" is longer than " + std::to_string(maxLength));
    return std::string(*s);
  }
  Result<uint64_t> number(const char* key, uint64_t lo, uint64_t hi) const {
    const json::Value* v = v_.find(key);
    if (v == nullptr) return fail_(std::string("no \"") + key + "\"");
    auto i = v->getInt();
    if (!i.isOk() || *i < 0 || static_cast<uint64_t>(*i) < lo || static_cast<uint64_t>(*i) > hi) {
      return fail_(std::string("\"") + key + "\" is not an integer in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
    }
    return static_cast<uint64_t>(*i);
  }
  Result<const json::Array*> array(const char* key, size_t maxItems) const {
    const json::Value* v = v_.find(key);
    if (v == nullptr || !v->isArray())
      return fail_(std::string("\"") + key + "\" is missing or not an array");
    if (v->array()->size() > maxItems) {
      return fail_(std::string("\"") + key + "\" has more than " + std::to_string(maxItems) + " entries");
    }
    return v->array();
  }

 private:
  const json::Value& v_;
  Status (*fail_)(const std::string&);
};

bool isHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// 2^53 - 1: every integer stays exact for JSON readers that use doubles (JavaScript, pydantic's
// float fallbacks); operation ids are drawn below it.
constexpr uint64_t kMaxExact = (uint64_t{1} << 53) - 1;

json::Value metadataValue(const Metadata& m) {
  json::Value v = json::Value::emptyObject();
  v.set("version", m.version);
  v.set("kind", static_cast<int>(m.kind));
  v.set("worker", m.worker);
  v.set("address", agent::hexOf(m.address));
  v.set("operation", static_cast<int64_t>(m.operation));
  v.set("nonce", m.nonce);
  v.set("expires", m.expires);
  json::Value ds = json::Value::emptyArray();
  for (const auto& d : m.descriptors) {
    json::Value e = json::Value::emptyObject();
    e.set("size", static_cast<int64_t>(d.size));
    e.set("device", d.device);
    ds.push(std::move(e));
  }
  v.set("descriptors", std::move(ds));
  v.set("tag", m.tag);
  return v;
}

Result<Metadata> metadataFrom(const json::Value& v, Status (*fail)(const std::string&)) {
  if (!v.isObject()) return fail("not a JSON object");
  Fields f(v, fail);
  FERRY_RETURN_IF_ERROR(f.only(
      {"version", "kind", "worker", "address", "operation", "nonce", "expires", "descriptors", "tag"}));
  Metadata m;
  FERRY_ASSIGN_OR_RETURN(uint64_t version, f.number("version", 1, 1u << 20));
  if (version != kMetadataVersion) {
    return fail("version " + std::to_string(version) + " (this ferry reads version " +
                std::to_string(kMetadataVersion) + ")");
  }
  m.version = static_cast<int>(version);
  FERRY_ASSIGN_OR_RETURN(uint64_t kind, f.number("kind", 1, 2));
  m.kind = static_cast<OperationKind>(kind);
  FERRY_ASSIGN_OR_RETURN(m.worker, f.text("worker", 512));
  FERRY_ASSIGN_OR_RETURN(std::string address, f.text("address", 16384));
  if (address.empty() || !agent::unhexInto(address, &m.address)) return fail("\"address\" is not hex");
  FERRY_ASSIGN_OR_RETURN(m.operation, f.number("operation", 1, kMaxExact));
  FERRY_ASSIGN_OR_RETURN(m.nonce, f.text("nonce", 32));
  if (m.nonce.size() != 32 || !isHex(m.nonce)) return fail("\"nonce\" is not 32 hex digits");
  FERRY_ASSIGN_OR_RETURN(uint64_t expires, f.number("expires", 0, kMaxExact));
  m.expires = static_cast<int64_t>(expires);
  FERRY_ASSIGN_OR_RETURN(const json::Array* ds, f.array("descriptors", kMaxDescriptors));
  if (ds->empty()) return fail("\"descriptors\" is empty");
  m.descriptors.reserve(ds->size());
  for (const auto& e : *ds) {
    if (!e.isObject()) return fail("a descriptor is not an object");
    Fields d(e, fail);
    FERRY_RETURN_IF_ERROR(d.only({"size", "device"}));
    DescriptorInfo info;
    FERRY_ASSIGN_OR_RETURN(info.size, d.number("size", 1, kMaxExact));
    FERRY_ASSIGN_OR_RETURN(info.device, d.text("device", 64));
    m.descriptors.push_back(std::move(info));
  }
  FERRY_ASSIGN_OR_RETURN(m.tag, f.text("tag", 64));
  if (m.tag.size() != 64 || !isHex(m.tag)) return fail("\"tag\" is not 64 hex digits");
  return m;
}

struct TypeName {
  MessageType type;
  const char* name;
};
constexpr TypeName kTypes[] = {{MessageType::kBegin, "begin"},
                               {MessageType::kStarted, "started"},
                               {MessageType::kDone, "done"},
                               {MessageType::kCancel, "cancel"}};

}  // namespace

std::string canonicalText(const Metadata& m) {
  std::string out = "ferry-connect-metadata";
  auto field = [&out](std::string_view s) {
    out += '|';
    out += std::to_string(s.size());
    out += ':';
    out.append(s);
  };
  field(std::to_string(m.version));
  field(std::to_string(static_cast<int>(m.kind)));
  field(m.worker);
  field(m.address);
  field(std::to_string(m.operation));
  field(m.nonce);
  field(std::to_string(m.expires));
  field(std::to_string(m.descriptors.size()));
  for (const auto& d : m.descriptors) {
    field(std::to_string(d.size));
    field(d.device);
  }
  return out;
}

std::string encodeMetadata(const Metadata& m) { return json::serialize(metadataValue(m)); }

Result<Metadata> decodeMetadata(std::string_view text) {
  if (text.size() > kMaxMetadataText) {
    return badMetadata("longer than " + std::to_string(kMaxMetadataText) + " bytes");
  }
  auto parsed = json::parse(text);
  if (!parsed.isOk()) return badMetadata("not JSON (" + parsed.status().message() + ")");
  return metadataFrom(*parsed, badMetadata);
}

std::string encodeMessage(const Message& m) {
  json::Value v = json::Value::emptyObject();
  for (const auto& t : kTypes) {
    if (t.type == m.type) v.set("t", t.name);
  }
  v.set("id", static_cast<int64_t>(m.id));
  switch (m.type) {
    case MessageType::kBegin: {
      v.set("metadata", metadataValue(m.metadata));
      json::Value bs = json::Value::emptyArray();
      for (const auto& b : m.buffers) {
        json::Value e = json::Value::emptyObject();
        e.set("addr", static_cast<int64_t>(b.addr));
        e.set("length", static_cast<int64_t>(b.length));
        e.set("rkey", static_cast<int64_t>(b.rkey));
        bs.push(std::move(e));
      }
      v.set("buffers", std::move(bs));
      break;
    }
    case MessageType::kDone:
      v.set("code", static_cast<int>(m.code));
      v.set("reason", m.reason);
      break;
    case MessageType::kStarted: break;
    case MessageType::kCancel: v.set("operation", static_cast<int64_t>(m.operation)); break;
  }
  return json::serialize(v);
}

Result<Message> decodeMessage(std::string_view text) {
  auto parsed = json::parse(text);
  if (!parsed.isOk()) return badMessage("not JSON (" + parsed.status().message() + ")");
  const json::Value& v = *parsed;
  if (!v.isObject()) return badMessage("not a JSON object");
  Fields f(v, badMessage);
  FERRY_ASSIGN_OR_RETURN(std::string type, f.text("t", 16));
  Message m;
  bool known = false;
  for (const auto& t : kTypes) {
    if (type == t.name) {
      m.type = t.type;
      known = true;
    }
  }
  if (!known) return badMessage("unknown type '" + type + "'");
  FERRY_ASSIGN_OR_RETURN(m.id, f.number("id", 1, INT64_MAX));
  switch (m.type) {
    case MessageType::kBegin: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "metadata", "buffers"}));
      const json::Value* meta = v.find("metadata");
      if (meta == nullptr) return badMessage("no \"metadata\"");
      auto decoded = metadataFrom(*meta, badMessage);
      if (!decoded.isOk()) return decoded.status();
      m.metadata = std::move(*decoded);
      FERRY_ASSIGN_OR_RETURN(const json::Array* bs, f.array("buffers", kMaxDescriptors));
      for (const auto& e : *bs) {
        if (!e.isObject()) return badMessage("a buffer is not an object");
        Fields b(e, badMessage);
        FERRY_RETURN_IF_ERROR(b.only({"addr", "length", "rkey"}));
        BufferInfo info;
        FERRY_ASSIGN_OR_RETURN(info.addr, b.number("addr", 0, INT64_MAX));
        FERRY_ASSIGN_OR_RETURN(info.length, b.number("length", 1, INT64_MAX));
        if (info.addr > UINT64_MAX - info.length) return badMessage("a buffer's range overflows");
        FERRY_ASSIGN_OR_RETURN(uint64_t rkey, b.number("rkey", 0, UINT32_MAX));
        info.rkey = static_cast<uint32_t>(rkey);
        m.buffers.push_back(info);
      }
      if (m.buffers.size() != m.metadata.descriptors.size()) {
        return badMessage("BEGIN has " + std::to_string(m.buffers.size()) + " buffers for " +
                          std::to_string(m.metadata.descriptors.size()) + " descriptors");
      }
      break;
    }
    case MessageType::kStarted: FERRY_RETURN_IF_ERROR(f.only({"t", "id"})); break;
    case MessageType::kDone: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "code", "reason"}));
      FERRY_ASSIGN_OR_RETURN(uint64_t code,
                             f.number("code", 0, static_cast<uint64_t>(StatusCode::kPeerGone)));
      m.code = static_cast<StatusCode>(code);
      FERRY_ASSIGN_OR_RETURN(m.reason, f.text("reason", 4096));
      break;
    }
    case MessageType::kCancel: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "operation"}));
      FERRY_ASSIGN_OR_RETURN(m.operation, f.number("operation", 1, kMaxExact));
      break;
    }
  }
  return m;
}

}  // namespace ferry::connect
