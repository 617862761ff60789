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

// Nanoseconds of CLOCK_REALTIME now.
uint64_t realtimeNs();

}  // namespace ferry::objects
