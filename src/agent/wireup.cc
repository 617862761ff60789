// Wireup message codec (wireup.h).
#include "agent/wireup.h"

#include <cstring>

#include "agent/crypto.h"
#include "common/json_fields.h"

namespace ferry::agent {
namespace {

constexpr std::string_view kMacPrefix = ",\"mac\":\"";
constexpr size_t kMacHexBytes = 64;

std::string hex(std::string_view bytes) { return hexOf(bytes); }
bool unhex(std::string_view text, std::string* out) { return unhexInto(text, out); }
std::string macOf(const std::string& secret, std::string_view text) { return hmacSha256Hex(secret, text); }

struct WireupTypeName {
  WireupType type;
  const char* name;
};
constexpr WireupTypeName kTypes[] = {
    {WireupType::kRequest, "request"},  {WireupType::kReply, "reply"},         {WireupType::kAck, "ack"},
    {WireupType::kReject, "reject"},    {WireupType::kPing, "ping"},           {WireupType::kPong, "pong"},
    {WireupType::kMrQuery, "mr_query"}, {WireupType::kMrInfo, "mr_info"},      {WireupType::kBye, "bye"},
    {WireupType::kMessage, "message"},  {WireupType::kChallenge, "challenge"},
};

json::FieldErrors wireupErrors() {
  return {.code = StatusCode::kProtocolError, .prefix = "wireup message: "};
}

Result<Uuid> uuidField(const json::Fields& f, const char* key) {
  FERRY_ASSIGN_OR_RETURN(std::string t, f.text(key, 32));
  std::string raw;
  if (t.size() != 32 || !unhex(t, &raw)) return f.refuse(key, "is not a uuid");
  Uuid u;
  std::memcpy(u.data(), raw.data(), 16);
  return u;
}

Result<std::string> nonceField(const json::Fields& f, const char* key) {
  FERRY_ASSIGN_OR_RETURN(std::string t, f.text(key, 32));
  std::string raw;
  if (t.size() != 32 || !unhex(t, &raw)) return f.refuse(key, "is not a nonce");
  return t;
}

// A REQUEST's or REPLY's endpoint metadata: 1 to 8 devices, each an object.
Status readEndpoints(const json::Fields& f, WireupMessage& m) {
  FERRY_ASSIGN_OR_RETURN(const json::Value* e, f.object("endpoints"));
  if (e->object()->empty() || e->object()->size() > 8)
    return f.refuse("endpoints", "has no entry or more than 8");
  for (const auto& [device, info] : *e->object()) {
    if (device.empty() || device.size() > 255 || !info.isObject()) {
      return f.refuse("endpoints", "has an entry that is not a device's metadata object");
    }
  }
  m.endpoints = *e;
  return Status::ok();
}

Status readAddress(const json::Fields& f, WireupMessage& m) {
  FERRY_ASSIGN_OR_RETURN(std::string a, f.text("address", kMaxAddressBytes * 2));
  if (!unhex(a, &m.fromAddress)) return f.refuse("address", "is not hex");
  return Status::ok();
}

// The fields of the wireup's own messages (request, challenge, reply, ack, reject); false when
// m.type is another.
Result<bool> readHandshakeFields(const json::Fields& f, WireupMessage& m) {
  switch (m.type) {
    case WireupType::kRequest: {
      FERRY_ASSIGN_OR_RETURN(m.conn, f.integer("conn", 0, int64_t{1} << 62));
      FERRY_RETURN_IF_ERROR(readAddress(f, m));
      FERRY_ASSIGN_OR_RETURN(uint64_t numQp, f.integer("num_qp", 0, 64));
      if (numQp < 1) return f.refuse("num_qp", "is 0");
      m.numQp = static_cast<uint32_t>(numQp);
      FERRY_ASSIGN_OR_RETURN(m.lanes, f.text("lanes", 256));
      FERRY_RETURN_IF_ERROR(readEndpoints(f, m));
      FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(f, "nonce"));
      FERRY_ASSIGN_OR_RETURN(uint64_t t, f.integer("time", 0, int64_t{1} << 40));
      m.time = static_cast<int64_t>(t);
      if (f.has("cookie")) {
        FERRY_ASSIGN_OR_RETURN(m.cookie, nonceField(f, "cookie"));
      }
      return true;
    }
    case WireupType::kChallenge: {
      FERRY_ASSIGN_OR_RETURN(m.conn, f.integer("conn", 0, int64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.cookie, nonceField(f, "cookie"));
      return true;
    }
    case WireupType::kReply: {
      FERRY_ASSIGN_OR_RETURN(m.conn, f.integer("conn", 0, int64_t{1} << 62));
      FERRY_RETURN_IF_ERROR(readAddress(f, m));
      FERRY_RETURN_IF_ERROR(readEndpoints(f, m));
      FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(f, "nonce"));
      FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(f, "echo"));
      FERRY_ASSIGN_OR_RETURN(m.abandoned, f.integer("abandoned", 0, int64_t{1} << 62));
      return true;
    }
    case WireupType::kAck: {
      FERRY_ASSIGN_OR_RETURN(m.conn, f.integer("conn", 0, int64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(f, "echo"));
      return true;
    }
    case WireupType::kReject: {
      FERRY_ASSIGN_OR_RETURN(m.conn, f.integer("conn", 0, int64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.reason, f.text("reason", 1024));
      return true;
    }
    default: return false;
  }
}

// The fields of the messages of a connection (liveness, region queries, goodbye, upper layers').
Status readConnectionFields(const json::Fields& f, WireupMessage& m) {
  switch (m.type) {
    case WireupType::kMrQuery: {
      FERRY_ASSIGN_OR_RETURN(m.name, f.text("name", 1024));
      FERRY_ASSIGN_OR_RETURN(m.query, f.integer("query", 0, int64_t{1} << 62));
      break;
    }
    case WireupType::kMrInfo: {
      FERRY_ASSIGN_OR_RETURN(m.name, f.text("name", 1024));
      FERRY_ASSIGN_OR_RETURN(m.query, f.integer("query", 0, int64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.info, f.optionalText("info", 1u << 20));
      break;
    }
    case WireupType::kBye: {
      FERRY_ASSIGN_OR_RETURN(m.reason, f.text("reason", 1024));
      break;
    }
    case WireupType::kMessage: {
      FERRY_ASSIGN_OR_RETURN(m.channel, f.text("channel", kMaxChannel));
      if (m.channel.empty()) return f.refuse("channel", "is empty");
      FERRY_ASSIGN_OR_RETURN(m.body, f.text("body", kMaxWireupLine));
      break;
    }
    case WireupType::kPing: {
      // A liveness probe of a link carries a nonce that the pong echoes (docs/security.md).
      if (f.has("nonce")) {
        FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(f, "nonce"));
      }
      break;
    }
    case WireupType::kPong: {
      if (f.has("echo")) {
        FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(f, "echo"));
      }
      break;
    }
    default: break;
  }
  return Status::ok();
}

// With a secret the line must end in its MAC, over the text without it; without one it must have none.
Status checkMac(std::string_view line, const std::string& secret) {
  const size_t macTail = kMacPrefix.size() + kMacHexBytes + 2;
  bool hasMac = line.size() > macTail &&
                line.substr(line.size() - macTail, kMacPrefix.size()) == kMacPrefix &&
                line.substr(line.size() - 2) == "\"}";
  if (!secret.empty()) {
    if (!hasMac)
      return Status(StatusCode::kPermissionDenied, "wireup message without the shared secret's MAC");
    std::string_view mac = line.substr(line.size() - macTail + kMacPrefix.size(), kMacHexBytes);
    std::string unsignedText = std::string(line.substr(0, line.size() - macTail)) + "}";
    if (!constantTimeEqual(mac, macOf(secret, unsignedText))) {
      return Status(StatusCode::kPermissionDenied, "wireup message with a wrong MAC (another shared secret)");
    }
  } else if (hasMac) {
    return Status(StatusCode::kPermissionDenied,
                  "wireup message with a MAC, but this agent has no shared secret");
  }
  return Status::ok();
}

}  // namespace

