// What the endpoint's files share beside endpoint.h: how work requests are numbered and messages
// cut into fragments, and the types behind Endpoint's private declarations.
//
// Endpoint's jobs, one file each: endpoint.cc (creation, the worker, failure, shutdown, counters),
// regions.cc (local regions through the pool; the table of the peer's regions), connection.cc
// (metadata and connect()), operations.cc (checking and issuing operations), posting.cc (cutting
// them into work requests on the queue pairs), completions.cc (taking the completion queue: by the
// worker or by waiters that poll, send completions, the liveness probe), receives.cc (messages and
// immediates: receives kept posted, fragments matched to recv(), immediates to immRecv()).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/endpoint/endpoint.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

// Receive work requests carry this bit in their wrId (send work requests carry their sequence).
inline constexpr uint64_t kRecvWrFlag = uint64_t{1} << 63;
// A message travels as SEND_WITH_IMM fragments; the immediate holds the message number (31 bits)
// and whether the fragment is the message's last.
inline constexpr uint32_t kLastFragment = uint32_t{1} << 31;
inline constexpr uint32_t kMessageSeqMask = kLastFragment - 1;
// A send work request is signaled at least this often (and the last of every post).
inline constexpr uint32_t kSignalEvery = 16;
inline constexpr uint32_t kMaxSendSge = 8;
inline constexpr uint32_t kQpAccess =
    verbs::access::kLocalWrite | verbs::access::kRemoteWrite | verbs::access::kRemoteRead;

// The status a failed work completion gives its operation and the endpoint (completions.cc).
// peerGone: report a queue pair that gave up on the peer, and the work flushed after it, as
// kPeerGone (EndpointOptions::transportFailureIsPeerGone).
Status workCompletionStatus(const verbs::WorkCompletion& wc, size_t lane, const Status& failure,
                            bool peerGone);

struct Endpoint::Fragment {
  std::vector<uint8_t> copy;  // the bytes, copied aside
  int64_t buffer = -1;        // or the receive buffer still holding them
  uint32_t length = 0;
};

struct Endpoint::IncomingMessage {
  std::deque<Fragment> fragments;
  bool complete = false;
};

}  // namespace ferry::endpoint
