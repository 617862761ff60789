// The verbs binding objects: creation, the close tree and the calls that need more than a line.
#include "verbs_objects.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <span>

#include "ferry/devices.h"
#include "status.h"
#include "verbs_structs.h"

namespace ferry::python {

namespace {

using Clock = std::chrono::steady_clock;

// Longest single wait with the GIL released; between slices pending signals are handled, so a
// long wait still ends promptly on Ctrl-C.
constexpr int kWaitSliceMs = 100;

// Closes a handle with the GIL released around the provider's close (which may wait for the
// device's progress thread), then empties it.
template <typename HandleT>
void closeReleasingGil(HandleT& handle) {
  auto impl = handle.impl();
  if (impl) {
    py::gil_scoped_release release;
    impl->close();
  }
  handle.close();
}

template <typename T>
T& castArg(py::handle obj, const char* expected) {
  if (!py::isinstance<T>(obj)) {
    throw py::type_error(std::string("expected a ") + expected + ", got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  return obj.cast<T&>();
}

// An int attribute of a Python object in [0, max]; TypeError / ValueError otherwise.
uint64_t readField(py::handle obj, const char* name, uint64_t max) {
  py::object value = obj.attr(name);
  if (!py::isinstance<py::int_>(value)) {
    throw py::type_error(std::string("qp_attr.") + name + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))));
  }
  long long v = value.cast<long long>();
  if (v < 0 || static_cast<unsigned long long>(v) > max) {
    throw py::value_error(std::string("qp_attr.") + name + " = " + std::to_string(v) +
                          " is out of range (0.." + std::to_string(max) + ")");
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

void raiseClosed(const char* what, const char* func) {
  raiseStatus(Status(StatusCode::kClosed, std::string(what) + " is closed", EBADF), func);
}

// ---- ChildSet ----

void ChildSet::add(const std::shared_ptr<VerbsObject>& child) {
  // Long-lived parents create many short-lived children: forget the dead ones now and then.
  if (items_.size() >= 64 && items_.size() % 64 == 0) {
    items_.erase(std::remove_if(items_.begin(), items_.end(),
                                [](const std::weak_ptr<VerbsObject>& w) { return w.expired(); }),
                 items_.end());
  }
  items_.push_back(child);
}

void ChildSet::closeAll() {
  std::vector<std::weak_ptr<VerbsObject>> items;
  items.swap(items_);
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    if (auto child = it->lock()) child->close();
  }
}

// ---- Context ----

std::shared_ptr<ContextObject> ContextObject::open(const std::string& deviceName) {
  Result<verbs::Context> opened = [&] {
    py::gil_scoped_release release;
    return ferry::openDevice(deviceName);
  }();
  auto obj = std::make_shared<ContextObject>();
  obj->handle_ = unwrap(std::move(opened), "ibv_open_device");
  obj->deviceName_ = deviceName;
  return obj;
}

void ContextObject::close() {
  if (!handle_.valid()) return;
  pds_.closeAll();
  cqs_.closeAll();
  channels_.closeAll();
  closeReleasingGil(handle_);
}

verbs::Context& ContextObject::handle() {
  if (!handle_.valid()) raiseClosed("the Context");
  return handle_;
}

std::shared_ptr<CqObject> ContextObject::findCq(const void* id) {
  for (auto& cq : cqs_.live<CqObject>()) {
    if (cq->id() == id) return cq;
  }
  return nullptr;
}

std::shared_ptr<SrqObject> ContextObject::findSrq(const void* id) {
  for (auto& pd : pds_.live<PdObject>()) {
    for (auto& srq : pd->srqs().live<SrqObject>()) {
      if (srq->id() == id) return srq;
    }
  }
  return nullptr;
}

// ---- PD ----

std::shared_ptr<PdObject> PdObject::create(py::object ctx) {
  ContextObject& c = castArg<ContextObject>(ctx, "ferry.verbs.Context");
  auto obj = std::make_shared<PdObject>();
  obj->handle_ = unwrap(c.handle().allocPd(), "ibv_alloc_pd");
  obj->ctx_ = std::move(ctx);
  c.pds().add(obj);
  return obj;
}

void PdObject::close() {
  if (!handle_.valid()) return;
  qps_.closeAll();
  ahs_.closeAll();
  srqs_.closeAll();
  mrs_.closeAll();
  closeReleasingGil(handle_);
}

verbs::ProtectionDomain& PdObject::handle() {
  if (!handle_.valid()) raiseClosed("the PD");
  return handle_;
}

bool PdObject::coversLocal(uint64_t addr, uint64_t length, uint32_t lkey) {
  for (auto& mr : mrs_.live<MrObject>()) {
    if (mr->covers(addr, length, lkey)) return true;
  }
  return false;
}

// ---- MR ----

std::shared_ptr<MrObject> MrObject::create(py::object pd, py::object buffer, uint32_t access) {
  PdObject& p = castArg<PdObject>(pd, "ferry.verbs.PD");
  verbs::ProtectionDomain& handle = p.handle();
  const bool writes =
      (access & (verbs::access::kLocalWrite | verbs::access::kRemoteWrite | verbs::access::kRemoteAtomic)) !=
      0;
  auto obj = std::make_shared<MrObject>();
  if (PyObject_GetBuffer(buffer.ptr(), &obj->view_, PyBUF_ANY_CONTIGUOUS | (writes ? PyBUF_WRITABLE : 0)) !=
      0) {
    PyErr_Clear();
    Py_buffer probe;
    if (writes && PyObject_GetBuffer(buffer.ptr(), &probe, PyBUF_ANY_CONTIGUOUS) == 0) {
      PyBuffer_Release(&probe);
      throw py::type_error(
          "a memory region with LOCAL_WRITE, REMOTE_WRITE or REMOTE_ATOMIC access needs a writable buffer; "
          "this one is read-only");
    }
    PyErr_Clear();
    throw py::type_error(
        "expected a contiguous object supporting the buffer protocol (bytes, bytearray, mmap, memoryview, "
        "numpy array)");
  }
  // From here the view is released by the destructor, also when registration fails below.
  obj->hasView_ = true;
  obj->buffer_ = std::move(buffer);
  obj->handle_ = unwrap(handle.registerMemory(obj->view_.buf, static_cast<size_t>(obj->view_.len), access),
                        "ibv_reg_mr");
  obj->pd_ = std::move(pd);
  p.mrs().add(obj);
  return obj;
}

MrObject::~MrObject() { close(); }

void MrObject::close() {
  // Deregistration returns only when no device access can touch the memory any more; only then
  // is the buffer given back to its owner.
  handle_.close();
  if (hasView_) {
    PyBuffer_Release(&view_);
    hasView_ = false;
    buffer_ = py::none();
  }
}

verbs::MemoryRegion& MrObject::handle() {
  if (!handle_.valid()) raiseClosed("the MR");
  return handle_;
}

bool MrObject::covers(uint64_t addr, uint64_t length, uint32_t lkey) const {
  if (!handle_.valid() || handle_.lkey() != lkey) return false;
  uint64_t begin = reinterpret_cast<uintptr_t>(handle_.addr());
  uint64_t end = begin + handle_.length();
  return addr >= begin && addr + length >= addr && addr + length <= end;
}

// ---- completion channel ----

std::shared_ptr<CompChannelObject> CompChannelObject::create(py::object ctx) {
  ContextObject& c = castArg<ContextObject>(ctx, "ferry.verbs.Context");
  auto obj = std::make_shared<CompChannelObject>();
  obj->handle_ = unwrap(c.handle().createCompChannel(), "ibv_create_comp_channel");
  obj->ctx_ = std::move(ctx);
  c.channels().add(obj);
  return obj;
}

void CompChannelObject::close() {
  if (!handle_.valid()) return;
  handle_.close();
}

verbs::CompletionChannel& CompChannelObject::handle() {
  if (!handle_.valid()) raiseClosed("the completion channel");
  return handle_;
}

py::object CompChannelObject::getEvent(double timeoutSeconds) {
  std::shared_ptr<verbs::CompChannelImpl> impl = handle().impl();
  const bool forever = timeoutSeconds < 0;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(forever ? 0.0 : std::min(timeoutSeconds, 1e9)));
  for (;;) {
    int sliceMs = kWaitSliceMs;
    if (!forever) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now())
                      .count();  // rounded up: never short
      sliceMs = static_cast<int>(std::clamp<long long>(left, 0, kWaitSliceMs));
    }
    Result<verbs::CqEvent> event = [&]() -> Result<verbs::CqEvent> {
      if (sliceMs == 0) return impl->getEvent(0);
      py::gil_scoped_release release;
      return impl->getEvent(sliceMs);
    }();
    if (event.isOk()) {
      auto cq = ctx_.cast<ContextObject&>().findCq(event->cqId);
      if (!cq) return py::none();
      return py::cast(cq);
    }
    if (event.status().code() != StatusCode::kTimedOut) raiseStatus(event.status(), "ibv_get_cq_event");
    if (!forever && Clock::now() >= deadline) return py::none();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// ---- CQ ----

std::shared_ptr<CqObject> CqObject::create(py::object ctx, int cqe, py::object channel) {
  ContextObject& c = castArg<ContextObject>(ctx, "ferry.verbs.Context");
  verbs::CompletionChannel* ch = nullptr;
  if (!channel.is_none()) {
    CompChannelObject& cc = castArg<CompChannelObject>(channel, "ferry.verbs.CompChannel or None");
    if (!cc.ctxObject().is(ctx)) {
      raiseStatus(invalidArgument("the completion channel belongs to another Context"), "ibv_create_cq");
    }
    ch = &cc.handle();
  }
  auto obj = std::make_shared<CqObject>();
  obj->handle_ = unwrap(c.handle().createCq(verbs::CqInit{.cqe = cqe, .channel = ch}), "ibv_create_cq");
  obj->id_ = obj->handle_.id();
  obj->ctx_ = std::move(ctx);
  obj->channel_ = std::move(channel);
  c.cqs().add(obj);
  return obj;
}

void CqObject::close() {
  if (!handle_.valid()) return;
  handle_.close();
}

verbs::CompletionQueue& CqObject::handle() {
  if (!handle_.valid()) raiseClosed("the CQ");
  return handle_;
}

py::list CqObject::poll(int limit) {
  verbs::CompletionQueue& cq = handle();
  py::list out;
  std::array<verbs::WorkCompletion, 32> batch;
  while (limit != 0) {
    size_t want = limit < 0 ? batch.size() : std::min<size_t>(batch.size(), static_cast<size_t>(limit));
    int n = unwrap(cq.poll(std::span<verbs::WorkCompletion>(batch.data(), want)), "ibv_poll_cq");
    for (int i = 0; i < n; ++i) out.append(makeWc(batch[i]));
    if (limit > 0) limit -= n;
    if (static_cast<size_t>(n) < want) break;
  }
  return out;
}

// ---- SRQ ----

std::shared_ptr<SrqObject> SrqObject::create(py::object pd, uint32_t maxWr, uint32_t maxSge,
                                             uint32_t srqLimit) {
  PdObject& p = castArg<PdObject>(pd, "ferry.verbs.PD");
  auto obj = std::make_shared<SrqObject>();
  obj->handle_ =
      unwrap(p.handle().createSrq(verbs::SrqInit{.maxWr = maxWr, .maxSge = maxSge, .srqLimit = srqLimit}),
             "ibv_create_srq");
  obj->id_ = obj->handle_.id();
  obj->maxSge_ = maxSge;
  obj->pd_ = std::move(pd);
  p.srqs().add(obj);
  return obj;
}

void SrqObject::close() {
  if (!handle_.valid()) return;
  handle_.close();
}

verbs::SharedReceiveQueue& SrqObject::handle() {
  if (!handle_.valid()) raiseClosed("the SRQ");
  return handle_;
}

void SrqObject::postRecv(py::handle wrs) { postRecvList(nullptr, &handle(), wrs); }

// ---- AH ----

std::shared_ptr<AhObject> AhObject::create(py::object pd, const verbs::AhAttr& attr) {
  PdObject& p = castArg<PdObject>(pd, "ferry.verbs.PD");
  auto obj = std::make_shared<AhObject>();
  obj->handle_ = unwrap(p.handle().createAh(attr), "ibv_create_ah");
  obj->pd_ = std::move(pd);
  p.ahs().add(obj);
  return obj;
}

void AhObject::close() {
  if (!handle_.valid()) return;
  handle_.close();
}

verbs::AddressHandle& AhObject::handle() {
  if (!handle_.valid()) raiseClosed("the AH");
  return handle_;
}

// ---- QP ----

std::shared_ptr<QpObject> QpObject::create(py::object pd, QpCreateArgs args) {
  PdObject& p = castArg<PdObject>(pd, "ferry.verbs.PD");
  CqObject& sendCq = castArg<CqObject>(args.sendCq, "ferry.verbs.CQ for send_cq");
  CqObject& recvCq = castArg<CqObject>(args.recvCq, "ferry.verbs.CQ for recv_cq");
  verbs::QpInit init{.type = args.type,
                     .sendCq = &sendCq.handle(),
                     .recvCq = &recvCq.handle(),
                     .srq = nullptr,
                     .cap = args.cap,
                     .sqSigAll = args.sqSigAll};
  if (!args.srq.is_none()) init.srq = &castArg<SrqObject>(args.srq, "ferry.verbs.SRQ or None").handle();
  auto obj = std::make_shared<QpObject>();
  obj->handle_ = unwrap(p.handle().createQp(init), "ibv_create_qp");
  obj->qpNum_ = obj->handle_.qpNum();
  obj->type_ = obj->handle_.type();
  obj->cap_ = args.cap;
  obj->sqSigAll_ = args.sqSigAll;
  obj->pd_ = std::move(pd);
  obj->sendCq_ = std::move(args.sendCq);
  obj->recvCq_ = std::move(args.recvCq);
  obj->srq_ = std::move(args.srq);
  p.qps().add(obj);
  return obj;
}

void QpObject::close() {
  if (!handle_.valid()) return;
  closeReleasingGil(handle_);
}

verbs::QueuePair& QpObject::handle() {
  if (!handle_.valid()) raiseClosed("the QP");
  return handle_;
}

void QpObject::modify(py::handle attr, uint32_t mask) {
  namespace m = verbs::qp_attr_mask;
  mayBeInReset_ = true;  // the next post_recv looks again (a modify may return the QP to RESET)
  std::shared_ptr<verbs::QpImpl> impl = handle().impl();
  if (mask & m::kAltPath) {
    raiseStatus(notSupported("alternate paths (IBV_QP_ALT_PATH) are not offered by ferry's devices"),
                "ibv_modify_qp");
  }
  verbs::QpAttr a;
  for (const QpAttrField& f : qpAttrFields()) {
    if (f.set != nullptr && (mask & f.mask) != 0) f.set(a, readField(attr, f.name, f.max));
  }
  if (mask & m::kAv) a.ahAttr = ahAttrFromPython(attr.attr("ah_attr"));
  if (mask & m::kCap) {
    py::object cap = attr.attr("cap");
    for (const QpCapField& f : qpCapFields()) {
      a.cap.*f.member = static_cast<uint32_t>(readField(cap, f.name, 0xFFFFFFFF));
    }
  }
  Status status;
  {
    py::gil_scoped_release release;
    status = impl->modify(a, mask);
  }
  check(status, "ibv_modify_qp");
}

verbs::QpAttr QpObject::query() { return unwrap(handle().query(), "ibv_query_qp"); }

void QpObject::postSend(py::handle wrs) { postSendList(*this, wrs); }

void QpObject::postRecv(py::handle wrs) {
  // The verbs document posts receives before establish() ("Post receive work requests to qp
  // here"), as drivers that take receives in RESET allow. A QP still in RESET (and not on an SRQ)
  // first moves to INIT on port 1, P_Key index 0; establish() / modify_to_init() then set the
  // path's own values with INIT -> INIT. Everything else (an SRQ, a full queue, ERR) is the
  // provider's to refuse.
  verbs::QueuePair& qp = handle();
  // Only a new QP, or one modified since, can be in RESET: no query on every post.
  if (mayBeInReset_) {
    Result<verbs::QpAttr> now = qp.query();
    mayBeInReset_ = now.isOk() && now->state == verbs::QpState::kReset;
  }
  if (mayBeInReset_ && (!srq_ || srq_.is_none())) {
    namespace m = verbs::qp_attr_mask;
    verbs::QpAttr init;
    init.state = verbs::QpState::kInit;
    init.pkeyIndex = 0;
    init.portNum = 1;
    uint32_t mask = m::kState | m::kPkeyIndex | m::kPort;
    if (qp.type() == verbs::QpType::kUd) {
      init.qkey = 0;
      mask |= m::kQkey;
    } else {
      init.qpAccessFlags = 0;
      mask |= m::kAccessFlags;
    }
    check(qp.modify(init, mask), "ibv_modify_qp");
  }
  postRecvList(&qp, nullptr, wrs);
}

}  // namespace ferry::python
