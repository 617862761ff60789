// The object client's descriptor (cuobj_client.h): the text a client hands to an object server so
// that the server can move one range of the client's memory in one direction.
//
//   "ferry-obj1:" base64( "FOBJ" | version 1 | op | 0 | 0 | expires_ns u64 | addr u64 | length u64
//                         | n_keys u8 | n_keys * (name_len u8 | device name | rkey u32)
//                         | address_len u16 | the client agent's address )
// little-endian. The keys are those of a registration of exactly [addr, +length), made for this
// descriptor with only the access its op needs (GET: remote write; PUT: remote read), one per
// device of the client. decodeDescriptor() is strict: it reads what any peer may send (fuzzed in
// tests/fuzz/objects_fuzz.cc).
//
// The grant: before it moves a byte for a descriptor, the server asks the client agent the
// descriptor names, over the agent link the wireup authenticated (channel kGrantChannel), whether
// it minted exactly that text, and claims it for one request:
//
//   claim   "ferry-claim1:" base64( "FCLM" | version 1 | id u64 | SHA-256 of the descriptor text )
//   answer  "ferry-grant1:" base64( "FGRT" | version 1 | id u64 | granted u8
//                                   | granted 1: the descriptor's record (as above, from "FOBJ")
//                                   | granted 0: reason_len u16 | reason )
//
// The id pairs an answer with its claim. A client grants a descriptor it minted, not expired, not
// revoked and not claimed before, and marks it claimed; the answer carries the client's own copy of
// the descriptor, whose keys are the ones the server uses. Both decoders are strict (fuzzed in
// tests/fuzz/objects_grant_fuzz.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::objects {

inline constexpr std::string_view kDescriptorPrefix = "ferry-obj1:";
inline constexpr size_t kMaxDescriptorText = 16384;
inline constexpr size_t kMaxDescriptorKeys = 16;
inline constexpr size_t kMaxDeviceName = 64;
inline constexpr size_t kMaxAgentAddress = 8192;
inline constexpr std::string_view kGrantChannel = "ferry.objects.grant";
inline constexpr std::string_view kClaimPrefix = "ferry-claim1:";
inline constexpr std::string_view kGrantPrefix = "ferry-grant1:";
inline constexpr size_t kDescriptorDigestSize = 32;  // SHA-256
inline constexpr size_t kMaxGrantReason = 512;

struct Descriptor {
  uint8_t op = 0;          // cuObjOpType_t: 0 GET, 1 PUT
  uint64_t expiresNs = 0;  // CLOCK_REALTIME nanoseconds
  uint64_t addr = 0;       // the client's address of the range's first byte
  uint64_t length = 0;
  std::vector<std::pair<std::string, uint32_t>> keys;  // device name, rkey
  std::string agentAddress;                            // agent::WorkerAddress::encode()
  bool operator==(const Descriptor&) const = default;
};

std::string encodeDescriptor(const Descriptor& d);
// kInvalidArgument naming what is wrong: the prefix, base64, the magic or version, an op that is
// not GET or PUT, an empty or wrapping range, no keys or too many, a device name empty or too long,
// an agent address that does not decode, bytes left over.
Result<Descriptor> decodeDescriptor(std::string_view text);

// The SHA-256 of a descriptor's text (kDescriptorDigestSize bytes): how a claim names it.
std::string descriptorDigest(std::string_view text);

// The server's question: "did you mint the descriptor of this digest? I use it now".
struct GrantClaim {
  uint64_t id = 0;
  std::string digest;  // descriptorDigest() of the text
  bool operator==(const GrantClaim&) const = default;
};

// The client's answer: granted, with its own copy of the descriptor, or refused with why.
struct GrantAnswer {
  uint64_t id = 0;
  bool granted = false;
  Descriptor descriptor;  // granted only
  std::string reason;     // refused only: at most kMaxGrantReason bytes
  bool operator==(const GrantAnswer&) const = default;
};

std::string encodeClaim(const GrantClaim& c);
// kInvalidArgument: the prefix, base64, magic or version, a digest that is not 32 bytes, bytes
// left over.
Result<GrantClaim> decodeClaim(std::string_view text);
std::string encodeAnswer(const GrantAnswer& a);
// kInvalidArgument: the prefix, base64, magic or version, a flag other than 0 or 1, a granted
// answer whose descriptor record does not decode (decodeDescriptor's rules), a refused one with
// an over-long reason, bytes left over.
Result<GrantAnswer> decodeAnswer(std::string_view text);

// Nanoseconds of CLOCK_REALTIME now.
uint64_t realtimeNs();

}  // namespace ferry::objects
