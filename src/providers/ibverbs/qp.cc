#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "providers/ibverbs/ibverbs.h"

namespace ferry::ibverbs {

static_assert(static_cast<int>(verbs::QpType::kRc) == IBV_QPT_RC);
static_assert(static_cast<int>(verbs::QpType::kUd) == IBV_QPT_UD);
static_assert(static_cast<int>(verbs::QpType::kUc) == IBV_QPT_UC);
static_assert(static_cast<int>(verbs::QpState::kErr) == IBV_QPS_ERR);
static_assert(static_cast<int>(verbs::WrOpcode::kRdmaWrite) == IBV_WR_RDMA_WRITE);
static_assert(static_cast<int>(verbs::WrOpcode::kSendWithImm) == IBV_WR_SEND_WITH_IMM);
static_assert(static_cast<int>(verbs::WrOpcode::kAtomicFetchAndAdd) == IBV_WR_ATOMIC_FETCH_AND_ADD);
static_assert(verbs::send_flags::kFence == IBV_SEND_FENCE &&
              verbs::send_flags::kSignaled == IBV_SEND_SIGNALED &&
              verbs::send_flags::kSolicited == IBV_SEND_SOLICITED &&
              verbs::send_flags::kInline == IBV_SEND_INLINE);
static_assert(verbs::qp_attr_mask::kState == IBV_QP_STATE && verbs::qp_attr_mask::kAv == IBV_QP_AV &&
              verbs::qp_attr_mask::kMaxDestRdAtomic == IBV_QP_MAX_DEST_RD_ATOMIC &&
              verbs::qp_attr_mask::kDestQpn == IBV_QP_DEST_QPN);

namespace {

namespace m = verbs::qp_attr_mask;
using verbs::QpState;
using verbs::WrOpcode;

// Every attribute ibv_query_qp can return.
constexpr int kQueryAll = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY | IBV_QP_ACCESS_FLAGS |
                          IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU |
                          IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ALT_PATH | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_DEST_QPN;

ibv_sge toIbv(const verbs::Sge& sge) {
  return ibv_sge{.addr = sge.addr, .length = sge.length, .lkey = sge.lkey};
}

ibv_qp_cap toIbv(const verbs::QpCap& cap) {
  return ibv_qp_cap{.max_send_wr = cap.maxSendWr,
                    .max_recv_wr = cap.maxRecvWr,
                    .max_send_sge = cap.maxSendSge,
                    .max_recv_sge = cap.maxRecvSge,
                    .max_inline_data = cap.maxInlineData};
}

verbs::QpCap fromIbv(const ibv_qp_cap& cap) {
  return verbs::QpCap{.maxSendWr = cap.max_send_wr,
                      .maxRecvWr = cap.max_recv_wr,
                      .maxSendSge = cap.max_send_sge,
                      .maxRecvSge = cap.max_recv_sge,
                      .maxInlineData = cap.max_inline_data};
}

}  // namespace

ibv_recv_wr* buildRecvChain(std::span<const verbs::RecvWr> wrs) {
  if (wrs.empty()) return nullptr;
  size_t sgeCount = 0;
  for (const auto& wr : wrs) sgeCount += wr.sgList.size();
  thread_local std::vector<ibv_recv_wr> chain;
  thread_local std::vector<ibv_sge> sges;
  chain.assign(wrs.size(), ibv_recv_wr{});
  sges.resize(sgeCount);
  size_t at = 0;
  for (size_t i = 0; i < wrs.size(); ++i) {
    ibv_recv_wr& w = chain[i];
    w.wr_id = wrs[i].wrId;
    w.next = i + 1 < wrs.size() ? &chain[i + 1] : nullptr;
    w.sg_list = sges.data() + at;
    w.num_sge = static_cast<int>(wrs[i].sgList.size());
    for (const verbs::Sge& s : wrs[i].sgList) sges[at++] = toIbv(s);
  }
  return chain.data();
}

namespace {

// The index of `bad` in chain (0 when libibverbs named none).
template <typename Wr>
size_t indexOf(const std::vector<Wr>& chain, const Wr* bad) {
  if (bad == nullptr || bad < chain.data() || bad >= chain.data() + chain.size()) return 0;
  return static_cast<size_t>(bad - chain.data());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation (a PD call: the QP belongs to the PD).

Result<std::shared_ptr<verbs::QpImpl>> IbvPd::createQp(const verbs::QpInitImpl& init) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("create QP: the PD is closed");
  auto sendCq = std::dynamic_pointer_cast<IbvCq>(init.sendCq);
  auto recvCq = std::dynamic_pointer_cast<IbvCq>(init.recvCq);
  if (!sendCq || !recvCq) return invalidArgument("create QP: CQs of another provider");
  // A CQ handle of another context would name an unrelated object of this one in the kernel.
  if (sendCq->context() != ctx_.get() || recvCq->context() != ctx_.get()) {
    return invalidArgument("create QP: a CQ belongs to another context");
  }
  std::shared_ptr<IbvSrq> srq;
  if (init.srq) {
    srq = std::dynamic_pointer_cast<IbvSrq>(init.srq);
    if (!srq) return invalidArgument("create QP: SRQ of another provider");
    if (srq->pd()->ctx() != ctx_) return invalidArgument("create QP: the SRQ belongs to another context");
  }
  // The CQs and the SRQ stay open while the QP is created on them.
  auto sendLock = sendCq->use();
  std::shared_lock<std::shared_mutex> recvLock;
  if (recvCq != sendCq) recvLock = recvCq->use();
  std::shared_lock<std::shared_mutex> srqLock;
  if (srq) srqLock = srq->use();
  if (sendCq->closed() || recvCq->closed()) return closedError("create QP: a CQ is closed");
  if (srq && srq->closed()) return closedError("create QP: the SRQ is closed");

  ibv_qp_init_attr attr{};
  attr.send_cq = sendCq->raw();
  attr.recv_cq = recvCq->raw();
  attr.srq = srq ? srq->raw() : nullptr;
  attr.cap = toIbv(init.cap);
  attr.qp_type = static_cast<ibv_qp_type>(init.type);
  attr.sq_sig_all = init.sqSigAll ? 1 : 0;
  ibv_qp* raw = ctx_->api().createQp(pd_, &attr);
  if (raw == nullptr) return verbsError("ibv_create_qp", errnoOf(-1));
  srqLock = {};
  recvLock = {};
  sendLock = {};
  auto qp = std::make_shared<IbvQp>(shared_from_this(), std::move(sendCq), std::move(recvCq), std::move(srq),
                                    raw, init.type, fromIbv(attr.cap));  // what the device granted
  children_.add(qp);
  return std::shared_ptr<verbs::QpImpl>(qp);
}

IbvQp::IbvQp(std::shared_ptr<IbvPd> pd, std::shared_ptr<IbvCq> sendCq, std::shared_ptr<IbvCq> recvCq,
             std::shared_ptr<IbvSrq> srq, ibv_qp* qp, verbs::QpType type, verbs::QpCap cap)
    : pd_(std::move(pd)),
      sendCq_(std::move(sendCq)),
      recvCq_(std::move(recvCq)),
      srq_(std::move(srq)),
      qp_(qp),
      qpn_(qp->qp_num),
      type_(type),
      cap_(cap) {}

void IbvQp::close() {
  std::shared_ptr<IbvCq> sendCq, recvCq;
  std::shared_ptr<IbvSrq> srq;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    const auto& ctx = pd_->ctx();
    for (const auto& group : groups_) {
      ibv_gid g{};
      std::memcpy(g.raw, group.first.data(), sizeof g.raw);
      const uint16_t lid = group.second;
      (void)ctx->destroyWhileOpen([&] { return ctx->api().detachMcast(qp_, &g, lid); });
    }
    groups_.clear();
    if (int rc = ctx->destroyWhileOpen([&] { return ctx->api().destroyQp(qp_); }); rc != 0) {
      FERRY_LOG(kWarn, "%s: ibv_destroy_qp(%u) failed: %s", ctx->info().name.c_str(), qpn_,
                std::strerror(errnoOf(rc)));
    }
    qp_ = nullptr;
    sendCq = std::move(sendCq_);
    recvCq = std::move(recvCq_);
    srq = std::move(srq_);
  }
  // A CQ or SRQ closed while this QP used it is destroyed now, if this was its last user.
  for (auto* cq : {&sendCq, &recvCq}) {
    if (*cq && (*cq)->closed()) (*cq)->close();
  }
  if (srq && srq->closed()) srq->close();
}

// ---------------------------------------------------------------------------------------------
// State.

Status IbvQp::modify(const verbs::QpAttr& attr, uint32_t mask) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("modify QP: the QP is closed");
  ibv_qp_attr a{};
  a.qp_state = static_cast<ibv_qp_state>(attr.state);
  a.cur_qp_state = static_cast<ibv_qp_state>(attr.curState);
  a.path_mtu = static_cast<ibv_mtu>(attr.pathMtu);
  a.qkey = attr.qkey;
  a.rq_psn = attr.rqPsn;
  a.sq_psn = attr.sqPsn;
  a.dest_qp_num = attr.destQpNum;
  a.qp_access_flags = static_cast<unsigned int>(attr.qpAccessFlags);
  a.cap = toIbv(attr.cap);
  a.ah_attr = toIbvAh(attr.ahAttr);
  a.pkey_index = attr.pkeyIndex;
  a.max_rd_atomic = attr.maxRdAtomic;
  a.max_dest_rd_atomic = attr.maxDestRdAtomic;
  a.min_rnr_timer = attr.minRnrTimer;
  a.port_num = attr.portNum;
  a.timeout = attr.timeout;
  a.retry_cnt = attr.retryCnt;
  a.rnr_retry = attr.rnrRetry;
  if (int rc = pd_->ctx()->api().modifyQp(qp_, &a, static_cast<int>(mask)); rc != 0) {
    std::string what = "ibv_modify_qp";
    if (mask & m::kState) what += std::string(" to ") + verbs::qpStateName(attr.state);
    return verbsError(what, errnoOf(rc));
  }
  if (mask & m::kState) state_ = attr.state;
  if (mask & m::kPort) port_ = attr.portNum;
  return Status::ok();
}

