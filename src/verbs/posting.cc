#include "verbs/posting.h"

#include <string>

namespace ferry::verbs {

namespace {

Status refused(const std::string& why) { return invalidArgument("post send: " + why); }

}  // namespace

Status checkSendWr(QpType type, const QpCap& cap, const SendWr& wr) {
  const WrOpcode op = wr.opcode;
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(WrOpcode::kAtomicFetchAndAdd)) {
    return refused("unknown opcode " + std::to_string(static_cast<unsigned>(op)));
  }
  if (type == QpType::kUc && (op == WrOpcode::kRdmaRead || isAtomic(op))) {
    return refused("a UC QP carries WRITE and SEND only (no READ or atomics)");
  }
  if (type == QpType::kUd && op != WrOpcode::kSend && op != WrOpcode::kSendWithImm) {
    return refused("a UD QP sends SEND and SEND_WITH_IMM only");
  }
  if (wr.sgList.size() > cap.maxSendSge) {
    return refused(std::to_string(wr.sgList.size()) + " SGEs, more than the QP's max_send_sge (" +
                   std::to_string(cap.maxSendSge) + ")");
  }
  const bool inlined = (wr.sendFlags & send_flags::kInline) != 0;
  if (!inlined && !isAtomic(op)) return Status::ok();  // the rest concerns inline data and atomics
  uint64_t total = 0;
  for (const Sge& sge : wr.sgList) total += sge.length;
  if (inlined) {
    if (op == WrOpcode::kRdmaRead || isAtomic(op)) return refused("inline data on a READ or an atomic");
    if (total > cap.maxInlineData) {
      return refused(std::to_string(total) + " bytes of inline data, above the QP's max_inline_data (" +
                     std::to_string(cap.maxInlineData) + ")");
    }
  }
  if (isAtomic(op)) {
    if (wr.sgList.size() != 1 || total != 8) return refused("an atomic needs one 8-byte SGE");
    if (wr.atomic.remoteAddr % 8 != 0) return refused("atomic remote address not 8-byte aligned");
  }
  return Status::ok();
}

Status checkRecvWr(uint32_t maxSge, const RecvWr& wr, const char* what) {
  if (wr.sgList.size() > maxSge) {
    return invalidArgument(std::string(what) + ": " + std::to_string(wr.sgList.size()) +
                           " SGEs, more than max_sge (" + std::to_string(maxSge) + ")");
  }
  return Status::ok();
}

}  // namespace ferry::verbs