const char* wireupTypeName(WireupType t) {
  for (const auto& e : kTypes) {
    if (e.type == t) return e.name;
  }
  return "?";
}

std::string newNonce() { return randomHex(16); }

namespace {

// The members of a wireup message of its type, after the four every message has.
void setTypeMembers(const WireupMessage& m, json::Value& v) {
  switch (m.type) {
    case WireupType::kRequest:
      v.set("conn", static_cast<int64_t>(m.conn));
      v.set("address", hex(m.fromAddress));
      v.set("num_qp", static_cast<int64_t>(m.numQp));
      v.set("lanes", m.lanes);
      v.set("endpoints", m.endpoints);
      v.set("nonce", m.nonce);
      v.set("time", m.time);
      if (!m.cookie.empty()) v.set("cookie", m.cookie);
      break;
    case WireupType::kChallenge:
      v.set("conn", static_cast<int64_t>(m.conn));
      v.set("cookie", m.cookie);
      break;
    case WireupType::kReply:
      v.set("conn", static_cast<int64_t>(m.conn));
      v.set("address", hex(m.fromAddress));
      v.set("endpoints", m.endpoints);
      v.set("nonce", m.nonce);
      v.set("echo", m.echo);
      v.set("abandoned", static_cast<int64_t>(m.abandoned));
      break;
    case WireupType::kAck:
      v.set("conn", static_cast<int64_t>(m.conn));
      v.set("echo", m.echo);
      break;
    case WireupType::kReject:
      v.set("conn", static_cast<int64_t>(m.conn));
      v.set("reason", m.reason);
      break;
    case WireupType::kMrQuery:
    case WireupType::kMrInfo:
      v.set("name", m.name);
      v.set("query", static_cast<int64_t>(m.query));
      if (m.type == WireupType::kMrInfo && m.info) v.set("info", *m.info);
      break;
    case WireupType::kBye: v.set("reason", m.reason); break;
    case WireupType::kMessage:
      v.set("channel", m.channel);
      v.set("body", m.body);
      break;
    case WireupType::kPing:
      if (!m.nonce.empty()) v.set("nonce", m.nonce);
      break;
    case WireupType::kPong:
      if (!m.echo.empty()) v.set("echo", m.echo);
      break;
  }
}

}  // namespace

