// The verbs objects as Python sees them (ferry._core.verbs): one binding class per verbs handle.
//
// Each object owns its ferry::verbs handle and keeps its Python parent alive (a PD holds its
// Context, an MR its PD, a QP its PD, CQs and SRQ), so a child can always name its parent. Parents
// hold their children weakly and close them first: closing a Context closes its PDs (and through
// them QPs, AHs, SRQs and MRs), CQs and completion channels. close() is idempotent; a call on a
// closed object raises ferry.Closed (a SysError when it stands for a verbs call).
//
// Threads: all state here is guarded by the GIL. Calls that can wait (QP modify and close, which
// run on the device's progress thread; context close; event waits) release the GIL around the
// provider call only, through a local reference to the provider object, so a concurrent close()
// from another Python thread makes them fail with kClosed rather than race.
//
// The Python classes of ferry.verbs derive from these and add the parts written in Python.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/verbs/verbs.h"

namespace ferry::python {

namespace py = pybind11;

// Base of every binding object: a node of the close tree.
class VerbsObject {
 public:
  virtual ~VerbsObject() = default;
  // Closes the children first, then the handle. Idempotent. GIL held.
  virtual void close() = 0;
  virtual bool closed() const = 0;
};

// Children of a binding object, held weakly, closed newest first.
class ChildSet {
 public:
  void add(const std::shared_ptr<VerbsObject>& child);
  void closeAll();
  // Live children (dead or closed entries are dropped on the way).
  template <typename T>
  std::vector<std::shared_ptr<T>> live() {
    std::vector<std::shared_ptr<T>> out;
    std::vector<std::weak_ptr<VerbsObject>> kept;
    for (auto& weak : items_) {
      auto strong = weak.lock();
      if (!strong || strong->closed()) continue;
      kept.push_back(weak);
      if (auto typed = std::dynamic_pointer_cast<T>(strong)) out.push_back(std::move(typed));
    }
    items_.swap(kept);
    return out;
  }

 private:
  std::vector<std::weak_ptr<VerbsObject>> items_;
};

class PdObject;
class CqObject;
class SrqObject;
class QpObject;
class MrObject;

// Raises ferry.Closed for an object used after close().
[[noreturn]] void raiseClosed(const char* what, const char* func = nullptr);

class ContextObject final : public VerbsObject, public std::enable_shared_from_this<ContextObject> {
 public:
  static std::shared_ptr<ContextObject> open(const std::string& deviceName);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::Context& handle();  // raises Closed when closed
  const std::string& deviceName() const { return deviceName_; }
  ChildSet& pds() { return pds_; }
  ChildSet& cqs() { return cqs_; }
  ChildSet& channels() { return channels_; }
  std::shared_ptr<CqObject> findCq(const void* id);
  std::shared_ptr<SrqObject> findSrq(const void* id);

 private:
  verbs::Context handle_;
  std::string deviceName_;
  ChildSet pds_;
  ChildSet cqs_;
  ChildSet channels_;
};

class PdObject final : public VerbsObject, public std::enable_shared_from_this<PdObject> {
 public:
  static std::shared_ptr<PdObject> create(py::object ctx);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::ProtectionDomain& handle();
  const py::object& ctxObject() const { return ctx_; }
  ContextObject& context() { return ctx_.cast<ContextObject&>(); }
  ChildSet& qps() { return qps_; }
  ChildSet& ahs() { return ahs_; }
  ChildSet& srqs() { return srqs_; }
  ChildSet& mrs() { return mrs_; }
  // Whether [addr, addr+length) lies inside an open region of this PD whose lkey is `lkey`.
  bool coversLocal(uint64_t addr, uint64_t length, uint32_t lkey);

 private:
  py::object ctx_;
  verbs::ProtectionDomain handle_;
  ChildSet qps_;
  ChildSet ahs_;
  ChildSet srqs_;
  ChildSet mrs_;
};

class MrObject final : public VerbsObject {
 public:
  static std::shared_ptr<MrObject> create(py::object pd, py::object buffer, uint32_t access);
  ~MrObject() override;
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::MemoryRegion& handle();
  const py::object& pdObject() const { return pd_; }
  py::object buffer() const { return buffer_; }
  // Open region of this MR covering [addr, addr+length) under lkey (no exception when closed).
  bool covers(uint64_t addr, uint64_t length, uint32_t lkey) const;

 private:
  py::object pd_;
  py::object buffer_;
  Py_buffer view_{};
  bool hasView_ = false;
  verbs::MemoryRegion handle_;
};

class CompChannelObject final : public VerbsObject, public std::enable_shared_from_this<CompChannelObject> {
 public:
  static std::shared_ptr<CompChannelObject> create(py::object ctx);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::CompletionChannel& handle();
  const py::object& ctxObject() const { return ctx_; }
  // Takes one CQ event, waiting up to timeoutSeconds (0: do not wait; negative: until one comes).
  // Returns the CQ it names, or None when no event came (or its CQ is gone).
  py::object getEvent(double timeoutSeconds);

 private:
  py::object ctx_;
  verbs::CompletionChannel handle_;
};

class CqObject final : public VerbsObject, public std::enable_shared_from_this<CqObject> {
 public:
  static std::shared_ptr<CqObject> create(py::object ctx, int cqe, py::object channel);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::CompletionQueue& handle();
  const py::object& ctxObject() const { return ctx_; }
  const py::object& channelObject() const { return channel_; }
  const void* id() const { return id_; }
  py::list poll(int limit);

