// ferry._core.verbs: the verbs layer for Python.
//
// These are the C++ halves of ferry.verbs: device listing, the verbs objects (Context, PD, MR, CQ,
// CompChannel, QP, SRQ, AH) and the work-request structures. ferry.verbs derives its public
// classes from the objects here and adds what is easier to say in Python (paths, events, errors).
// Every object is a context manager; close() closes its children first and is idempotent; a call
// on a closed object raises ferry.Closed.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ferry/common/shared_memory.h"
#include "ferry/devices.h"
#include "status.h"
#include "verbs_objects.h"
#include "verbs_structs.h"

namespace ferry::python {

namespace {
// A GID given as 16 bytes (bytes(IBA.GID)).
verbs::Gid gidFromBytes(const py::bytes& raw, const char* func) {
  std::string text = raw;
  if (text.size() != 16)
    raiseStatus(invalidArgument("a GID is 16 bytes, not " + std::to_string(text.size())), func);
  verbs::Gid g;
  std::memcpy(g.raw.data(), text.data(), 16);
  return g;
}

// ibv_attach_mcast (join) or ibv_detach_mcast on q, without the GIL.
void mcast(QpObject& q, const py::bytes& gid, uint16_t lid, bool join) {
  const char* func = join ? "ibv_attach_mcast" : "ibv_detach_mcast";
  verbs::Gid g = gidFromBytes(gid, func);
  verbs::QueuePair& handle = q.handle();
  Status st;
  {
    py::gil_scoped_release release;
    st = join ? handle.attachMcast(g, lid) : handle.detachMcast(g, lid);
  }
  check(st, func);
}
}  // namespace

namespace {

py::dict ahAttrToDict(const verbs::AhAttr& a) {
  py::dict grh;
  grh["dgid"] = gidBytes(a.dgid);
  grh["flow_label"] = a.flowLabel;
  grh["sgid_index"] = a.sgidIndex;
  grh["hop_limit"] = a.hopLimit;
  grh["traffic_class"] = a.trafficClass;
  py::dict d;
  d["grh"] = grh;
  d["dlid"] = a.dlid;
  d["sl"] = a.sl;
  d["src_path_bits"] = a.srcPathBits;
  d["static_rate"] = a.staticRate;
  d["is_global"] = a.isGlobal;
  d["port_num"] = a.portNum;
  return d;
}

py::dict qpCapToDict(const verbs::QpCap& c) {
  py::dict d;
  for (const QpCapField& f : qpCapFields()) d[f.name] = c.*f.member;
  return d;
}

py::dict qpAttrToDict(const verbs::QpAttr& a) {
  py::dict d;
  for (const QpAttrField& f : qpAttrFields()) {
    if (f.get != nullptr) d[f.name] = f.get(a);
  }
  d["cap"] = qpCapToDict(a.cap);
  d["ah_attr"] = ahAttrToDict(a.ahAttr);
  return d;
}

py::dict deviceAttrToDict(const verbs::DeviceAttr& a) {
  py::dict d;
  d["fw_ver"] = a.fwVer;
  d["node_guid"] = a.nodeGuid;
  d["sys_image_guid"] = a.sysImageGuid;
  d["max_mr_size"] = a.maxMrSize;
  d["page_size_cap"] = a.pageSizeCap;
  d["vendor_id"] = a.vendorId;
  d["vendor_part_id"] = a.vendorPartId;
  d["hw_ver"] = a.hwVer;
  d["max_qp"] = a.maxQp;
  d["max_qp_wr"] = a.maxQpWr;
  d["device_cap_flags"] = a.deviceCapFlags;
  d["max_sge"] = a.maxSge;
  d["max_sge_rd"] = a.maxSgeRd;
  d["max_cq"] = a.maxCq;
  d["max_cqe"] = a.maxCqe;
  d["max_mr"] = a.maxMr;
  d["max_pd"] = a.maxPd;
  d["max_qp_rd_atom"] = a.maxQpRdAtom;
  d["max_qp_init_rd_atom"] = a.maxQpInitRdAtom;
  d["max_srq"] = a.maxSrq;
  d["max_srq_wr"] = a.maxSrqWr;
  d["max_srq_sge"] = a.maxSrqSge;
  d["max_pkeys"] = a.maxPkeys;
  d["phys_port_cnt"] = a.physPortCnt;
  d["max_inline_data"] = a.maxInlineData;
  d["local_ca_ack_delay"] = a.localCaAckDelay;
  d["atomic_cap"] = a.atomicCap;
  return d;
}

py::dict portAttrToDict(const verbs::PortAttr& p) {
  py::dict d;
  d["state"] = static_cast<int>(p.state);
  d["max_mtu"] = static_cast<int>(p.maxMtu);
  d["active_mtu"] = static_cast<int>(p.activeMtu);
  d["gid_tbl_len"] = p.gidTblLen;
  d["port_cap_flags"] = p.portCapFlags;
  d["max_msg_sz"] = p.maxMsgSz;
  d["lid"] = p.lid;
  d["sm_lid"] = p.smLid;
  d["pkey_tbl_len"] = p.pkeyTblLen;
  d["link_layer"] = static_cast<int>(p.linkLayer);
  d["active_speed"] = p.activeSpeed;
  d["active_width"] = p.activeWidth;
  return d;
}

py::dict deviceInfoToDict(const verbs::DeviceInfo& info) {
  py::dict d;
  d["name"] = info.name;
  d["provider"] = info.provider;
  d["transport"] = info.transport;
  d["netdev"] = info.netdev;
  d["address"] = info.address;
  d["guid"] = info.guid;
  d["numa_node"] = info.numaNode;
  d["addressed_by_context"] = info.addressedByContext;
  d["ports"] = info.ports;
  return d;
}

template <typename T>
py::list liveList(ChildSet& set) {
  py::list out;
  for (auto& child : set.live<T>()) out.append(py::cast(child));
  return out;
}

// __enter__ / __exit__ for a class whose close() is idempotent.
template <typename T, typename Holder>
void defContextManager(py::class_<T, Holder>& cls) {
  cls.def("__enter__", [](py::object self) { return self; });
  cls.def("__exit__", [](T& self, py::args) {
    self.close();
    return false;
  });
  cls.def("close", &T::close,
          "Free the verbs handle, after closing the objects created from it. Idempotent.");
  cls.def_property_readonly("closed", &T::closed, "True once close() was called (or a parent was closed).");
}

// Waits up to timeoutSeconds (negative: until one comes) for an async event, in slices with the
// GIL released; returns (type, qp_num, cq, srq, port_num) or None.
py::object getAsyncEvent(ContextObject& ctx, double timeoutSeconds) {
  std::shared_ptr<verbs::ContextImpl> impl = ctx.handle().impl();
  using Clock = std::chrono::steady_clock;
  const bool forever = timeoutSeconds < 0;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(forever ? 0.0 : std::min(timeoutSeconds, 1e9)));
  for (;;) {
    int sliceMs = 100;
    if (!forever) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now())
                      .count();  // rounded up: never short
      sliceMs = static_cast<int>(std::clamp<long long>(left, 0, 100));
    }
    Result<verbs::AsyncEvent> event = [&]() -> Result<verbs::AsyncEvent> {
      if (sliceMs == 0) return impl->getAsyncEvent(0);
      py::gil_scoped_release release;
      return impl->getAsyncEvent(sliceMs);
    }();
    if (event.isOk()) {
      py::object cq = py::none();
      py::object srq = py::none();
      if (event->cqId != nullptr) {
        if (auto found = ctx.findCq(event->cqId)) cq = py::cast(found);
      }
      if (event->srqId != nullptr) {
        if (auto found = ctx.findSrq(event->srqId)) srq = py::cast(found);
      }
      return py::make_tuple(static_cast<int>(event->type), event->qpNum, cq, srq, event->portNum);
    }
    if (event.status().code() != StatusCode::kTimedOut) raiseStatus(event.status(), "ibv_get_async_event");
    if (!forever && Clock::now() >= deadline) return py::none();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace

void bindVerbs(py::module_& m) {
  bindVerbsStructs(m);
  bindVerbsPath(m);

  m.def(
      "list_devices",
      [] {
        py::list out;
        for (auto& info : unwrap(ferry::listDevices(), "ibv_get_device_list"))
          out.append(deviceInfoToDict(info));
        return out;
      },
      "Every visible device (FERRY_DEVICES filters), highest-priority provider first, as dicts.");
  m.def(
      "list_providers",
      [] {
        py::list out;
        for (auto& p : ferry::listProviders()) {
          py::dict d;
          d["name"] = p.name;
          d["priority"] = p.priority;
          d["available"] = p.available;
          d["reason"] = p.reason;
          out.append(d);
        }
        return out;
      },
      "The providers ferry was built with, whether each is usable here, and why not.");

  // ---- Context ----
  py::class_<ContextObject, std::shared_ptr<ContextObject>> context(m, "Context", "An opened verbs device.");
  context.def(py::init([](const std::string& name) { return ContextObject::open(name); }),
              py::arg("device_name"));
  defContextManager(context);
  context
      .def_property_readonly("device_name", &ContextObject::deviceName,
                             "The device's name, as list_devices() gives it.")
      .def("_query_device",
           [](ContextObject& c) {
             return deviceAttrToDict(unwrap(c.handle().queryDevice(), "ibv_query_device"));
           })
      .def(
          "_query_port",
          [](ContextObject& c, int port) {
            if (port < 0 || port > 255)
              raiseStatus(invalidArgument("port number out of range"), "ibv_query_port");
            return portAttrToDict(unwrap(c.handle().queryPort(static_cast<uint8_t>(port)), "ibv_query_port"));
          })
      .def(
          "query_gid",
          [](ContextObject& c, int port, int index) {
            if (port < 0 || port > 255)
              raiseStatus(invalidArgument("port number out of range"), "ibv_query_gid");
            return gidBytes(unwrap(c.handle().queryGid(static_cast<uint8_t>(port), index), "ibv_query_gid"));
          },
          py::arg("port_id"), py::arg("index") = 0, "One GID table entry of a port, as 16 bytes.")
      .def(
          "_default_gid_index",
          [](ContextObject& c, int port) {
            if (port < 0 || port > 255)
              raiseStatus(invalidArgument("port number out of range"), "ibv_query_gid");
            return std::clamp(c.handle().impl()->defaultGidIndex(static_cast<uint8_t>(port)), 0, 255);
          },
          py::arg("port_id"),
          "The GID index a path from this port should use by default (a RoCE v2 GID on RoCE ports).")
      .def_property_readonly(
          "async_fd", [](ContextObject& c) { return c.handle().asyncFd(); },
          "The file descriptor of the device's asynchronous events: readable while an event is queued "
          "(get_async_event() takes it).")
      .def("_get_async_event", &getAsyncEvent, py::arg("timeout"))
      .def("_pds", [](ContextObject& c) { return liveList<PdObject>(c.pds()); })
      .def("_cqs", [](ContextObject& c) { return liveList<CqObject>(c.cqs()); })
      .def("_comp_channels", [](ContextObject& c) { return liveList<CompChannelObject>(c.channels()); });

  // ---- PD ----
  py::class_<PdObject, std::shared_ptr<PdObject>> pd(m, "PD", "A protection domain.");
  pd.def(py::init([](py::object ctx) { return PdObject::create(std::move(ctx)); }), py::arg("ctx"));
  defContextManager(pd);
  pd.def_property_readonly("ctx", &PdObject::ctxObject, "The Context this PD was allocated on.")
      .def("_qps", [](PdObject& p) { return liveList<QpObject>(p.qps()); })
      .def("_mrs", [](PdObject& p) { return liveList<MrObject>(p.mrs()); })
      .def("_ahs", [](PdObject& p) { return liveList<AhObject>(p.ahs()); })
      .def("_srqs", [](PdObject& p) { return liveList<SrqObject>(p.srqs()); });

  // ---- MR ----
  // Memory a same-host peer maps (ferry/common/shared_memory.h), as a writable buffer: NumPy
  // (np.frombuffer) and torch (torch.frombuffer) view it without a copy, and every view keeps it
  // alive.
  py::class_<SharedMemory, std::shared_ptr<SharedMemory>>(m, "SharedMemory", py::buffer_protocol(),
                                                          "Zero-filled memory a same-host peer maps.")
      .def_buffer([](SharedMemory& memory) {
        return py::buffer_info(memory.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(memory.length())}, {py::ssize_t{1}}, false);
      })
      .def("__len__", &SharedMemory::length)
      .def_property_readonly(
          "addr", [](SharedMemory& memory) { return reinterpret_cast<uintptr_t>(memory.data()); },
          "The address of the memory's first byte (int).");
  m.def(
      "alloc_shared",
      [](long long length) {
        if (length <= 0) throw py::value_error("length " + std::to_string(length) + " must be positive");
        return unwrap(SharedMemory::allocate(static_cast<size_t>(length)), "alloc_shared");
      },
      py::arg("length"),
      "Allocates length bytes of zero-filled memory that a same-host peer of the software provider maps "
      "(WRITE and READ on it are then loads and stores). Register it with PD.mr, or use PD.alloc_mr.");

