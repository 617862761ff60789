// Connector metadata and message codecs (protocol.h).
#include "connect/protocol.h"

#include "agent/crypto.h"
#include "common/json.h"
#include "common/json_fields.h"

namespace ferry::connect {
namespace {

// How each decoder words a refusal: metadata from a user is an invalid argument, a message from the
// peer a protocol error.
json::FieldErrors metadataErrors() {
  return {.code = StatusCode::kInvalidArgument, .prefix = "RdmaMetadata: "};
}
json::FieldErrors messageErrors() {
  return {.code = StatusCode::kProtocolError, .prefix = "connector message: "};
}

bool isHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// 2^53 - 1: every integer stays exact for JSON readers that use doubles (JavaScript, pydantic's
// float fallbacks); operation ids are drawn below it.
constexpr int64_t kMaxExact = (int64_t{1} << 53) - 1;

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

Result<Metadata> metadataFrom(const json::Value& v, const json::FieldErrors& errors) {
  json::Fields f(v, errors);
  FERRY_RETURN_IF_ERROR(f.only(
      {"version", "kind", "worker", "address", "operation", "nonce", "expires", "descriptors", "tag"}));
  Metadata m;
  FERRY_ASSIGN_OR_RETURN(int64_t version, f.integer("version", 1, 1 << 20));
  if (version != kMetadataVersion) {
    return f.refuse("version " + std::to_string(version) + " (this ferry reads version " +
                    std::to_string(kMetadataVersion) + ")");
  }
  m.version = static_cast<int>(version);
  FERRY_ASSIGN_OR_RETURN(int64_t kind, f.integer("kind", 1, 2));
  m.kind = static_cast<OperationKind>(kind);
  FERRY_ASSIGN_OR_RETURN(m.worker, f.text("worker", 512));
  FERRY_ASSIGN_OR_RETURN(std::string address, f.text("address", 16384));
  if (address.empty() || !agent::unhexInto(address, &m.address)) return f.refuse("address", "is not hex");
  FERRY_ASSIGN_OR_RETURN(int64_t operation, f.integer("operation", 1, kMaxExact));
  m.operation = static_cast<uint64_t>(operation);
  FERRY_ASSIGN_OR_RETURN(m.nonce, f.text("nonce", 32));
  if (m.nonce.size() != 32 || !isHex(m.nonce)) return f.refuse("nonce", "is not 32 hex digits");
  FERRY_ASSIGN_OR_RETURN(m.expires, f.integer("expires", 0, kMaxExact));
  FERRY_ASSIGN_OR_RETURN(const json::Array* ds, f.array("descriptors", kMaxDescriptors));
  if (ds->empty()) return f.refuse("descriptors", "is empty");
  m.descriptors.reserve(ds->size());
  for (const auto& e : *ds) {
    if (!e.isObject()) return f.refuse("a descriptor is not an object");
    json::Fields d(e, errors);
    FERRY_RETURN_IF_ERROR(d.only({"size", "device"}));
    DescriptorInfo info;
    FERRY_ASSIGN_OR_RETURN(int64_t size, d.integer("size", 1, kMaxExact));
    info.size = static_cast<uint64_t>(size);
    FERRY_ASSIGN_OR_RETURN(info.device, d.text("device", 64));
    m.descriptors.push_back(std::move(info));
  }
  FERRY_ASSIGN_OR_RETURN(m.tag, f.text("tag", 64));
  if (m.tag.size() != 64 || !isHex(m.tag)) return f.refuse("tag", "is not 64 hex digits");
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
    return metadataErrors().refuse("longer than " + std::to_string(kMaxMetadataText) + " bytes");
  }
  auto parsed = json::parse(text);
  if (!parsed.isOk()) return metadataErrors().refuse("not JSON (" + parsed.status().message() + ")");
  return metadataFrom(*parsed, metadataErrors());
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
  if (!parsed.isOk()) return messageErrors().refuse("not JSON (" + parsed.status().message() + ")");
  const json::Value& v = *parsed;
  json::Fields f(v, messageErrors());
  if (!v.isObject()) return f.refuse("not a JSON object");
  FERRY_ASSIGN_OR_RETURN(std::string type, f.text("t", 16));
  Message m;
  bool known = false;
  for (const auto& t : kTypes) {
    if (type == t.name) {
      m.type = t.type;
      known = true;
    }
  }
  if (!known) return f.refuse("unknown type '" + type + "'");
  FERRY_ASSIGN_OR_RETURN(int64_t id, f.integer("id", 1, INT64_MAX));
  m.id = static_cast<uint64_t>(id);
  switch (m.type) {
    case MessageType::kBegin: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "metadata", "buffers"}));
      FERRY_ASSIGN_OR_RETURN(const json::Value* meta, f.object("metadata"));
      FERRY_ASSIGN_OR_RETURN(m.metadata, metadataFrom(*meta, messageErrors()));
      FERRY_ASSIGN_OR_RETURN(const json::Array* bs, f.array("buffers", kMaxDescriptors));
      for (const auto& e : *bs) {
        if (!e.isObject()) return f.refuse("a buffer is not an object");
        json::Fields b(e, messageErrors());
        FERRY_RETURN_IF_ERROR(b.only({"addr", "length", "rkey"}));
        BufferInfo info;
        FERRY_ASSIGN_OR_RETURN(int64_t addr, b.integer("addr", 0, INT64_MAX));
        FERRY_ASSIGN_OR_RETURN(int64_t length, b.integer("length", 1, INT64_MAX));
        info.addr = static_cast<uint64_t>(addr);
        info.length = static_cast<uint64_t>(length);
        if (info.addr > UINT64_MAX - info.length) return f.refuse("a buffer's range overflows");
        FERRY_ASSIGN_OR_RETURN(int64_t rkey, b.integer("rkey", 0, UINT32_MAX));
        info.rkey = static_cast<uint32_t>(rkey);
        m.buffers.push_back(info);
      }
      if (m.buffers.size() != m.metadata.descriptors.size()) {
        return f.refuse("BEGIN has " + std::to_string(m.buffers.size()) + " buffers for " +
                        std::to_string(m.metadata.descriptors.size()) + " descriptors");
      }
      break;
    }
    case MessageType::kStarted: FERRY_RETURN_IF_ERROR(f.only({"t", "id"})); break;
    case MessageType::kDone: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "code", "reason"}));
      FERRY_ASSIGN_OR_RETURN(int64_t code, f.integer("code", 0, static_cast<int64_t>(StatusCode::kPeerGone)));
      m.code = static_cast<StatusCode>(code);
      FERRY_ASSIGN_OR_RETURN(m.reason, f.text("reason", 4096));
      break;
    }
    case MessageType::kCancel: {
      FERRY_RETURN_IF_ERROR(f.only({"t", "id", "operation"}));
      FERRY_ASSIGN_OR_RETURN(int64_t operation, f.integer("operation", 1, kMaxExact));
      m.operation = static_cast<uint64_t>(operation);
      break;
    }
  }
  return m;
}

}  // namespace ferry::connect