std::string encodeWireup(const WireupMessage& m, const std::string& secret) {
  json::Value v = json::Value::emptyObject();
  v.set("ferry_agent", kWireupVersion);
  v.set("type", wireupTypeName(m.type));
  v.set("from", uuidText(m.from));
  v.set("to", uuidText(m.to));
  setTypeMembers(m, v);
  std::string line = json::serialize(v);
  if (!secret.empty()) {
    std::string mac = macOf(secret, line);
    line.pop_back();  // the closing brace: "mac" is the last member
    line += std::string(kMacPrefix) + mac + "\"}";
  }
  return line;
}

Result<WireupMessage> decodeWireup(std::string_view line, const std::string& secret) {
  if (line.size() > kMaxWireupLine) {
    return wireupErrors().refuse("longer than " + std::to_string(kMaxWireupLine) + " bytes");
  }
  FERRY_RETURN_IF_ERROR(checkMac(line, secret));
  auto parsed = json::parse(line);
  if (!parsed.isOk()) return wireupErrors().refuse(parsed.status().message());
  const json::Value& v = *parsed;
  json::Fields f(v, wireupErrors());
  if (!v.isObject()) return f.refuse("not a JSON object");
  FERRY_ASSIGN_OR_RETURN(int64_t version, f.integer("ferry_agent", 0, 1 << 20));
  if (version < 1) return f.refuse("version 0");
  FERRY_ASSIGN_OR_RETURN(std::string type, f.text("type", 16));
  WireupMessage m;
  bool known = false;
  for (const auto& e : kTypes) {
    if (type == e.name) {
      m.type = e.type;
      known = true;
    }
  }
  if (!known) return f.refuse("unknown type '" + type + "'");
  FERRY_ASSIGN_OR_RETURN(m.from, uuidField(f, "from"));
  FERRY_ASSIGN_OR_RETURN(m.to, uuidField(f, "to"));
  FERRY_ASSIGN_OR_RETURN(bool handshake, readHandshakeFields(f, m));
  if (!handshake) {
    FERRY_RETURN_IF_ERROR(readConnectionFields(f, m));
  }
  return m;
}

}  // namespace ferry::agent