  py::class_<MrObject, std::shared_ptr<MrObject>> mr(m, "MR", "A memory registration over a Python buffer.");
  mr.def(py::init([](py::object pd, py::object buf, uint32_t access) {
           return MrObject::create(std::move(pd), std::move(buf), access);
         }),
         py::arg("pd"), py::arg("buf"), py::arg("access") = 0);
  defContextManager(mr);
  mr.def_property_readonly("pd", &MrObject::pdObject, "The PD this MR is registered in.")
      .def_property_readonly(
          "ctx", [](MrObject& r) { return r.pdObject().cast<PdObject&>().ctxObject(); },
          "The Context of the MR's PD.")
      .def_property_readonly(
          "addr", [](MrObject& r) { return reinterpret_cast<uintptr_t>(r.handle().addr()); },
          "The address of the registered memory's first byte (int).")
      .def_property_readonly(
          "length", [](MrObject& r) { return r.handle().length(); }, "The registered length in bytes.")
      .def_property_readonly(
          "lkey", [](MrObject& r) { return r.handle().lkey(); },
          "The local key: what an sge over this memory carries as its lkey.")
      .def_property_readonly(
          "rkey", [](MrObject& r) { return r.handle().rkey(); },
          "The remote key: what a peer puts in send_wr.rkey to READ, WRITE or do atomics on this memory (as "
          "far as the access flags allow).")
      .def_property_readonly(
          "access", [](MrObject& r) { return r.handle().access(); },
          "The IBV_ACCESS_* flags the memory was registered with, or'ed.")
      .def_property_readonly("buf", &MrObject::buffer, "The registered buffer (None once closed).")
      .def(
          "sge",
          [](MrObject& r, long long length, long long off) {
            verbs::MemoryRegion& h = r.handle();
            long long total = static_cast<long long>(h.length());
            if (off < 0) throw py::value_error("off " + std::to_string(off) + " cannot be negative");
            if (length == -1) length = total - off;
            if (length < 0 || off + length > total) {
              throw py::value_error("length " + std::to_string(length) + " at offset " + std::to_string(off) +
                                    " is outside the MR (" + std::to_string(total) + " bytes)");
            }
            if (length > 0xFFFFFFFFLL) throw py::value_error("an SGE covers at most 4 GiB - 1");
            return SgeValue{.addr = reinterpret_cast<uintptr_t>(h.addr()) + static_cast<uint64_t>(off),
                            .length = static_cast<uint32_t>(length),
                            .lkey = h.lkey()};
          },
          py::arg("length") = -1, py::arg("off") = 0,
          "An sge over length bytes of this MR starting at off (length -1: to the end).");

