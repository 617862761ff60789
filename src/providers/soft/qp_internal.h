// Helpers the files of SoftQp share (qp.cc, qp_requester.cc, qp_same_host.cc, qp_responder.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"
#include "providers/soft/wire.h"

namespace ferry::soft::qp_detail {

using verbs::isAtomic;
using verbs::isReadOrAtomic;
using verbs::QpState;
using verbs::WcOpcode;
using verbs::WcStatus;
using verbs::WrOpcode;

// The most requests (and their local pieces) one same-host system call carries.
constexpr size_t kMaxFastBatch = 256;
constexpr size_t kMaxFastPieces = 1024;
// A same-host post of up to this many bytes is copied under the QP's lock: a short hold costs the
// reactor less than a second lock and a busy mark cost the post (about 1 us of copying at most).
constexpr uint64_t kHoldLockBytes = 16 * 1024;
// Same-host requests from this size are copied by two threads (SoftQp::copyInTwo).
constexpr uint64_t kStripeBytes = uint64_t{4} << 20;

inline bool seqLe(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }

inline WcOpcode wcOpcodeFor(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: return WcOpcode::kRdmaWrite;
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: return WcOpcode::kSend;
    case WrOpcode::kRdmaRead: return WcOpcode::kRdmaRead;
    case WrOpcode::kAtomicCmpAndSwp: return WcOpcode::kCompSwap;
    case WrOpcode::kAtomicFetchAndAdd: return WcOpcode::kFetchAdd;
  }
  return WcOpcode::kSend;
}

inline WcStatus statusForSyndrome(wire::Syndrome s) {
  switch (s) {
    case wire::Syndrome::kRemAccess: return WcStatus::kRemAccessErr;
    case wire::Syndrome::kRemInvReq: return WcStatus::kRemInvReqErr;
    case wire::Syndrome::kRemOp: return WcStatus::kRemOpErr;
    case wire::Syndrome::kRnr: return WcStatus::kRnrRetryExcErr;
    case wire::Syndrome::kOk: break;
  }
  return WcStatus::kGeneralErr;
}

inline Status refusePost(const std::string& why) { return invalidArgument("post: " + why); }

}  // namespace ferry::soft::qp_detail
