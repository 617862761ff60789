// Lanes: which device carries each class of operation to a peer.
//
// Three operation classes (as UCP has them): messages (SEND/RECV and WRITE_WITH_IMM, whose
// immediate travels with its data), remote memory access (READ/WRITE) and atomics. For each, one
// deterministic function of both workers' addresses picks the lane, so both sides compute the same
// choice without asking each other:
//   1. "same_host": both addresses carry the same host identity (same kernel, same network
//      namespace) and both have a loopback software device: the soft provider's same-host path
//      (shared-memory rings, one-copy WRITE/READ).
//   2. "rdma": an RDMA port on each side with the same link layer and the same GID subnet prefix
//      (the same fabric).
//   3. "tcp": a software device on each side, preferring two in the same IPv4 subnet.
// Candidates are tried in the order of the side with the smaller uuid, so the result does not
// depend on which side computes it. A configured kind per class (LaneOverrides, or
// FERRY_AGENT_LANES="rma=tcp,messages=same_host") is tried first and refused when impossible.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "ferry/agent/address.h"
#include "ferry/common/status.h"

namespace ferry::agent {

enum class OpClass : uint8_t { kMessages = 0, kRma = 1, kAtomics = 2 };
inline constexpr int kNumOpClasses = 3;
// "messages", "rma", "atomics".
const char* opClassName(OpClass c);

enum class LaneKind : uint8_t { kSameHost, kRdma, kTcp };
// "same_host", "rdma", "tcp".
const char* laneKindName(LaneKind k);
Result<LaneKind> parseLaneKind(std::string_view text);

struct Lane {
  LaneKind kind = LaneKind::kTcp;
  std::string localDevice;   // a device of this side
  std::string remoteDevice;  // the peer's device
  std::string why;           // why this lane was chosen, for agent.lanes() and `ferry info`
  // "same_host", "tcp" or "rdma:<local device>".
  std::string label() const;
  bool operator==(const Lane&) const = default;
};

struct LaneSet {
  Lane lanes[kNumOpClasses];
  const Lane& of(OpClass c) const { return lanes[static_cast<int>(c)]; }
};

// Kinds to use per class (absent: the rules above).
using LaneOverrides = std::map<OpClass, LaneKind>;
// "rma=tcp,messages=same_host" (classes: messages, rma, atomics; kinds: same_host, rdma, tcp).
Result<LaneOverrides> parseLaneOverrides(std::string_view text);

// The lanes between `local` (this side) and `remote`. kUnavailable when no device pair can reach
// the peer (naming both sides' devices), kInvalidArgument when an override cannot be honoured.
Result<LaneSet> selectLanes(const WorkerAddress& local, const WorkerAddress& remote,
                            const LaneOverrides& overrides = {});

}  // namespace ferry::agent
