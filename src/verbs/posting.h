// The posting rules that depend on a request and its queue's capabilities alone. The verbs layer
// checks them once, before a post reaches any provider, so every device refuses the same requests
// with the same error (EINVAL, as ibv_post_send does) and the providers check only what they alone
// know: the QP's state, a full queue, their message limits, address handles.
#pragma once

#include <cstdint>

#include "common/cuda_driver.h"
#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

// The first posting rule a send request breaks on a QP of this type and these capabilities
// (kNone: none): a known opcode the QP type carries (UC: WRITE and SEND; UD: SEND only), at most
// max_send_sge SGEs, inline data only on WRITE and SEND and at most max_inline_data of it, and an
// atomic with one 8-byte SGE and an 8-byte aligned remote address. Inline, so that a request that
// breaks none costs these comparisons alone; checkSendWr words the refusal.
enum class SendWrFault : uint8_t {
  kNone,
  kUnknownOpcode,
  kNotOnUc,
  kNotOnUd,
  kTooManySges,
  kInlineOnReadOrAtomic,
  kInlineTooLong,
  kInlineFromDevice,
  kAtomicNotOneEightByteSge,
  kAtomicUnaligned,
};
inline SendWrFault sendWrFault(QpType type, const QpCap& cap, const SendWr& wr) {
  const WrOpcode op = wr.opcode;
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(WrOpcode::kAtomicFetchAndAdd)) {
    return SendWrFault::kUnknownOpcode;
  }
  if (type == QpType::kUc && (op == WrOpcode::kRdmaRead || isAtomic(op))) return SendWrFault::kNotOnUc;
  if (type == QpType::kUd && op != WrOpcode::kSend && op != WrOpcode::kSendWithImm)
    return SendWrFault::kNotOnUd;
  if (wr.sgList.size() > cap.maxSendSge) return SendWrFault::kTooManySges;
  const bool inlined = (wr.sendFlags & send_flags::kInline) != 0;
  if (!inlined && !isAtomic(op)) return SendWrFault::kNone;  // the rest concerns inline data and atomics
  uint64_t total = 0;
  for (const Sge& sge : wr.sgList) total += sge.length;
  if (inlined) {
    if (op == WrOpcode::kRdmaRead || isAtomic(op)) return SendWrFault::kInlineOnReadOrAtomic;
    if (total > cap.maxInlineData) return SendWrFault::kInlineTooLong;
    // Inline data is read by the CPU as the post returns: never from a GPU's memory (no driver
    // call until this process registered any).
    if (cuda::deviceMemoryRegistered()) {
      for (const Sge& sge : wr.sgList) {
        if (sge.length != 0 && cuda::locate(reinterpret_cast<const void*>(sge.addr)).onDevice())
          return SendWrFault::kInlineFromDevice;
      }
    }
  }
  if (isAtomic(op)) {
    if (wr.sgList.size() != 1 || total != 8) return SendWrFault::kAtomicNotOneEightByteSge;
    if (wr.atomic.remoteAddr % 8 != 0) return SendWrFault::kAtomicUnaligned;
  }
  return SendWrFault::kNone;
}

// The refusal of a request sendWrFault finds a fault with (EINVAL, as ibv_post_send gives), or ok.
Status checkSendWr(QpType type, const QpCap& cap, const SendWr& wr);

// A receive request on a queue taking at most maxSge SGEs (inline, as sendWrFault); checkRecvWr
// words the refusal, `what` naming the call ("post recv", "post SRQ recv").
inline bool recvWrFits(uint32_t maxSge, const RecvWr& wr) { return wr.sgList.size() <= maxSge; }
Status checkRecvWr(uint32_t maxSge, const RecvWr& wr, const char* what);

}  // namespace ferry::verbs
