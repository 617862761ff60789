// The posting rules that depend on a request and its queue's capabilities alone. The verbs layer
// checks them once, before a post reaches any provider, so every device refuses the same requests
// with the same error (EINVAL, as ibv_post_send does) and the providers check only what they alone
// know: the QP's state, a full queue, their message limits, address handles.
#pragma once

#include <cstdint>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

// A send request on a QP of this type and these capabilities: a known opcode the QP type carries
// (UC: WRITE and SEND; UD: SEND only), at most max_send_sge SGEs, inline data only on WRITE and
// SEND and at most max_inline_data of it, and an atomic with one 8-byte SGE and an 8-byte aligned
// remote address.
Status checkSendWr(QpType type, const QpCap& cap, const SendWr& wr);

// True for a request checkSendWr passes that is quick to tell (no inline data, no atomic, an
// opcode the QP type carries, few enough SGEs), so that a batch of plain WRITEs, READs and SENDs
// builds no Status per request; false says nothing (checkSendWr decides).
inline bool plainSendWr(QpType type, const QpCap& cap, const SendWr& wr) {
  if ((wr.sendFlags & send_flags::kInline) != 0 || wr.sgList.size() > cap.maxSendSge) return false;
  switch (wr.opcode) {
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: return true;
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: return type != QpType::kUd;
    case WrOpcode::kRdmaRead: return type == QpType::kRc;
    default: return false;
  }
}

// A receive request on a queue taking at most maxSge SGEs; `what` names the call in the error
// ("post recv", "post SRQ recv").
Status checkRecvWr(uint32_t maxSge, const RecvWr& wr, const char* what);

}  // namespace ferry::verbs
