// Wireup message codec (wireup.h).
#include "agent/wireup.h"

#include <cstring>

#include "agent/crypto.h"

namespace ferry::agent {
namespace {

constexpr std::string_view kMacPrefix = ",\"mac\":\"";
constexpr size_t kMacHexBytes = 64;

Status malformedWireup(const std::string& what) {
  return Status(StatusCode::kProtocolError, "wireup message: " + what);
}

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

// Field readers: a missing field or one of another kind is malformed.
Result<std::string> textField(const json::Value& m, const char* key, size_t maxLength) {
  const json::Value* v = m.find(key);
  if (v == nullptr) return malformedWireup(std::string("no \"") + key + "\"");
  auto s = v->getString();
  if (!s.isOk()) return malformedWireup(std::string("\"") + key + "\" is not a string");
  if (s->size() > maxLength) return malformedWireup(std::string("\"") + key + "\" is too long");
  return std::string(*s);
}

Result<uint64_t> number(const json::Value& m, const char* key, uint64_t hi) {
  const json::Value* v = m.find(key);
  if (v == nullptr) return malformedWireup(std::string("no \"") + key + "\"");
  auto i = v->getInt();
  if (!i.isOk() || *i < 0 || static_cast<uint64_t>(*i) > hi) {
    return malformedWireup(std::string("\"") + key + "\" is not an integer in [0, " + std::to_string(hi) +
                           "]");
  }
  return static_cast<uint64_t>(*i);
}

Result<Uuid> uuidField(const json::Value& m, const char* key) {
  FERRY_ASSIGN_OR_RETURN(std::string t, textField(m, key, 32));
  std::string raw;
  if (t.size() != 32 || !unhex(t, &raw)) return malformedWireup(std::string("\"") + key + "\" is not a uuid");
  Uuid u;
  std::memcpy(u.data(), raw.data(), 16);
  return u;
}

Result<std::string> nonceField(const json::Value& m, const char* key) {
  FERRY_ASSIGN_OR_RETURN(std::string t, textField(m, key, 32));
  std::string raw;
  if (t.size() != 32 || !unhex(t, &raw))
    return malformedWireup(std::string("\"") + key + "\" is not a nonce");
  return t;
}

// A REQUEST's or REPLY's endpoint metadata: 1 to 8 devices, each an object.
Status readEndpoints(const json::Value& v, WireupMessage& m) {
  const json::Value* e = v.find("endpoints");
  if (e == nullptr || !e->isObject()) return malformedWireup("\"endpoints\" is missing or not an object");
  if (e->object()->empty() || e->object()->size() > 8)
    return malformedWireup("\"endpoints\" has no entry or more than 8");
  for (const auto& [device, info] : *e->object()) {
    if (device.empty() || device.size() > 255 || !info.isObject()) {
      return malformedWireup("\"endpoints\" has an entry that is not a device's metadata object");
    }
  }
  m.endpoints = *e;
  return Status::ok();
}

Status readAddress(const json::Value& v, WireupMessage& m) {
  FERRY_ASSIGN_OR_RETURN(std::string a, textField(v, "address", kMaxAddressBytes * 2));
  if (!unhex(a, &m.fromAddress)) return malformedWireup("\"address\" is not hex");
  return Status::ok();
}

// The fields of the wireup's own messages (request, challenge, reply, ack, reject); false when
// m.type is another.
Result<bool> readHandshakeFields(const json::Value& v, WireupMessage& m) {
  switch (m.type) {
    case WireupType::kRequest: {
      FERRY_ASSIGN_OR_RETURN(m.conn, number(v, "conn", uint64_t{1} << 62));
      FERRY_RETURN_IF_ERROR(readAddress(v, m));
      FERRY_ASSIGN_OR_RETURN(uint64_t numQp, number(v, "num_qp", 64));
      if (numQp < 1) return malformedWireup("\"num_qp\" is 0");
      m.numQp = static_cast<uint32_t>(numQp);
      FERRY_ASSIGN_OR_RETURN(m.lanes, textField(v, "lanes", 256));
      FERRY_RETURN_IF_ERROR(readEndpoints(v, m));
      FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(v, "nonce"));
      FERRY_ASSIGN_OR_RETURN(uint64_t t, number(v, "time", uint64_t{1} << 40));
      m.time = static_cast<int64_t>(t);
      if (v.find("cookie") != nullptr) {
        FERRY_ASSIGN_OR_RETURN(m.cookie, nonceField(v, "cookie"));
      }
      return true;
    }
    case WireupType::kChallenge: {
      FERRY_ASSIGN_OR_RETURN(m.conn, number(v, "conn", uint64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.cookie, nonceField(v, "cookie"));
      return true;
    }
    case WireupType::kReply: {
      FERRY_ASSIGN_OR_RETURN(m.conn, number(v, "conn", uint64_t{1} << 62));
      FERRY_RETURN_IF_ERROR(readAddress(v, m));
      FERRY_RETURN_IF_ERROR(readEndpoints(v, m));
      FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(v, "nonce"));
      FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(v, "echo"));
      FERRY_ASSIGN_OR_RETURN(m.abandoned, number(v, "abandoned", uint64_t{1} << 62));
      return true;
    }
    case WireupType::kAck: {
      FERRY_ASSIGN_OR_RETURN(m.conn, number(v, "conn", uint64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(v, "echo"));
      return true;
    }
    case WireupType::kReject: {
      FERRY_ASSIGN_OR_RETURN(m.conn, number(v, "conn", uint64_t{1} << 62));
      FERRY_ASSIGN_OR_RETURN(m.reason, textField(v, "reason", 1024));
      return true;
    }
    default: return false;
  }
}

// The fields of the messages of a connection (liveness, region queries, goodbye, upper layers').
Status readConnectionFields(const json::Value& v, WireupMessage& m) {
  switch (m.type) {
    case WireupType::kMrQuery: {
      FERRY_ASSIGN_OR_RETURN(m.name, textField(v, "name", 1024));
      FERRY_ASSIGN_OR_RETURN(m.query, number(v, "query", uint64_t{1} << 62));
      break;
    }
    case WireupType::kMrInfo: {
      FERRY_ASSIGN_OR_RETURN(m.name, textField(v, "name", 1024));
      FERRY_ASSIGN_OR_RETURN(m.query, number(v, "query", uint64_t{1} << 62));
      if (v.find("info") != nullptr) {
        FERRY_ASSIGN_OR_RETURN(std::string info, textField(v, "info", 1u << 20));
        m.info = std::move(info);
      }
      break;
    }
    case WireupType::kBye: {
      FERRY_ASSIGN_OR_RETURN(m.reason, textField(v, "reason", 1024));
      break;
    }
    case WireupType::kMessage: {
      FERRY_ASSIGN_OR_RETURN(m.channel, textField(v, "channel", kMaxChannel));
      if (m.channel.empty()) return malformedWireup("\"channel\" is empty");
      FERRY_ASSIGN_OR_RETURN(m.body, textField(v, "body", kMaxWireupLine));
      break;
    }
    case WireupType::kPing: {
      // A liveness probe of a link carries a nonce that the pong echoes (docs/security.md).
      if (v.find("nonce") != nullptr) {
        FERRY_ASSIGN_OR_RETURN(m.nonce, nonceField(v, "nonce"));
      }
      break;
    }
    case WireupType::kPong: {
      if (v.find("echo") != nullptr) {
        FERRY_ASSIGN_OR_RETURN(m.echo, nonceField(v, "echo"));
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
  if (line.size() > kMaxWireupLine)
    return malformedWireup("longer than " + std::to_string(kMaxWireupLine) + " bytes");
  FERRY_RETURN_IF_ERROR(checkMac(line, secret));
  auto parsed = json::parse(line);
  if (!parsed.isOk()) return malformedWireup(parsed.status().message());
  const json::Value& v = *parsed;
  if (!v.isObject()) return malformedWireup("not a JSON object");
  FERRY_ASSIGN_OR_RETURN(uint64_t version, number(v, "ferry_agent", 1u << 20));
  if (version < 1) return malformedWireup("version 0");
  FERRY_ASSIGN_OR_RETURN(std::string type, textField(v, "type", 16));
  WireupMessage m;
  bool known = false;
  for (const auto& e : kTypes) {
    if (type == e.name) {
      m.type = e.type;
      known = true;
    }
  }
  if (!known) return malformedWireup("unknown type '" + type + "'");
  FERRY_ASSIGN_OR_RETURN(m.from, uuidField(v, "from"));
  FERRY_ASSIGN_OR_RETURN(m.to, uuidField(v, "to"));
  FERRY_ASSIGN_OR_RETURN(bool handshake, readHandshakeFields(v, m));
  if (!handshake) {
    FERRY_RETURN_IF_ERROR(readConnectionFields(v, m));
  }
  return m;
}

}  // namespace ferry::agent
