// WorkerAddress: everything a peer needs to reach an agent, as one self-contained, versioned byte
// string (Agent::address()). It lists:
//   - the agent's identity: a uuid that is new at every start (its generation), the start time,
//     and its alias;
//   - a host identity (kernel boot id and network namespace): two agents with the same one can use
//     the same-host path (shared memory, cross-memory attach);
//   - the wireup listener: every IPv4 and IPv6 address and the port of the auxiliary TCP channel
//     that carries the wireup messages;
//   - every device: a software device's interface address and prefix length, an RDMA port's link
//     layer, LID and GID.
//
// Encoding (little-endian; docs/agent.md has the table): "FRYA", version (1 byte), flags (1 byte,
// 0), body length (4 bytes), then fields, each a tag (1 byte), a length (2 bytes) and the value.
// Fields are only ever appended: a decoder skips tags it does not know, so an older agent reads a
// newer address. decode() checks every length against its limit and never reads past the input: a
// malformed address is kProtocolError and nothing else happens.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::agent {

inline constexpr uint8_t kAddressVersion = 1;
inline constexpr size_t kMaxAddressBytes = 64 * 1024;
inline constexpr size_t kMaxAddressListEntries = 64;
inline constexpr size_t kMaxAliasBytes = 256;

using Uuid = std::array<uint8_t, 16>;

// "0f1e...": 32 hex digits.
std::string uuidText(const Uuid& uuid);
// A fresh random uuid (RFC 4122 version 4).
Uuid newUuid();

// One address and port of the wireup listener.
struct ControlEndpoint {
  bool ipv6 = false;
  std::string ip;  // text form, "127.0.0.1" or "::1"
  uint16_t port = 0;
  bool operator==(const ControlEndpoint&) const = default;
};

struct DeviceAddress {
  enum class Kind : uint8_t { kSoft = 1, kRdma = 2 };
  Kind kind = Kind::kSoft;
  std::string name;               // the device's name on its own host ("soft_lo", "rxe0")
  std::string ip;                 // software devices: the interface's IPv4 address
  uint8_t prefixLength = 0;       // software devices: the interface's netmask length
  uint8_t port = 1;               // RDMA: the port number
  uint8_t linkLayer = 0;          // RDMA: 1 InfiniBand, 2 Ethernet (RoCE)
  uint16_t lid = 0;               // RDMA: the port's LID (InfiniBand)
  std::array<uint8_t, 16> gid{};  // RDMA: GID index 0
  bool loopback() const { return kind == Kind::kSoft && ip.rfind("127.", 0) == 0; }
  bool operator==(const DeviceAddress&) const = default;
};

struct WorkerAddress {
  Uuid uuid{};
  uint64_t startNs = 0;  // wall clock of the agent's start (ns since the epoch): newer wins
  std::string alias;
  std::string hostId;
  std::vector<ControlEndpoint> control;
  std::vector<DeviceAddress> devices;

  bool operator==(const WorkerAddress&) const = default;

  std::string encode() const;
  static Result<WorkerAddress> decode(std::string_view bytes);
  // One line for logs and `ferry info`: alias, uuid, control endpoints and devices.
  std::string describe() const;
};

// This host's identity for the same-host path: the kernel's boot id and the network namespace
// (processes in other namespaces cannot reach each other's loopback).
std::string localHostId();

}  // namespace ferry::agent
