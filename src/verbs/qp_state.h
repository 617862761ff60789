// The QP state machine of the verbs specification, shared by every provider that checks
// transitions itself (the kernel does it for the ibverbs provider).
#pragma once

#include <cstdint>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

// Checks a modify request against the transition table (the kernel's ib_modify_qp_is_ok): the
// transition current -> attr.state (or current itself when kState is absent) must be legal for
// the QP type, every required attribute must be in mask, and nothing outside required|optional.
// Also checks the values it can (retry counts <= 7, timer codes <= 31, MTU code 1..5, a kCurState
// that matches current). Returns the state the QP moves to; kInvalidArgument (EINVAL) otherwise.
Result<QpState> checkQpTransition(QpType type, QpState current, const QpAttr& attr, uint32_t mask);

// Receiver-not-ready wait of a min_rnr_timer code, in microseconds (code 0 is 655.36 ms).
uint32_t rnrTimerMicros(uint8_t code);

}  // namespace ferry::verbs
