#include "verbs/posting.h"

#include <string>

namespace ferry::verbs {

namespace {

Status refused(const std::string& why) { return invalidArgument("post send: " + why); }

}  // namespace

Status checkSendWr(QpType type, const QpCap& cap, const SendWr& wr) {
  auto total = [&wr] {
    uint64_t n = 0;
    for (const Sge& sge : wr.sgList) n += sge.length;
    return n;
  };
  switch (sendWrFault(type, cap, wr)) {
    case SendWrFault::kNone: return Status::ok();
    case SendWrFault::kUnknownOpcode:
      return refused("unknown opcode " + std::to_string(static_cast<unsigned>(wr.opcode)));
    case SendWrFault::kNotOnUc: return refused("a UC QP carries WRITE and SEND only (no READ or atomics)");
    case SendWrFault::kNotOnUd: return refused("a UD QP sends SEND and SEND_WITH_IMM only");
    case SendWrFault::kTooManySges:
      return refused(std::to_string(wr.sgList.size()) + " SGEs, more than the QP's max_send_sge (" +
                     std::to_string(cap.maxSendSge) + ")");
    case SendWrFault::kInlineOnReadOrAtomic: return refused("inline data on a READ or an atomic");
    case SendWrFault::kInlineTooLong:
      return refused(std::to_string(total()) + " bytes of inline data, above the QP's max_inline_data (" +
                     std::to_string(cap.maxInlineData) + ")");
    case SendWrFault::kInlineFromDevice:
      return refused(
          "inline data in CUDA device memory (inline data is read by the CPU; post it from a registered "
          "region)");
    case SendWrFault::kAtomicNotOneEightByteSge: return refused("an atomic needs one 8-byte SGE");
    case SendWrFault::kAtomicUnaligned: return refused("atomic remote address not 8-byte aligned");
  }
  return refused("unknown fault");
}

Status checkRecvWr(uint32_t maxSge, const RecvWr& wr, const char* what) {
  if (recvWrFits(maxSge, wr)) return Status::ok();
  return invalidArgument(std::string(what) + ": " + std::to_string(wr.sgList.size()) +
                         " SGEs, more than max_sge (" + std::to_string(maxSge) + ")");
}

}  // namespace ferry::verbs