Result<verbs::QpAttr> IbvQp::query() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("query QP: the QP is closed");
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (int rc = pd_->ctx()->api().queryQp(qp_, &a, kQueryAll, &init); rc != 0) {
    return verbsError("ibv_query_qp", errnoOf(rc));
  }
  verbs::QpAttr q;
  q.state = static_cast<QpState>(a.qp_state);
  q.curState = static_cast<QpState>(a.cur_qp_state);
  q.pathMtu = static_cast<verbs::Mtu>(a.path_mtu);
  q.qkey = a.qkey;
  q.rqPsn = a.rq_psn;
  q.sqPsn = a.sq_psn;
  q.destQpNum = a.dest_qp_num;
  q.qpAccessFlags = a.qp_access_flags;
  q.cap = fromIbv(a.cap);
  q.ahAttr = fromIbvAh(a.ah_attr);
  q.pkeyIndex = a.pkey_index;
  q.maxRdAtomic = a.max_rd_atomic;
  q.maxDestRdAtomic = a.max_dest_rd_atomic;
  q.minRnrTimer = a.min_rnr_timer;
  q.portNum = a.port_num;
  q.timeout = a.timeout;
  q.retryCnt = a.retry_cnt;
  q.rnrRetry = a.rnr_retry;
  q.sqDraining = a.sq_draining != 0;
  return q;
}

