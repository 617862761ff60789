// Bindings of sge, send_wr, recv_wr and wc, and the conversions the objects share.
#include "verbs_structs.h"

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "status.h"
#include "verbs_objects.h"

namespace ferry::python {

namespace {

// Keyword (and positional, in field order) construction, repr and equality for a struct class.
// Construction goes through the typed attribute setters, so it checks types exactly as
// assignment does, and an unknown keyword raises AttributeError.
template <typename T>
void defStructProtocol(py::class_<T>& cls, std::vector<std::string> fields) {
  auto names = std::make_shared<std::vector<std::string>>(std::move(fields));
  std::string typeName = py::str(cls.attr("__name__"));
  cls.def(
      py::init([names, typeName](py::args args, py::kwargs kwargs) {
        if (args.size() > names->size()) {
          throw py::type_error(typeName + "() takes at most " + std::to_string(names->size()) +
                               " positional arguments");
        }
        py::object obj = py::cast(T{});
        for (size_t i = 0; i < args.size(); ++i) py::setattr(obj, (*names)[i].c_str(), args[i]);
        for (auto item : kwargs) py::setattr(obj, item.first, item.second);
        return obj.cast<T>();
      }),
      ("Create a " + typeName + "; fields may be given by keyword (or by position in field order).").c_str());
  py::tuple fieldTuple(names->size());
  for (size_t i = 0; i < names->size(); ++i) fieldTuple[i] = py::str((*names)[i]);
  cls.attr("_fields") = fieldTuple;
  cls.def("__repr__", [names, typeName](py::handle self) {
    std::string out = typeName + "(";
    for (size_t i = 0; i < names->size(); ++i) {
      if (i) out += ", ";
      out += (*names)[i] + "=" + std::string(py::repr(self.attr((*names)[i].c_str())));
    }
    return out + ")";
  });
  cls.def("__eq__", [names](py::handle self, py::handle other) -> py::object {
    if (!py::isinstance<T>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    for (const auto& name : *names) {
      if (!self.attr(name.c_str()).equal(other.attr(name.c_str()))) return py::bool_(false);
    }
    return py::bool_(true);
  });
  cls.def("__copy__", [](const T& self) { return T(self); });
  cls.def("__deepcopy__", [](const T& self, py::handle) { return T(self); });
  cls.def("_asdict", [names](py::handle self) {
    py::dict d;
    for (const auto& name : *names) d[name.c_str()] = self.attr(name.c_str());
    return d;
  });
}

template <auto Member>
uint64_t getMember(const verbs::QpAttr& a) {
  return static_cast<uint64_t>(a.*Member);
}

template <auto Member>
void setMember(verbs::QpAttr& a, uint64_t value) {
  a.*Member = static_cast<std::remove_reference_t<decltype(a.*Member)>>(value);
}

// An integer member of QpAttr, accepted up to max.
template <auto Member>
constexpr QpAttrField intField(const char* name, uint32_t mask, uint64_t max) {
  return {name, mask, max, &getMember<Member>, &setMember<Member>};
}
// A member converted on its own (a structure) or one QpAttr has no place for.
constexpr QpAttrField otherField(const char* name, uint32_t mask) {
  return {name, mask, 0, nullptr, nullptr};
}

namespace qp_mask = verbs::qp_attr_mask;
using verbs::QpAttr;

constexpr QpAttrField kQpAttrFields[] = {
    intField<&QpAttr::state>("qp_state", qp_mask::kState, 6),
    intField<&QpAttr::curState>("cur_qp_state", qp_mask::kCurState, 6),
    intField<&QpAttr::pathMtu>("path_mtu", qp_mask::kPathMtu, 0xFF),
    otherField("path_mig_state", qp_mask::kPathMigState),
    intField<&QpAttr::qkey>("qkey", qp_mask::kQkey, 0xFFFFFFFF),
    intField<&QpAttr::rqPsn>("rq_psn", qp_mask::kRqPsn, 0xFFFFFF),
    intField<&QpAttr::sqPsn>("sq_psn", qp_mask::kSqPsn, 0xFFFFFF),
    intField<&QpAttr::destQpNum>("dest_qp_num", qp_mask::kDestQpn, 0xFFFFFF),
    intField<&QpAttr::qpAccessFlags>("qp_access_flags", qp_mask::kAccessFlags, 0xFFFFFFFF),
    otherField("cap", qp_mask::kCap),
    otherField("ah_attr", qp_mask::kAv),
    otherField("alt_ah_attr", qp_mask::kAltPath),
    intField<&QpAttr::pkeyIndex>("pkey_index", qp_mask::kPkeyIndex, 0xFFFF),
    otherField("alt_pkey_index", qp_mask::kAltPath),
    otherField("en_sqd_async_notify", qp_mask::kEnSqdAsyncNotify),
    intField<&QpAttr::sqDraining>("sq_draining", 0, 1),
    intField<&QpAttr::maxRdAtomic>("max_rd_atomic", qp_mask::kMaxQpRdAtomic, 0xFF),
    intField<&QpAttr::maxDestRdAtomic>("max_dest_rd_atomic", qp_mask::kMaxDestRdAtomic, 0xFF),
    intField<&QpAttr::minRnrTimer>("min_rnr_timer", qp_mask::kMinRnrTimer, 0xFF),
    intField<&QpAttr::portNum>("port_num", qp_mask::kPort, 0xFF),
    intField<&QpAttr::timeout>("timeout", qp_mask::kTimeout, 0xFF),
    intField<&QpAttr::retryCnt>("retry_cnt", qp_mask::kRetryCnt, 0xFF),
    intField<&QpAttr::rnrRetry>("rnr_retry", qp_mask::kRnrRetry, 0xFF),
    otherField("alt_port_num", qp_mask::kAltPath),
    otherField("alt_timeout", qp_mask::kAltPath),
};

constexpr QpCapField kQpCapFields[] = {
    {"max_send_wr", &verbs::QpCap::maxSendWr},         {"max_recv_wr", &verbs::QpCap::maxRecvWr},
    {"max_send_sge", &verbs::QpCap::maxSendSge},       {"max_recv_sge", &verbs::QpCap::maxRecvSge},
    {"max_inline_data", &verbs::QpCap::maxInlineData},
};

}  // namespace

std::span<const QpAttrField> qpAttrFields() { return kQpAttrFields; }
std::span<const QpCapField> qpCapFields() { return kQpCapFields; }

py::object makeWc(const verbs::WorkCompletion& wc) {
  WcValue v;
  v.wr_id = wc.wrId;
  v.status = static_cast<int>(wc.status);
  v.opcode = static_cast<int>(wc.opcode);
  v.vendor_err = wc.vendorErr;
  v.byte_len = wc.byteLen;
  v.imm_data = wc.immData;
  v.qp_num = wc.qpNum;
  v.src_qp = wc.srcQp;
  v.wc_flags = wc.wcFlags;
  v.pkey_index = wc.pkeyIndex;
  v.slid = wc.slid;
  v.sl = wc.sl;
  v.dlid_path_bits = wc.dlidPathBits;
  return py::cast(std::move(v));
}

verbs::AhAttr ahAttrFromPython(py::handle attr) {
  auto readInt = [](py::handle obj, const char* name, uint64_t max) -> uint64_t {
    py::object value = obj.attr(name);
    if (!py::isinstance<py::int_>(value)) {
      throw py::type_error(std::string("ah_attr.") + name + " must be an int");
    }
    long long v = value.cast<long long>();
    if (v < 0 || static_cast<uint64_t>(v) > max) {
      throw py::value_error(std::string("ah_attr.") + name + " is out of range (0.." + std::to_string(max) +
                            ")");
    }
    return static_cast<uint64_t>(v);
  };
  verbs::AhAttr out;
  out.isGlobal = py::bool_(attr.attr("is_global"));
  out.dlid = static_cast<uint16_t>(readInt(attr, "dlid", 0xFFFF));
  out.sl = static_cast<uint8_t>(readInt(attr, "sl", 0xFF));
  out.srcPathBits = static_cast<uint8_t>(readInt(attr, "src_path_bits", 0xFF));
  out.staticRate = static_cast<uint8_t>(readInt(attr, "static_rate", 0xFF));
  out.portNum = static_cast<uint8_t>(readInt(attr, "port_num", 0xFF));
  py::object grh = attr.attr("grh");
  if (!grh.is_none()) {
    py::object dgid = grh.attr("dgid");
    if (!dgid.is_none()) {
      py::buffer_info raw = py::buffer(dgid).request();
      if (raw.size * raw.itemsize != 16) throw py::value_error("ah_attr.grh.dgid must be 16 bytes (a GID)");
      std::memcpy(out.dgid.raw.data(), raw.ptr, 16);
    }
    out.flowLabel = static_cast<uint32_t>(readInt(grh, "flow_label", 0xFFFFF));
    out.sgidIndex = static_cast<uint8_t>(readInt(grh, "sgid_index", 0xFF));
    out.hopLimit = static_cast<uint8_t>(readInt(grh, "hop_limit", 0xFF));
    out.trafficClass = static_cast<uint8_t>(readInt(grh, "traffic_class", 0xFF));
  } else if (out.isGlobal) {
    throw py::value_error("ah_attr.is_global is set but ah_attr.grh is None");
  }
  return out;
}

void raiseWrError(const Status& status, const char* func, size_t badIndex) {
  py::object verbsModule = py::module_::import("ferry.verbs");
  py::object error = verbsModule.attr("_make_wr_error")(static_cast<int>(status.code()), status.message(),
                                                        status.cause(), func, badIndex);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

void bindVerbsStructs(py::module_& m) {
  py::list qpAttr;
  for (const QpAttrField& f : qpAttrFields()) qpAttr.append(py::make_tuple(f.name, f.mask));
  // (name, IBV_QP_* bit) of each ibv_qp_attr member, in the struct's order: ferry.verbs.qp_attr's
  // fields and the mask bits their assignment sets.
  m.attr("qp_attr_fields") = py::tuple(qpAttr);

  py::class_<SgeValue> sge(m, "sge", "ibv_sge: length bytes at addr, in the memory region with key lkey.");
  sge.def_readwrite("addr", &SgeValue::addr, "The start address of the buffer (int).")
      .def_readwrite("length", &SgeValue::length, "The buffer's length in bytes (up to 2^32-1).")
      .def_readwrite("lkey", &SgeValue::lkey,
                     "The local key of the memory region that holds the buffer (MR.lkey).");
  defStructProtocol(sge, {"addr", "length", "lkey"});

  py::class_<SendWrValue> sendWr(m, "send_wr",
                                 "ibv_send_wr. sg_list is an sge, a list/tuple of sge, or None; "
                                 "remote_addr/rkey serve RDMA and atomic opcodes, compare_add/swap atomics, "
                                 "ah/remote_qpn/remote_qkey UD sends.");
  sendWr
      .def_readwrite("wr_id", &SendWrValue::wr_id,
                     "A value of the caller's choosing, returned in the completion's wc.wr_id.")
      .def_readwrite(
          "sg_list", &SendWrValue::sg_list,
          "The data to send or write, or where a READ or atomic puts its result: an sge, a list/tuple of "
          "sge, or None (no data).")
      .def_readwrite("opcode", &SendWrValue::opcode,
                     "The operation: IBV_WR_* (IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, ...); 0 is "
                     "IBV_WR_RDMA_WRITE.")
      .def_readwrite(
          "send_flags", &SendWrValue::send_flags,
          "IBV_SEND_* flags, or'ed: SIGNALED (a completion even without sq_sig_all), FENCE, SOLICITED, "
          "INLINE.")
      .def_readwrite(
          "imm_data", &SendWrValue::imm_data,
          "The immediate of IBV_WR_SEND_WITH_IMM and IBV_WR_RDMA_WRITE_WITH_IMM: 32 bits, delivered "
          "unchanged in the receiver's wc.imm_data.")
      .def_readwrite(
          "remote_addr", &SendWrValue::remote_addr,
          "RDMA and atomic opcodes: the peer's address, in the region of rkey (8-byte aligned for atomics).")
      .def_readwrite("rkey", &SendWrValue::rkey,
                     "RDMA and atomic opcodes: the remote key of the peer's region (its MR.rkey).")
      .def_readwrite(
          "compare_add", &SendWrValue::compare_add,
          "Atomics: the value compared (IBV_WR_ATOMIC_CMP_AND_SWP) or added (IBV_WR_ATOMIC_FETCH_AND_ADD); "
          "64 bits.")
      .def_readwrite("swap", &SendWrValue::swap,
                     "IBV_WR_ATOMIC_CMP_AND_SWP: the value written when the comparison matches; 64 bits.")
      .def_readwrite("ah", &SendWrValue::ah, "UD: the AH of the destination (created in the QP's PD).")
      .def_readwrite("remote_qpn", &SendWrValue::remote_qpn, "UD: the destination QP number.")
      .def_readwrite("remote_qkey", &SendWrValue::remote_qkey, "UD: the destination QP's Q_Key.");
  defStructProtocol(sendWr, {"wr_id", "sg_list", "opcode", "send_flags", "imm_data", "remote_addr", "rkey",
                             "compare_add", "swap", "ah", "remote_qpn", "remote_qkey"});

  py::class_<RecvWrValue> recvWr(m, "recv_wr",
                                 "ibv_recv_wr. sg_list is an sge, a list/tuple of sge, or None.");
  recvWr
      .def_readwrite("wr_id", &RecvWrValue::wr_id,
                     "A value of the caller's choosing, returned in the completion's wc.wr_id.")
      .def_readwrite(
          "sg_list", &RecvWrValue::sg_list,
          "Where an incoming message goes: an sge, a list/tuple of sge, or None; on UD its first 40 bytes "
          "take the GRH.");
  defStructProtocol(recvWr, {"wr_id", "sg_list"});

  py::class_<WcValue> wc(m, "wc", "ibv_wc: one work completion.");
  wc.def_readwrite("wr_id", &WcValue::wr_id, "The wr_id of the work request that completed.")
      .def_readwrite(
          "status", &WcValue::status,
          "IBV_WC_SUCCESS, else the IBV_WC_* error; in an error completion only wr_id, status, qp_num and "
          "vendor_err are valid.")
      .def_readwrite("opcode", &WcValue::opcode,
                     "The operation that completed: IBV_WC_* (IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RECV, "
                     "IBV_WC_RECV_RDMA_WITH_IMM, ...).")
      .def_readwrite("vendor_err", &WcValue::vendor_err,
                     "The device's own error syndrome, for an error completion.")
      .def_readwrite(
          "byte_len", &WcValue::byte_len,
          "Bytes received for a receive (including the 40-byte GRH on UD); the bytes transferred for RDMA "
          "READ and atomics.")
      .def_readwrite(
          "imm_data", &WcValue::imm_data,
          "The immediate the sender gave (32 bits, unchanged), valid when wc_flags has IBV_WC_WITH_IMM.")
      .def_readwrite("qp_num", &WcValue::qp_num, "The number of the local QP the work request was posted to.")
      .def_readwrite("src_qp", &WcValue::src_qp, "UD receives: the QP number of the sender.")
      .def_readwrite(
          "wc_flags", &WcValue::wc_flags,
          "IBV_WC_* flags, or'ed: IBV_WC_GRH (the buffer's first 40 bytes hold a GRH), IBV_WC_WITH_IMM "
          "(imm_data is valid).")
      .def_readwrite("pkey_index", &WcValue::pkey_index, "The P_Key index of the receive (GSI QPs only).")
      .def_readwrite("slid", &WcValue::slid, "UD receives: the sender's LID.")
      .def_readwrite("sl", &WcValue::sl, "UD receives: the service level of the message.")
      .def_readwrite("dlid_path_bits", &WcValue::dlid_path_bits,
                     "UD receives: the destination LID's path bits.");
  defStructProtocol(wc, {"wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num",
                         "src_qp", "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits"});
}

}  // namespace ferry::python
