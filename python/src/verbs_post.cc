// post_send / post_recv: from send_wr / recv_wr objects to the provider's work requests.
//
// A call takes one work request or a non-empty list/tuple of them. Types are checked first
// (TypeError, nothing posted). Then each request is converted in order; a request the binding
// refuses (a UD send without an open AH, inline data outside registered memory, an opcode out of
// range) stops the conversion there. The requests before it are posted, as libibverbs posts a
// chain up to its bad entry, and WRError names the index of the refused one, whether the binding
// or the provider refused it.
#include <cstring>
#include <span>
#include <vector>

#include "status.h"
#include "verbs_objects.h"
#include "verbs_structs.h"

namespace ferry::python {

namespace {

template <typename Wr>
std::vector<py::handle> workRequestList(py::handle arg, const char* typeName) {
  std::vector<py::handle> items;
  if (py::isinstance<Wr>(arg)) {
    items.push_back(arg);
  } else if ((py::isinstance<py::list>(arg) || py::isinstance<py::tuple>(arg)) && py::len(arg) > 0) {
    for (py::handle item : arg) {
      if (!py::isinstance<Wr>(item)) {
        throw py::type_error(std::string("work requests must be of type ") + typeName + ", not " +
                             std::string(py::str(py::type::handle_of(item).attr("__name__"))));
      }
      items.push_back(item);
    }
  } else {
    throw py::type_error(std::string("expected a ") + typeName + " or a non-empty list/tuple of them");
  }
  return items;
}

// Number of SGEs in an sg_list (an sge, a list/tuple of sge, or None); TypeError otherwise.
size_t countSges(py::handle sgList) {
  if (sgList.is_none()) return 0;
  if (py::isinstance<SgeValue>(sgList)) return 1;
  if (py::isinstance<py::list>(sgList) || py::isinstance<py::tuple>(sgList)) {
    for (py::handle item : sgList) {
      if (!py::isinstance<SgeValue>(item)) throw py::type_error("sg_list entries must be of type sge");
    }
    return py::len(sgList);
  }
  throw py::type_error("sg_list must be an sge, a list/tuple of sge, or None");
}

void appendSges(py::handle sgList, std::vector<verbs::Sge>& out) {
  auto add = [&out](py::handle h) {
    const SgeValue& s = h.cast<const SgeValue&>();
    out.push_back(verbs::Sge{.addr = s.addr, .length = s.length, .lkey = s.lkey});
  };
  if (sgList.is_none()) return;
  if (py::isinstance<SgeValue>(sgList)) {
    add(sgList);
    return;
  }
  for (py::handle item : sgList) add(item);
}

}  // namespace

void postSendList(QpObject& qp, py::handle arg) {
  verbs::QueuePair& handle = qp.handle();
  std::vector<py::handle> items = workRequestList<SendWrValue>(arg, "send_wr");
  size_t totalSges = 0;
  for (py::handle item : items) totalSges += countSges(item.cast<const SendWrValue&>().sg_list);

  // Reserved up front: the spans below point into `sges` and must not move.
  std::vector<verbs::Sge> sges;
  sges.reserve(totalSges);
  std::vector<verbs::SendWr> wrs;
  wrs.reserve(items.size());
  PdObject& pd = qp.pdObject().cast<PdObject&>();
  const bool ud = qp.type() == verbs::QpType::kUd;

  size_t refusedAt = items.size();
  Status refusal;
  for (size_t i = 0; i < items.size() && refusal.isOk(); ++i) {
    const SendWrValue& v = items[i].cast<const SendWrValue&>();
    verbs::SendWr wr;
    wr.wrId = v.wr_id;
    if (v.opcode < 0 || v.opcode > 0xFF) {
      refusal =
          invalidArgument("post send: opcode " + std::to_string(v.opcode) + " is not an IBV_WR_* value");
    }
    wr.opcode = static_cast<verbs::WrOpcode>(v.opcode & 0xFF);
    wr.sendFlags = v.send_flags;
    wr.immData = v.imm_data;
    wr.rdma.remoteAddr = v.remote_addr;
    wr.rdma.rkey = v.rkey;
    wr.atomic.remoteAddr = v.remote_addr;
    wr.atomic.rkey = v.rkey;
    wr.atomic.compareAdd = v.compare_add;
    wr.atomic.swap = v.swap;
    size_t first = sges.size();
    appendSges(v.sg_list, sges);
    wr.sgList = std::span<const verbs::Sge>(sges.data() + first, sges.size() - first);
    if (refusal.isOk() && ud) {
      if (v.ah.is_none()) {
        refusal = invalidArgument("post send: a UD work request needs an address handle (ah)");
      } else if (!py::isinstance<AhObject>(v.ah)) {
        refusal = invalidArgument("post send: ah must be a ferry.verbs.AH");
      } else {
        const AhObject& ah = v.ah.cast<const AhObject&>();
        if (ah.id() == nullptr)
          refusal = Status(StatusCode::kClosed, "post send: the address handle is closed", EBADF);
        wr.ud.ah = ah.id();
      }
      wr.ud.remoteQpn = v.remote_qpn;
      wr.ud.remoteQkey = v.remote_qkey;
    }
    // Inline data is read from the given addresses at once, without a key check by the device:
    // here they must lie in a registered region of the QP's PD, so a wrong address is an error
    // rather than a stray memory access.
    if (refusal.isOk() && (v.send_flags & verbs::send_flags::kInline)) {
      for (const auto& sge : wr.sgList) {
        if (sge.length != 0 && !pd.coversLocal(sge.addr, sge.length, sge.lkey)) {
          refusal = invalidArgument(
              "post send: inline data must lie in an open memory region of the QP's PD "
              "(with that region's lkey)");
          break;
        }
      }
    }
    if (!refusal.isOk()) {
      refusedAt = i;
      break;
    }
    wrs.push_back(wr);
  }

  if (!wrs.empty()) {
    size_t badIndex = 0;
    Status st = handle.postSend(std::span<const verbs::SendWr>(wrs), &badIndex);
    if (!st.isOk()) raiseWrError(st, "ibv_post_send", badIndex);
  }
  if (!refusal.isOk()) raiseWrError(refusal, "ibv_post_send", refusedAt);
}

void postRecvList(verbs::QueuePair* qp, verbs::SharedReceiveQueue* srq, py::handle arg) {
  std::vector<py::handle> items = workRequestList<RecvWrValue>(arg, "recv_wr");
  size_t totalSges = 0;
  for (py::handle item : items) totalSges += countSges(item.cast<const RecvWrValue&>().sg_list);
  std::vector<verbs::Sge> sges;
  sges.reserve(totalSges);
  std::vector<verbs::RecvWr> wrs;
  wrs.reserve(items.size());
  for (py::handle item : items) {
    const RecvWrValue& v = item.cast<const RecvWrValue&>();
    size_t first = sges.size();
    appendSges(v.sg_list, sges);
    wrs.push_back(verbs::RecvWr{
        .wrId = v.wr_id, .sgList = std::span<const verbs::Sge>(sges.data() + first, sges.size() - first)});
  }
  size_t badIndex = 0;
  Status st = qp != nullptr ? qp->postRecv(std::span<const verbs::RecvWr>(wrs), &badIndex)
                            : srq->postRecv(std::span<const verbs::RecvWr>(wrs), &badIndex);
  if (!st.isOk()) raiseWrError(st, qp != nullptr ? "ibv_post_recv" : "ibv_post_srq_recv", badIndex);
}

}  // namespace ferry::python
