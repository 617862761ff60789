// Path: everything one side needs to connect a queue pair to its peer, without a connection manager.
//
// The no-CM exchange: each side fills a Path from its QP (fillPath), the two swap them over any
// channel (toJson / fromJson: a flat, versioned JSON object; never pickle), each calls reverse() on
// what it received so that "s" fields name itself and "d" fields the peer, and each calls
// QueuePair::establish(path, access) to go INIT -> RTR -> RTS.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

class QueuePair;
class Context;

struct Path {
  Gid sgid;  // this side's GID (for ferry's software devices: address and port)
  Gid dgid;  // the peer's GID
  uint8_t sgidIndex = 0;
  uint16_t slid = 0;  // InfiniBand LIDs (0 on RoCE and software devices)
  uint16_t dlid = 0;
  uint32_t sqpn = 0;   // this side's QP number
  uint32_t dqpn = 0;   // the peer's QP number
  uint32_t sqpsn = 0;  // first PSN this side sends (24 bits)
  uint32_t dqpsn = 0;  // first PSN the peer sends
  uint32_t qkey = 0;
  uint16_t pkeyIndex = 0;
  Mtu mtu = Mtu::k1024;
  uint8_t retries = 7;          // retry_cnt
  uint8_t rnrRetries = 7;       // rnr_retry (7: forever)
  uint8_t minRnrTimer = 12;     // code of the receiver-not-ready wait (12: 0.64 ms)
  uint8_t packetLifeTime = 14;  // timeout code: 4.096 us * 2^14 = 67 ms per try
  uint8_t srdatomic = 1;        // READ/atomics this side may have outstanding (max_rd_atomic)
  uint8_t drdatomic = 1;        // READ/atomics the peer may have outstanding here (max_dest_rd_atomic)
  uint8_t portNum = 1;
  uint8_t sl = 0;
  bool hasGrh = true;
  uint8_t hopLimit = 64;
  uint8_t trafficClass = 0;
  uint32_t flowLabel = 0;
  uint8_t rate = 0;

  bool operator==(const Path&) const = default;

  // Swaps every source field with its destination counterpart (GIDs, LIDs, QPNs, PSNs, read/atomic
  // depths), turning the peer's description into this side's.
  void reverse();
  // The address vector this path implies (dgid, hop limit, traffic class, ...).
  AhAttr ahAttr() const;
  // {"ferry_path": 1, "sgid": "...", ...}: field names as above in snake_case.
  std::string toJson() const;
  // Strict decoder: kInvalidArgument for malformed JSON, wrong types, out-of-range values (QPNs and
  // PSNs above 24 bits, unknown MTU, counts above 7, ...), a missing/unknown "ferry_path" version,
  // or a document naming no QP (sqpn/dqpn) or no address (sgid/dgid/slid/dlid). Other fields left
  // out keep their defaults; unknown fields are ignored (later versions only append fields).
  static Result<Path> fromJson(std::string_view text);
};

// Fills the local half of path from qp: sqpn, a random sqpsn, sgid (GID index path.sgidIndex of the
// QP's port), mtu (the port's active MTU), and srdatomic/drdatomic from the device limits. Keeps
// every field already describing the peer.
Status fillPath(const Context& context, const QueuePair& qp, Path& path);

}  // namespace ferry::verbs