  // ---- completion channel ----
  py::class_<CompChannelObject, std::shared_ptr<CompChannelObject>> channel(m, "CompChannel",
                                                                            "A completion channel.");
  channel.def(py::init([](py::object ctx) { return CompChannelObject::create(std::move(ctx)); }),
              py::arg("ctx"));
  defContextManager(channel);
  channel
      .def_property_readonly("ctx", &CompChannelObject::ctxObject,
                             "The Context this completion channel was created on.")
      .def(
          "fileno", [](CompChannelObject& c) { return c.handle().fd(); },
          "The file descriptor: readable while CQ events are queued.")
      .def("_get_event", &CompChannelObject::getEvent, py::arg("timeout") = 0.0);

  // ---- CQ ----
  py::class_<CqObject, std::shared_ptr<CqObject>> cq(m, "CQ", "A completion queue.");
  cq.def(py::init([](py::object ctx, int cqe, py::object chan) {
           return CqObject::create(std::move(ctx), cqe, std::move(chan));
         }),
         py::arg("ctx"), py::arg("cqe") = 100, py::arg("comp_chan") = py::none());
  defContextManager(cq);
  cq.def_property_readonly("ctx", &CqObject::ctxObject, "The Context this CQ was created on.")
      .def_property_readonly(
          "comp_chan", &CqObject::channelObject,
          "The CompChannel that reports this CQ's completion events (after req_notify()), or None.")
      .def_readwrite("comp_events", &CqObject::compEvents, "Completion events received for this CQ.")
      .def_property_readonly(
          "cqe", [](CqObject& c) { return c.handle().cqe(); },
          "The number of completions the CQ holds (at least the number asked for; resize() changes it).")
      .def("poll", &CqObject::poll, py::arg("limit") = -1,
           "Perform the poll_cq operation: a list of up to limit work completions (all there are for -1).")
      .def(
          "req_notify",
          [](CqObject& c, bool solicitedOnly) {
            check(c.handle().reqNotify(solicitedOnly), "ibv_req_notify_cq");
          },
          py::arg("solicited_only") = false, "Request event notification for CQEs added to the CQ.")
      .def(
          "resize", [](CqObject& c, int cqes) { check(c.handle().resize(cqes), "ibv_resize_cq"); },
          py::arg("cqes"), "Resize the CQ to have at least cqes entries.");

