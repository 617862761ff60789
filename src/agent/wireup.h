// The wireup messages of the agent (docs/agent.md has each field): one JSON object per line on the
// auxiliary TCP channel, {"ferry_agent": 1, "type": ..., "from": <uuid>, "to": <uuid>, ...}.
//
// With a shared secret the sender appends "mac" as the last member: HMAC-SHA256 over the exact
// text of the line without it. decodeWireup() checks it before it reads anything else, so an
// unauthenticated line is refused whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/json.h"
#include "ferry/agent/address.h"
#include "ferry/common/status.h"

namespace ferry::agent {

inline constexpr int kWireupVersion = 1;
// Longest line accepted (a REQUEST with 64 queue pairs' paths on three devices and many regions).
inline constexpr size_t kMaxWireupLine = size_t{4} << 20;

enum class WireupType : uint8_t {
  kRequest,
  kReply,
  kAck,
  kReject,
  kPing,
  kPong,
  kMrQuery,
  kMrInfo,
  kBye,
  kMessage,
  kChallenge
};
// Longest channel name of a message (an upper layer's name for its messages).
inline constexpr size_t kMaxChannel = 64;
const char* wireupTypeName(WireupType t);

struct WireupMessage {
  WireupType type = WireupType::kPing;
  Uuid from{};
  Uuid to{};                // zero: "whoever listens" (a REQUEST to an address not yet known)
  uint64_t conn = 0;        // request / reply / ack / reject: the initiator's connection number
  std::string fromAddress;  // request, reply: the sender's WorkerAddress bytes
  uint32_t numQp = 1;       // request
  std::string lanes;        // request: "messages=KIND,rma=KIND,atomics=KIND" as the initiator chose
  json::Value endpoints;    // request, reply: {"<device>": <endpoint metadata>, ...}
  std::string nonce;        // request, reply, and a ping that probes a link: 32 hex digits
  std::string echo;         // reply, ack, and the pong of a probe: the nonce being answered
  int64_t time = 0;         // request: the sender's clock (seconds since the epoch)
  // challenge: the responder's cookie for this REQUEST; request: the cookie it echoes (optional).
  std::string cookie;
  uint64_t abandoned = 0;           // reply: the responder's own connection number it gave up (0: none)
  std::string name;                 // mr_query, mr_info: the region
  uint64_t query = 0;               // mr_query, mr_info: matches an answer to its question
  std::optional<std::string> info;  // mr_info: the region's mr_info JSON per device, or absent
  std::string reason;               // reject, bye
  std::string channel;              // message: the upper layer it is for
  std::string body;                 // message: that layer's text
};

// A message of `type` from one agent to another (the other fields empty).
inline WireupMessage wireupHeader(WireupType type, const Uuid& from, const Uuid& to, uint64_t conn = 0) {
  WireupMessage m;
  m.type = type;
  m.from = from;
  m.to = to;
  m.conn = conn;
  return m;
}

// One line (no newline) with the MAC when secret is not empty.
std::string encodeWireup(const WireupMessage& message, const std::string& secret);
// Parses and checks one line. kPermissionDenied for a missing or wrong MAC when a secret is set (and
// for a MAC when none is set); kProtocolError for anything malformed.
Result<WireupMessage> decodeWireup(std::string_view line, const std::string& secret);

// 32 random hex digits.
std::string newNonce();

}  // namespace ferry::agent
