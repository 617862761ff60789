#include "ferry/verbs/types.h"

#include <arpa/inet.h>

#include <cstring>

namespace ferry::verbs {

const char* wcStatusName(WcStatus status) {
  switch (status) {
    case WcStatus::kSuccess: return "SUCCESS";
    case WcStatus::kLocLenErr: return "LOC_LEN_ERR";
    case WcStatus::kLocQpOpErr: return "LOC_QP_OP_ERR";
    case WcStatus::kLocEecOpErr: return "LOC_EEC_OP_ERR";
    case WcStatus::kLocProtErr: return "LOC_PROT_ERR";
    case WcStatus::kWrFlushErr: return "WR_FLUSH_ERR";
    case WcStatus::kMwBindErr: return "MW_BIND_ERR";
    case WcStatus::kBadRespErr: return "BAD_RESP_ERR";
    case WcStatus::kLocAccessErr: return "LOC_ACCESS_ERR";
    case WcStatus::kRemInvReqErr: return "REM_INV_REQ_ERR";
    case WcStatus::kRemAccessErr: return "REM_ACCESS_ERR";
    case WcStatus::kRemOpErr: return "REM_OP_ERR";
    case WcStatus::kRetryExcErr: return "RETRY_EXC_ERR";
    case WcStatus::kRnrRetryExcErr: return "RNR_RETRY_EXC_ERR";
    case WcStatus::kLocRddViolErr: return "LOC_RDD_VIOL_ERR";
    case WcStatus::kRemInvRdReqErr: return "REM_INV_RD_REQ_ERR";
    case WcStatus::kRemAbortErr: return "REM_ABORT_ERR";
    case WcStatus::kInvEecnErr: return "INV_EECN_ERR";
    case WcStatus::kInvEecStateErr: return "INV_EEC_STATE_ERR";
    case WcStatus::kFatalErr: return "FATAL_ERR";
    case WcStatus::kRespTimeoutErr: return "RESP_TIMEOUT_ERR";
    case WcStatus::kGeneralErr: return "GENERAL_ERR";
  }
  return "UNKNOWN";
}

const char* wcOpcodeName(WcOpcode opcode) {
  switch (opcode) {
    case WcOpcode::kSend: return "SEND";
    case WcOpcode::kRdmaWrite: return "RDMA_WRITE";
    case WcOpcode::kRdmaRead: return "RDMA_READ";
    case WcOpcode::kCompSwap: return "COMP_SWAP";
    case WcOpcode::kFetchAdd: return "FETCH_ADD";
    case WcOpcode::kRecv: return "RECV";
    case WcOpcode::kRecvRdmaWithImm: return "RECV_RDMA_WITH_IMM";
  }
  return "UNKNOWN";
}

const char* qpStateName(QpState state) {
  switch (state) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kSqd: return "SQD";
    case QpState::kSqe: return "SQE";
    case QpState::kErr: return "ERR";
  }
  return "UNKNOWN";
}

const char* asyncEventName(AsyncEventType type) {
  switch (type) {
    case AsyncEventType::kCqErr: return "CQ_ERR";
    case AsyncEventType::kQpFatal: return "QP_FATAL";
    case AsyncEventType::kQpReqErr: return "QP_REQ_ERR";
    case AsyncEventType::kQpAccessErr: return "QP_ACCESS_ERR";
    case AsyncEventType::kCommEst: return "COMM_EST";
    case AsyncEventType::kSqDrained: return "SQ_DRAINED";
    case AsyncEventType::kPathMig: return "PATH_MIG";
    case AsyncEventType::kPathMigErr: return "PATH_MIG_ERR";
    case AsyncEventType::kDeviceFatal: return "DEVICE_FATAL";
    case AsyncEventType::kPortActive: return "PORT_ACTIVE";
    case AsyncEventType::kPortErr: return "PORT_ERR";
    case AsyncEventType::kLidChange: return "LID_CHANGE";
    case AsyncEventType::kPkeyChange: return "PKEY_CHANGE";
    case AsyncEventType::kSmChange: return "SM_CHANGE";
    case AsyncEventType::kSrqErr: return "SRQ_ERR";
    case AsyncEventType::kSrqLimitReached: return "SRQ_LIMIT_REACHED";
    case AsyncEventType::kQpLastWqeReached: return "QP_LAST_WQE_REACHED";
    case AsyncEventType::kClientReregister: return "CLIENT_REREGISTER";
    case AsyncEventType::kGidChange: return "GID_CHANGE";
  }
  return "UNKNOWN";
}

bool Gid::isZero() const {
  for (uint8_t b : raw) {
    if (b != 0) return false;
  }
  return true;
}

std::string Gid::toString() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(39);
  for (size_t i = 0; i < raw.size(); ++i) {
    if (i > 0 && i % 2 == 0) text += ':';
    text += kHex[raw[i] >> 4];
    text += kHex[raw[i] & 0xF];
  }
  return text;
}

bool Gid::parse(const std::string& text, Gid* out) {
  if (out == nullptr) return false;
  // inet_pton(AF_INET6) takes exactly the IPv6 text forms: the full 8-group form, "::"
  // compression and a trailing dotted IPv4 part; no zone index, no brackets, no spaces.
  Gid gid;
  if (inet_pton(AF_INET6, text.c_str(), gid.raw.data()) != 1) return false;
  // A string with an embedded NUL would otherwise parse as its prefix.
  if (std::strlen(text.c_str()) != text.size()) return false;
  *out = gid;
  return true;
}

}  // namespace ferry::verbs