  int compEvents = 0;

 private:
  py::object ctx_;
  py::object channel_;
  verbs::CompletionQueue handle_;
  const void* id_ = nullptr;
};

class SrqObject final : public VerbsObject, public std::enable_shared_from_this<SrqObject> {
 public:
  static std::shared_ptr<SrqObject> create(py::object pd, uint32_t maxWr, uint32_t maxSge, uint32_t srqLimit);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::SharedReceiveQueue& handle();
  const py::object& pdObject() const { return pd_; }
  const void* id() const { return id_; }
  uint32_t maxSge() const { return maxSge_; }
  void postRecv(py::handle wrs);

 private:
  py::object pd_;
  verbs::SharedReceiveQueue handle_;
  const void* id_ = nullptr;
  uint32_t maxSge_ = 1;
};

class AhObject final : public VerbsObject {
 public:
  static std::shared_ptr<AhObject> create(py::object pd, const verbs::AhAttr& attr);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::AddressHandle& handle();
  const py::object& pdObject() const { return pd_; }
  // AddressHandle::id(), nullptr when closed.
  const void* id() const { return handle_.valid() ? handle_.id() : nullptr; }

 private:
  py::object pd_;
  verbs::AddressHandle handle_;
};

struct QpCreateArgs {
  verbs::QpType type = verbs::QpType::kRc;
  py::object sendCq;
  py::object recvCq;
  py::object srq;
  verbs::QpCap cap;
  bool sqSigAll = true;
};

class QpObject final : public VerbsObject, public std::enable_shared_from_this<QpObject> {
 public:
  static std::shared_ptr<QpObject> create(py::object pd, QpCreateArgs args);
  void close() override;
  bool closed() const override { return !handle_.valid(); }

  verbs::QueuePair& handle();
  const py::object& pdObject() const { return pd_; }
  const py::object& sendCqObject() const { return sendCq_; }
  const py::object& recvCqObject() const { return recvCq_; }
  const py::object& srqObject() const { return srq_; }
  uint32_t qpNum() const { return qpNum_; }
  verbs::QpType type() const { return type_; }
  const verbs::QpCap& cap() const { return cap_; }
  bool sqSigAll() const { return sqSigAll_; }

  // ibv_modify_qp from a ferry.verbs.qp_attr (ah_attr already an ah_attr) and a mask.
  void modify(py::handle attr, uint32_t mask);
  verbs::QpAttr query();
  void postSend(py::handle wrs);
  void postRecv(py::handle wrs);

 private:
  py::object pd_;
  py::object sendCq_;
  py::object recvCq_;
  py::object srq_;
  verbs::QueuePair handle_;
  verbs::QpCap cap_;
  verbs::QpType type_ = verbs::QpType::kRc;
  bool sqSigAll_ = true;
  uint32_t qpNum_ = 0;
  bool mayBeInReset_ = true;  // see postRecv(): cleared once the QP was seen past RESET
};

// Struct bindings and conversions (verbs_structs.cc).
void bindVerbsStructs(py::module_& m);

// One member of ibv_qp_attr: its name (the field of ferry.verbs.qp_attr), the IBV_QP_* bit that
// makes ibv_modify_qp apply it (0 for sq_draining, which only ibv_query_qp reports) and, for the
// integer members that verbs::QpAttr holds, the largest value modify takes and how to read and
// write it. The others have no get or set: ah_attr and cap, structures converted on their own, and
// the members QpAttr has no place for (the alternate path, path_mig_state, en_sqd_async_notify).
struct QpAttrField {
  const char* name;
  uint32_t mask;
  uint64_t max;
  uint64_t (*get)(const verbs::QpAttr&);
  void (*set)(verbs::QpAttr&, uint64_t);
};
// Every member of ibv_qp_attr, in the struct's order: the one list that QP.modify, QP.query and
// ferry.verbs.qp_attr (through ferry._core.verbs.qp_attr_fields) read.
std::span<const QpAttrField> qpAttrFields();

// One member of ibv_qp_cap (all are uint32_t).
struct QpCapField {
  const char* name;
  uint32_t verbs::QpCap::*member;
};
// Every member of ibv_qp_cap, in the struct's order.
std::span<const QpCapField> qpCapFields();

// Reads a ferry.verbs.ah_attr (with its grh) into an AhAttr.
verbs::AhAttr ahAttrFromPython(py::handle attr);
// Raises ferry.verbs.WRError for a refused work request.
[[noreturn]] void raiseWrError(const Status& status, const char* func, size_t badIndex);
// Builds the provider work requests for a list of send_wr / recv_wr objects (verbs_post.cc).
void postSendList(QpObject& qp, py::handle wrs);
void postRecvList(verbs::QueuePair* qp, verbs::SharedReceiveQueue* srq, py::handle wrs);
// ferry.verbs.wc objects for completions.
py::object makeWc(const verbs::WorkCompletion& wc);

// A GID's 16 bytes as Python bytes.
inline py::bytes gidBytes(const verbs::Gid& gid) {
  return py::bytes(reinterpret_cast<const char*>(gid.raw.data()), gid.raw.size());
}
// The path codec bindings (verbs_path.cc).
void bindVerbsPath(py::module_& m);

}  // namespace ferry::python