  // ---- SRQ ----
  py::class_<SrqObject, std::shared_ptr<SrqObject>> srq(m, "SRQ", "A shared receive queue.");
  srq.def(py::init([](py::object pd, uint32_t maxWr, uint32_t maxSge, uint32_t srqLimit) {
            return SrqObject::create(std::move(pd), maxWr, maxSge, srqLimit);
          }),
          py::arg("pd"), py::arg("max_wr") = 100, py::arg("max_sge") = 1, py::arg("srq_limit") = 0);
  defContextManager(srq);
  srq.def_property_readonly("pd", &SrqObject::pdObject, "The PD this SRQ was created in.")
      .def_property_readonly(
          "ctx", [](SrqObject& s) { return s.pdObject().cast<PdObject&>().ctxObject(); },
          "The Context of the SRQ's PD.")
      .def("post_recv", &SrqObject::postRecv, py::arg("wrlist"),
           "wrlist may be a single recv_wr or a list of them.")
      .def(
          "_arm_limit",
          [](SrqObject& s, uint32_t limit) { check(s.handle().armLimit(limit), "ibv_modify_srq"); },
          py::arg("limit"))
      .def("_query", [](SrqObject& s) {
        verbs::SrqInit q = unwrap(s.handle().query(), "ibv_query_srq");
        py::dict d;
        d["max_wr"] = q.maxWr;
        d["max_sge"] = q.maxSge;
        d["srq_limit"] = q.srqLimit;
        return d;
      });

