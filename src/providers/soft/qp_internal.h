// Helpers the parts of a connected QP share (qp.cc, qp_core.cc, rc_requester.cc, rc_responder.cc).
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
