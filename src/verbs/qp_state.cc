#include "verbs/qp_state.h"

#include <cstdio>
#include <string>

namespace ferry::verbs {
namespace {

namespace m = qp_attr_mask;

struct Rule {
  bool valid = false;
  uint32_t required = 0;
  uint32_t optional = 0;
};

// Attribute masks per transition for RC, UC and UD QPs (IBA 11.2.4.2, as libibverbs checks them).
// UC has no acknowledgements: no READ/atomic resources, RNR timer, timeout or retry counts.
Rule ruleFor(QpType type, QpState from, QpState to) {
  const bool ud = type == QpType::kUd;
  const bool uc = type == QpType::kUc;
  if (to == QpState::kReset || to == QpState::kErr) return {true, 0, 0};
  switch (from) {
    case QpState::kReset:
      if (to == QpState::kInit) {
        return ud ? Rule{true, m::kPkeyIndex | m::kPort | m::kQkey, 0}
                  : Rule{true, m::kPkeyIndex | m::kPort | m::kAccessFlags, 0};
      }
      break;
    case QpState::kInit:
      if (to == QpState::kInit) {
        return ud ? Rule{true, 0, m::kPkeyIndex | m::kPort | m::kQkey}
                  : Rule{true, 0, m::kPkeyIndex | m::kPort | m::kAccessFlags};
      }
      if (to == QpState::kRtr) {
        if (ud) return {true, 0, m::kPkeyIndex | m::kQkey};
        if (uc) {
          return {true, m::kAv | m::kPathMtu | m::kDestQpn | m::kRqPsn,
                  m::kAltPath | m::kAccessFlags | m::kPkeyIndex};
        }
        return {true, m::kAv | m::kPathMtu | m::kDestQpn | m::kRqPsn | m::kMaxDestRdAtomic | m::kMinRnrTimer,
                m::kAltPath | m::kAccessFlags | m::kPkeyIndex};
      }
      break;
    case QpState::kRtr:
      if (to == QpState::kRts) {
        if (ud) return {true, m::kSqPsn, m::kCurState | m::kQkey};
        if (uc) return {true, m::kSqPsn, m::kCurState | m::kAltPath | m::kAccessFlags | m::kPathMigState};
        return {true, m::kSqPsn | m::kMaxQpRdAtomic | m::kRetryCnt | m::kRnrRetry | m::kTimeout,
                m::kCurState | m::kAltPath | m::kAccessFlags | m::kMinRnrTimer | m::kPathMigState};
      }
      break;
    case QpState::kRts:
      if (to == QpState::kRts) {
        if (ud) return {true, 0, m::kCurState | m::kQkey};
        if (uc) return {true, 0, m::kCurState | m::kAccessFlags | m::kAltPath | m::kPathMigState};
        return {true, 0, m::kCurState | m::kAccessFlags | m::kAltPath | m::kPathMigState | m::kMinRnrTimer};
      }
      break;
    default: break;
  }
  return {};
}

Status refuse(const std::string& why) { return invalidArgument("modify QP: " + why); }

// The mask against the transition's rule: every required attribute, nothing outside
// required|optional.
Status checkMask(QpState current, QpState next, const Rule& rule, uint32_t mask) {
  uint32_t attrs = mask & ~(m::kState);
  if ((attrs & rule.required) != rule.required) {
    return refuse(std::string("transition ") + qpStateName(current) + " -> " + qpStateName(next) +
                  " misses required attributes (mask 0x" +
                  [&] {
                    char buf[16];
                    std::snprintf(buf, sizeof buf, "%x", rule.required & ~attrs);
                    return std::string(buf);
                  }() +
                  ")");
  }
  uint32_t extra = attrs & ~(rule.required | rule.optional);
  // CUR_STATE is accepted with every transition where it is listed; anything else is refused.
  if (extra != 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%x", extra);
    return refuse(std::string("attributes not allowed in ") + qpStateName(current) + " -> " +
                  qpStateName(next) + " (mask 0x" + buf + ")");
  }
  return Status::ok();
}

// The values of the attributes in mask that have a range.
Status checkAttrValues(const QpAttr& attr, uint32_t mask) {
  if ((mask & m::kPathMtu) &&
      (static_cast<uint8_t>(attr.pathMtu) < 1 || static_cast<uint8_t>(attr.pathMtu) > 5)) {
    return refuse("path_mtu must be 1..5");
  }
  if ((mask & m::kRetryCnt) && attr.retryCnt > 7) return refuse("retry_cnt above 7");
  if ((mask & m::kRnrRetry) && attr.rnrRetry > 7) return refuse("rnr_retry above 7");
  if ((mask & m::kMinRnrTimer) && attr.minRnrTimer > 31) return refuse("min_rnr_timer above 31");
  if ((mask & m::kTimeout) && attr.timeout > 31) return refuse("timeout above 31");
  if ((mask & m::kDestQpn) && attr.destQpNum >= (1u << 24)) return refuse("dest_qp_num above 24 bits");
  if ((mask & m::kRqPsn) && attr.rqPsn >= (1u << 24)) return refuse("rq_psn above 24 bits");
  if ((mask & m::kSqPsn) && attr.sqPsn >= (1u << 24)) return refuse("sq_psn above 24 bits");
  if ((mask & m::kAccessFlags) && (attr.qpAccessFlags & ~access::kAll) != 0) {
    return refuse("unknown qp_access_flags bits");
  }
  if ((mask & m::kPort) && attr.portNum != 1) return refuse("port_num must be 1");
  return Status::ok();
}

}  // namespace

Result<QpState> checkQpTransition(QpType type, QpState current, const QpAttr& attr, uint32_t mask) {
  if (type != QpType::kRc && type != QpType::kUc && type != QpType::kUd) return refuse("unsupported QP type");
  if ((mask & m::kCurState) && attr.curState != current) {
    return refuse(std::string("cur_state ") + qpStateName(attr.curState) + " is not the QP's state " +
                  qpStateName(current));
  }
  QpState next = (mask & m::kState) ? attr.state : current;
  if (static_cast<uint8_t>(next) > static_cast<uint8_t>(QpState::kErr)) return refuse("unknown state");
  if (next == QpState::kSqd || next == QpState::kSqe || current == QpState::kSqd ||
      current == QpState::kSqe) {
    return Status(StatusCode::kInvalidArgument, "modify QP: SQD/SQE states are not offered", EINVAL);
  }
  Rule rule = ruleFor(type, current, next);
  if (!rule.valid) {
    return refuse(std::string("illegal transition ") + qpStateName(current) + " -> " + qpStateName(next));
  }
  FERRY_RETURN_IF_ERROR(checkMask(current, next, rule, mask));
  FERRY_RETURN_IF_ERROR(checkAttrValues(attr, mask));
  return next;
}

uint32_t rnrTimerMicros(uint8_t code) {
  // IBA table 45: code -> milliseconds * 100 (so 1 = 0.01 ms).
  static constexpr uint32_t kTable[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                          160,    240,   320,   480,    640,    960,    1280,   1920,
                                          2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                          40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kTable[code & 31];
}

}  // namespace ferry::verbs