// ---------------------------------------------------------------------------------------------
// Posting.

Status IbvQp::postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) {
  auto refuse = [&](size_t index, Status status) {
    if (badIndex) *badIndex = index;
    return status;
  };
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return refuse(0, closedError("post send: the QP is closed"));
  if (sendCq_->closed()) return refuse(0, closedError("post send: the QP's send CQ is closed"));
  // Refused here rather than by the device: some providers (rxe) queue a request posted before RTS
  // and carry it out once the QP gets there.
  const QpState state = state_.load();
  if (state == QpState::kReset || state == QpState::kInit || state == QpState::kRtr) {
    return refuse(0, invalidArgument(std::string("post send: the QP is in ") + verbs::qpStateName(state)));
  }
  if (wrs.empty()) return Status::ok();

  size_t sgeCount = 0;
  for (const auto& wr : wrs) sgeCount += wr.sgList.size();
  thread_local std::vector<ibv_send_wr> chain;
  thread_local std::vector<ibv_sge> sges;
  chain.assign(wrs.size(), ibv_send_wr{});
  sges.resize(sgeCount);
  // UD requests name an address handle of this QP's PD; each stays held until the post is done.
  HeldAhs held;
  const uint32_t mtu = type_ == verbs::QpType::kUd ? pd_->ctx()->activeMtuBytes(port_.load()) : 0;

  // Translates up to the first request ferry refuses; the ones before it are posted either way.
  size_t count = 0;
  Status refused;
  for (size_t at = 0; count < wrs.size(); ++count) {
    refused = translate(wrs[count], &chain[count], sges.data() + at, mtu, &held);
    if (!refused.isOk()) break;
    at += wrs[count].sgList.size();
  }
  if (count > 0) {
    chain[count - 1].next = nullptr;
    for (size_t i = 0; i + 1 < count; ++i) chain[i].next = &chain[i + 1];
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, chain.data(), &bad); rc != 0) {
      return refuse(indexOf(chain, bad), verbsError("ibv_post_send", errnoOf(rc)));
    }
  }
  if (!refused.isOk()) return refuse(count, refused);
  return Status::ok();
}

