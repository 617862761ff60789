// ferry._core.verbs_constants: the IBV_* numbers of ferry/verbs/types.h, under libibverbs' names.
//
// ferry.verbs takes its constants from here (`from ._core.verbs_constants import *`), so each value
// is written once, in the C++ layer. The enums whose names src/verbs/types.cc prints
// (wcStatusName, wcOpcodeName, qpStateName, asyncEventName) bring their names along; the flag sets
// and the other enums are named in the table below. `__all__` lists every name.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ferry/verbs/types.h"

namespace ferry::python {

namespace py = pybind11;

namespace {

struct NamedValue {
  const char* name;
  int64_t value;
};

template <typename E>
constexpr int64_t valueOf(E e) {
  return static_cast<int64_t>(e);
}

namespace access = verbs::access;
namespace send_flags = verbs::send_flags;
namespace wc_flags = verbs::wc_flags;
namespace qp_attr_mask = verbs::qp_attr_mask;
namespace rereg = verbs::rereg;
using verbs::LinkLayer;
using verbs::Mtu;
using verbs::PortState;
using verbs::QpType;
using verbs::WrOpcode;

constexpr NamedValue kNamedValues[] = {
    {"IBV_ACCESS_LOCAL_WRITE", access::kLocalWrite},
    {"IBV_ACCESS_REMOTE_WRITE", access::kRemoteWrite},
    {"IBV_ACCESS_REMOTE_READ", access::kRemoteRead},
    {"IBV_ACCESS_REMOTE_ATOMIC", access::kRemoteAtomic},

    {"IBV_SEND_FENCE", send_flags::kFence},
    {"IBV_SEND_SIGNALED", send_flags::kSignaled},
    {"IBV_SEND_SOLICITED", send_flags::kSolicited},
    {"IBV_SEND_INLINE", send_flags::kInline},

    {"IBV_WC_GRH", wc_flags::kGrh},
    {"IBV_WC_WITH_IMM", wc_flags::kWithImm},

    {"IBV_QP_STATE", qp_attr_mask::kState},
    {"IBV_QP_CUR_STATE", qp_attr_mask::kCurState},
    {"IBV_QP_EN_SQD_ASYNC_NOTIFY", qp_attr_mask::kEnSqdAsyncNotify},
    {"IBV_QP_ACCESS_FLAGS", qp_attr_mask::kAccessFlags},
    {"IBV_QP_PKEY_INDEX", qp_attr_mask::kPkeyIndex},
    {"IBV_QP_PORT", qp_attr_mask::kPort},
    {"IBV_QP_QKEY", qp_attr_mask::kQkey},
    {"IBV_QP_AV", qp_attr_mask::kAv},
    {"IBV_QP_PATH_MTU", qp_attr_mask::kPathMtu},
    {"IBV_QP_TIMEOUT", qp_attr_mask::kTimeout},
    {"IBV_QP_RETRY_CNT", qp_attr_mask::kRetryCnt},
    {"IBV_QP_RNR_RETRY", qp_attr_mask::kRnrRetry},
    {"IBV_QP_RQ_PSN", qp_attr_mask::kRqPsn},
    {"IBV_QP_MAX_QP_RD_ATOMIC", qp_attr_mask::kMaxQpRdAtomic},
    {"IBV_QP_ALT_PATH", qp_attr_mask::kAltPath},
    {"IBV_QP_MIN_RNR_TIMER", qp_attr_mask::kMinRnrTimer},
    {"IBV_QP_SQ_PSN", qp_attr_mask::kSqPsn},
    {"IBV_QP_MAX_DEST_RD_ATOMIC", qp_attr_mask::kMaxDestRdAtomic},
    {"IBV_QP_PATH_MIG_STATE", qp_attr_mask::kPathMigState},
    {"IBV_QP_CAP", qp_attr_mask::kCap},
    {"IBV_QP_DEST_QPN", qp_attr_mask::kDestQpn},

    {"IBV_REREG_MR_CHANGE_TRANSLATION", rereg::kChangeTranslation},
    {"IBV_REREG_MR_CHANGE_PD", rereg::kChangePd},
    {"IBV_REREG_MR_CHANGE_ACCESS", rereg::kChangeAccess},

    {"IBV_QPT_RC", valueOf(QpType::kRc)},
    {"IBV_QPT_UC", valueOf(QpType::kUc)},
    {"IBV_QPT_UD", valueOf(QpType::kUd)},

    {"IBV_WR_RDMA_WRITE", valueOf(WrOpcode::kRdmaWrite)},
    {"IBV_WR_RDMA_WRITE_WITH_IMM", valueOf(WrOpcode::kRdmaWriteWithImm)},
    {"IBV_WR_SEND", valueOf(WrOpcode::kSend)},
    {"IBV_WR_SEND_WITH_IMM", valueOf(WrOpcode::kSendWithImm)},
    {"IBV_WR_RDMA_READ", valueOf(WrOpcode::kRdmaRead)},
    {"IBV_WR_ATOMIC_CMP_AND_SWP", valueOf(WrOpcode::kAtomicCmpAndSwp)},
    {"IBV_WR_ATOMIC_FETCH_AND_ADD", valueOf(WrOpcode::kAtomicFetchAndAdd)},

    {"IBV_MTU_256", valueOf(Mtu::k256)},
    {"IBV_MTU_512", valueOf(Mtu::k512)},
    {"IBV_MTU_1024", valueOf(Mtu::k1024)},
    {"IBV_MTU_2048", valueOf(Mtu::k2048)},
    {"IBV_MTU_4096", valueOf(Mtu::k4096)},

    {"IBV_PORT_NOP", valueOf(PortState::kNop)},
    {"IBV_PORT_DOWN", valueOf(PortState::kDown)},
    {"IBV_PORT_INIT", valueOf(PortState::kInit)},
    {"IBV_PORT_ARMED", valueOf(PortState::kArmed)},
    {"IBV_PORT_ACTIVE", valueOf(PortState::kActive)},

    {"IBV_LINK_LAYER_UNSPECIFIED", valueOf(LinkLayer::kUnspecified)},
    {"IBV_LINK_LAYER_INFINIBAND", valueOf(LinkLayer::kInfiniband)},
    {"IBV_LINK_LAYER_ETHERNET", valueOf(LinkLayer::kEthernet)},
};

// Adds prefix + name(e) for every value of the enum that its name function knows ("UNKNOWN" marks
// the others). The enums are uint8_t, so 0..255 covers them.
template <typename E>
void addNamedEnum(py::module_& m, py::list& names, const char* prefix, const char* (*name)(E)) {
  for (int v = 0; v <= 255; ++v) {
    const char* text = name(static_cast<E>(v));
    if (std::strcmp(text, "UNKNOWN") == 0) continue;
    std::string full = std::string(prefix) + text;
    // Two enums sharing a prefix (IBV_WC_: opcodes and statuses) must not share a name.
    if (py::hasattr(m, full.c_str())) throw std::logic_error("verbs constant named twice: " + full);
    m.attr(full.c_str()) = v;
    names.append(full);
  }
}

}  // namespace

void bindVerbsConstants(py::module_& m) {
  py::list names;
  for (const NamedValue& c : kNamedValues) {
    m.attr(c.name) = c.value;
    names.append(c.name);
  }
  addNamedEnum(m, names, "IBV_QPS_", &verbs::qpStateName);
  addNamedEnum(m, names, "IBV_WC_", &verbs::wcOpcodeName);
  addNamedEnum(m, names, "IBV_WC_", &verbs::wcStatusName);
  addNamedEnum(m, names, "IBV_EVENT_", &verbs::asyncEventName);
  names.attr("sort")();
  m.attr("__all__") = names;
}

}  // namespace ferry::python