  // ---- AH ----
  py::class_<AhObject, std::shared_ptr<AhObject>> ah(m, "AH", "An address handle.");
  ah.def(py::init([](py::object pd, py::object attr) {
           return AhObject::create(std::move(pd), ahAttrFromPython(attr));
         }),
         py::arg("pd"), py::arg("ah_attr"));
  defContextManager(ah);
  ah.def_property_readonly("pd", &AhObject::pdObject, "The PD this address handle was created in.")
      .def_property_readonly(
          "ctx", [](AhObject& a) { return a.pdObject().cast<PdObject&>().ctxObject(); },
          "The Context of the address handle's PD.")
      .def("_attr", [](AhObject& a) { return ahAttrToDict(a.handle().attr()); });

  // ---- QP ----
  py::class_<QpObject, std::shared_ptr<QpObject>> qp(m, "QP", "A queue pair.");
  qp.def(py::init([](py::object pd, int qpType, py::object sendCq, py::object recvCq, py::object srqObj,
                     uint32_t maxSendWr, uint32_t maxRecvWr, uint32_t maxSendSge, uint32_t maxRecvSge,
                     uint32_t maxInlineData, bool sqSigAll) {
           if (qpType < 0 || qpType > 0xFF) raiseStatus(invalidArgument("unknown QP type"), "ibv_create_qp");
           QpCreateArgs args;
           args.type = static_cast<verbs::QpType>(qpType);
           args.sendCq = std::move(sendCq);
           args.recvCq = std::move(recvCq);
           args.srq = std::move(srqObj);
           args.cap = verbs::QpCap{.maxSendWr = maxSendWr,
                                   .maxRecvWr = maxRecvWr,
                                   .maxSendSge = maxSendSge,
                                   .maxRecvSge = maxRecvSge,
                                   .maxInlineData = maxInlineData};
           args.sqSigAll = sqSigAll;
           return QpObject::create(std::move(pd), std::move(args));
         }),
         py::arg("pd"), py::arg("qp_type"), py::arg("send_cq"), py::arg("recv_cq"), py::arg("srq"),
         py::arg("max_send_wr"), py::arg("max_recv_wr"), py::arg("max_send_sge"), py::arg("max_recv_sge"),
         py::arg("max_inline_data"), py::arg("sq_sig_all"));
  defContextManager(qp);
  qp.def_property_readonly("pd", &QpObject::pdObject, "The PD this QP was created in.")
      .def_property_readonly(
          "ctx", [](QpObject& q) { return q.pdObject().cast<PdObject&>().ctxObject(); },
          "The Context of the QP's PD.")
      .def_property_readonly(
          "qp_num", &QpObject::qpNum,
          "The QP number (24 bits) a peer addresses: the dest_qp_num of a connected peer, a UD send's "
          "remote_qpn.")
      .def_property_readonly(
          "qp_type", [](QpObject& q) { return static_cast<int>(q.type()); },
          "The transport: IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD.")
      .def_property_readonly(
          "max_send_wr", [](QpObject& q) { return q.cap().maxSendWr; },
          "The most work requests outstanding on the send queue, as asked for at creation.")
      .def_property_readonly(
          "max_recv_wr", [](QpObject& q) { return q.cap().maxRecvWr; },
          "The most work requests outstanding on the receive queue, as asked for at creation.")
      .def_property_readonly(
          "max_send_sge", [](QpObject& q) { return q.cap().maxSendSge; },
          "The most sge per send work request, as asked for at creation.")
      .def_property_readonly(
          "max_recv_sge", [](QpObject& q) { return q.cap().maxRecvSge; },
          "The most sge per receive work request, as asked for at creation.")
      .def_property_readonly(
          "max_inline_data", [](QpObject& q) { return q.cap().maxInlineData; },
          "The most bytes a send work request may carry inline (IBV_SEND_INLINE), as asked for at creation.")
      .def_property_readonly(
          "sq_sig_all", &QpObject::sqSigAll,
          "Whether every send work request generates a completion (else only those with IBV_SEND_SIGNALED).")
      .def_property_readonly("_send_cq", &QpObject::sendCqObject)
      .def_property_readonly("_recv_cq", &QpObject::recvCqObject)
      .def_property_readonly("_srq", &QpObject::srqObject)
      .def("_modify", &QpObject::modify, py::arg("attr"), py::arg("mask"))
      .def("_query", [](QpObject& q) { return qpAttrToDict(q.query()); })
      .def("post_send", &QpObject::postSend, py::arg("wrlist"),
           "wrlist may be a single send_wr or a list of them.")
      .def("post_recv", &QpObject::postRecv, py::arg("wrlist"),
           "wrlist may be a single recv_wr or a list of them.")
      .def(
          "_attach_mcast", [](QpObject& q, py::bytes gid, uint16_t lid) { mcast(q, gid, lid, true); },
          py::arg("gid"), py::arg("lid"))
      .def(
          "_detach_mcast", [](QpObject& q, py::bytes gid, uint16_t lid) { mcast(q, gid, lid, false); },
          py::arg("gid"), py::arg("lid"));
}

}  // namespace ferry::python
