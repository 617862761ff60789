// The endpoint metadata codec: what endpointInfo() writes and connect() reads (endpoint.h has the
// format: {"ferry_endpoint": 1, "device", "ib_port", "link_type", "num_qp", "recv_buffer_size",
// "recv_depth", "qp_paths": [Path, ...], "mr_info": {name: {"addr", "length", "rkey"[, "handle",
// "writable"]}}}). The decoder reads a peer's input: it checks everything (version, kinds, ranges,
// one path per queue pair with a QP number and a GID, region ranges that do not wrap) and is fuzzed
// (tests/fuzz/json_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"
#include "ferry/verbs/path.h"

namespace ferry::endpoint {

inline constexpr int kMetadataVersion = 1;

// One entry of "mr_info", checked.
struct RegionMetadata {
  std::string name;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  std::optional<MrHandle> handle;
  bool writable = true;
};

struct EndpointMetadata {
  std::string device;
  int ibPort = 1;
  std::string linkType;
  uint32_t numQp = 1;
  uint32_t recvBufferSize = 0;
  uint32_t recvDepth = 0;
  std::vector<verbs::Path> paths;       // one per queue pair
  std::vector<RegionMetadata> regions;  // in document order
};

// m as a JSON object; "mr_info" is `mrInfo` (the pool's JSON object text) as it is.
json::Value metadataValue(const EndpointMetadata& m, std::string_view mrInfo);
// The same as JSON text.
std::string encodeMetadata(const EndpointMetadata& m, std::string_view mrInfo);
// A peer's metadata. kInvalidArgument naming the field for anything malformed (the message starts
// with `where`).
Result<EndpointMetadata> decodeMetadataValue(const json::Value& info, const std::string& where);
// The same from JSON text.
Result<EndpointMetadata> decodeMetadata(std::string_view text, const std::string& where);

class Endpoint;
// For a layer that carries endpoint metadata inside JSON of its own (the agent's wireup): an
// endpoint's endpointInfo() as a value, and connect() from a value, so that the metadata is
// neither printed nor parsed again on its way.
json::Value endpointInfoValue(const Endpoint& endpoint);
Status connectFromValue(Endpoint& endpoint, const json::Value& peerInfo);
// One "mr_info" entry (a parsed JSON value). kInvalidArgument naming `where`.
Result<RegionMetadata> decodeRegion(std::string name, const json::Value& entry, const std::string& where);

}  // namespace ferry::endpoint