Status IbvQp::translate(const verbs::SendWr& wr, ibv_send_wr* w, ibv_sge* sges, uint32_t mtu, HeldAhs* held) {
  w->wr_id = wr.wrId;
  w->sg_list = sges;
  w->num_sge = static_cast<int>(wr.sgList.size());
  uint64_t length = 0;
  for (const verbs::Sge& s : wr.sgList) {
    *sges++ = toIbv(s);
    length += s.length;
  }
  w->opcode = static_cast<ibv_wr_opcode>(wr.opcode);
  w->send_flags = wr.sendFlags;
  // The sender's 32 bits, unchanged: the receiver's completion holds the same ones.
  w->imm_data = wr.immData;
  if (type_ == verbs::QpType::kUd) {
    if (mtu != 0 && length > mtu) {
      return invalidArgument("post send: a UD message of " + std::to_string(length) +
                             " bytes exceeds the path MTU of " + std::to_string(mtu));
    }
    std::shared_ptr<IbvAh> ah = pd_->findAh(wr.ud.ah);
    ibv_ah* rawAh = nullptr;
    std::shared_lock<std::shared_mutex> ahLock;
    if (ah) ahLock = ah->use(&rawAh);
    if (rawAh == nullptr)
      return invalidArgument("post send: the address handle is not a live one of this QP's PD");
    w->wr.ud.ah = rawAh;
    w->wr.ud.remote_qpn = wr.ud.remoteQpn;
    w->wr.ud.remote_qkey = wr.ud.remoteQkey;
    held->emplace_back(std::move(ah), std::move(ahLock));
  } else if (wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd) {
    w->wr.atomic.remote_addr = wr.atomic.remoteAddr;
    w->wr.atomic.compare_add = wr.atomic.compareAdd;
    w->wr.atomic.swap = wr.atomic.swap;
    w->wr.atomic.rkey = wr.atomic.rkey;
  } else {
    w->wr.rdma.remote_addr = wr.rdma.remoteAddr;
    w->wr.rdma.rkey = wr.rdma.rkey;
  }
  return Status::ok();
}

Status IbvQp::attachMcast(const verbs::Gid& gid, uint16_t lid) { return mcast(gid, lid, true); }
Status IbvQp::detachMcast(const verbs::Gid& gid, uint16_t lid) { return mcast(gid, lid, false); }

Status IbvQp::mcast(const verbs::Gid& gid, uint16_t lid, bool join) {
  const char* func = join ? "ibv_attach_mcast" : "ibv_detach_mcast";
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError(std::string(func) + ": the QP is closed");
  ibv_gid g{};
  std::memcpy(g.raw, gid.raw.data(), sizeof g.raw);
  const auto& api = pd_->ctx()->api();
  if (int rc = (join ? api.attachMcast : api.detachMcast)(qp_, &g, lid); rc != 0)
    return verbsError(func, errnoOf(rc));
  auto group = std::make_pair(gid.raw, lid);
  std::erase(groups_, group);
  if (join) groups_.push_back(group);
  return Status::ok();
}

Status IbvQp::postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) {
  auto refuse = [&](size_t index, Status status) {
    if (badIndex) *badIndex = index;
    return status;
  };
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return refuse(0, closedError("post recv: the QP is closed"));
  if (recvCq_->closed()) return refuse(0, closedError("post recv: the QP's receive CQ is closed"));
  if (state_.load() == QpState::kReset) return refuse(0, invalidArgument("post recv: the QP is in RESET"));
  if (wrs.empty()) return Status::ok();
  ibv_recv_wr* chain = buildRecvChain(wrs);
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, chain, &bad); rc != 0) {
    return refuse(bad != nullptr ? static_cast<size_t>(bad - chain) : 0,
                  verbsError("ibv_post_recv", errnoOf(rc)));
  }
  return Status::ok();
}

}  // namespace ferry::ibverbs
