#include "providers/soft/ud_qp.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <array>
#include <cstring>
#include <set>
#include <shared_mutex>

#include "common/device_access.h"
#include "providers/soft/mcast.h"
#include "providers/soft/qp_internal.h"
#include "providers/soft/region_copy.h"
#include "verbs/qp_state.h"

namespace ferry::soft {
namespace {

using verbs::QpState;
using verbs::WcOpcode;
using verbs::WcStatus;
using verbs::WrOpcode;

constexpr uint32_t kMulticastQpn = 0xffffff;  // the destination QP of a multicast send (IBA 10.5.2)

using qp_detail::refusePost;

// What the receive's GRH says of a send through an AH with these attributes (wire::DatagramRoute).
wire::DatagramRoute routeOf(const verbs::AhAttr& attr) {
  wire::DatagramRoute route;
  route.present = true;
  route.grh = attr.isGlobal;
  if (attr.isGlobal) {
    route.dgid = attr.dgid.raw;
    route.flowLabel = attr.flowLabel & 0xfffff;
    route.trafficClass = attr.trafficClass;
    route.hopLimit = attr.hopLimit;
  }
  return route;
}

}  // namespace

SoftUdQp::SoftUdQp(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd,
                   const verbs::QpInitImpl& init)
    : ctx_(std::move(ctx)),
      pd_(std::move(pd)),
      sendCq_(std::static_pointer_cast<SoftCq>(init.sendCq)),
      recvCq_(std::static_pointer_cast<SoftCq>(init.recvCq)),
      srq_(std::static_pointer_cast<SoftSrq>(init.srq)),
      cap_(init.cap),
      sqSigAll_(init.sqSigAll) {
  attr_.cap = cap_;
  in_addr_t ip;
  parseSoftGid(ctx_->gid(), &ip, &ownPort_);
}

Status SoftUdQp::modify(const verbs::QpAttr& attr, uint32_t mask) {
  namespace m = verbs::qp_attr_mask;
  if (closed_) return closedError("modify: the QP is closed");
  bool flush = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = verbs::checkQpTransition(verbs::QpType::kUd, state_, attr, mask);
    if (!next.isOk()) return next.status();
    if (mask & m::kPkeyIndex) attr_.pkeyIndex = attr.pkeyIndex;
    if (mask & m::kPort) attr_.portNum = attr.portNum;
    if (mask & m::kQkey) attr_.qkey = attr.qkey;
    if (mask & m::kSqPsn) attr_.sqPsn = attr.sqPsn;
    if (*next == QpState::kReset) {
      rq_.clear();
      sqHeld_ = std::make_shared<std::atomic<uint32_t>>(0);  // completions still queued free nothing
      unsignaledRun_ = 0;
      verbs::QpAttr fresh;
      fresh.cap = cap_;
      attr_ = fresh;
    }
    flush = *next == QpState::kErr;
    state_ = *next;
  }
  if (flush) flushRecvs();
  return Status::ok();
}

Result<verbs::QpAttr> SoftUdQp::query() {
  if (closed_) return closedError("query: the QP is closed");
  std::lock_guard<std::mutex> lock(mu_);
  verbs::QpAttr attr = attr_;
  attr.state = attr.curState = state_;
  attr.cap = cap_;
  attr.pathMtu = verbs::Mtu::k4096;
  return attr;
}

void SoftUdQp::complete(const std::shared_ptr<SoftCq>& cq, const verbs::WorkCompletion& wc, bool solicited) {
  cq->push(wc, solicited);
}

Status SoftUdQp::postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < wrs.size(); ++i) {
    const verbs::SendWr& wr = wrs[i];
    std::shared_ptr<SoftAh> ah;
    if (Status status = checkSendLocked(wr, &ah); !status.isOk()) {
      if (badIndex) *badIndex = i;
      return status;
    }
    sqHeld_->fetch_add(1);
    verbs::WorkCompletion wc;
    wc.wrId = wr.wrId;
    wc.opcode = WcOpcode::kSend;
    wc.qpNum = qpn_;
    for (const auto& sge : wr.sgList) wc.byteLen += sge.length;
    wc.status = state_ == QpState::kErr ? WcStatus::kWrFlushErr : sendLocked(wr, *ah);
    const bool signaled = sqSigAll_ || (wr.sendFlags & verbs::send_flags::kSignaled);
    completeSendLocked(wc, wc.status != WcStatus::kSuccess || signaled);
  }
  return Status::ok();
}

Status SoftUdQp::checkSendLocked(const verbs::SendWr& wr, std::shared_ptr<SoftAh>* ah) {
  // The rest the verbs layer checked (verbs/posting.h). A message above the MTU or past its memory
  // region is posted, and fails in its completion, as on a NIC (sendLocked).
  if (closed_) return closedError("post send: the QP is closed");
  if (sendCq_->closed()) return closedError("post send: the QP's send CQ is closed");
  if (state_ != QpState::kRts && state_ != QpState::kErr) {
    return refusePost(std::string("send queue not ready (QP in ") + verbs::qpStateName(state_) + ")");
  }
  if (!(*ah = pd_->findAh(wr.ud.ah))) return refusePost("unknown or closed address handle (of another PD?)");
  if (sqHeld_->load() >= cap_.maxSendWr) {
    return resourceExhausted("post send: send queue full (" + std::to_string(cap_.maxSendWr) +
                             " sends whose completions have not been polled)");
  }
  return Status::ok();
}

WcStatus SoftUdQp::gatherLocked(const verbs::SendWr& wr, Gathered* out) const {
  const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
  size_t copiedOut = 0;
  for (const auto& sge : wr.sgList) {
    out->total += sge.length;
    if (sge.length == 0) continue;
    // A NIC reads the message through its lkeys: one that does not cover the entry fails the send.
    const MrEntry* entry =
        inlined ? nullptr : ctx_->findMrEntryLocked(sge.lkey, pd_.get(), sge.addr, sge.length, 0);
    if (!inlined && entry == nullptr) return WcStatus::kLocProtErr;
    if (!onDevice(entry)) {
      out->iov[out->count++] = {reinterpret_cast<void*>(sge.addr), sge.length};
      continue;
    }
    if (out->total > wire::kMaxDatagram) return WcStatus::kLocLenErr;
    uint8_t* at = out->fromDevice + copiedOut;
    if (!readRegion(*entry, at, reinterpret_cast<const void*>(sge.addr), sge.length))
      return WcStatus::kLocProtErr;
    out->iov[out->count++] = {at, sge.length};
    copiedOut += sge.length;
  }
  return WcStatus::kSuccess;
}

WcStatus SoftUdQp::sendLocked(const verbs::SendWr& wr, const SoftAh& ah) {
  uint8_t header[wire::kMaxHeaderLen];
  Gathered g;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  if (WcStatus st = gatherLocked(wr, &g); st != WcStatus::kSuccess) return st;
  const uint64_t total = g.total;
  iovec* iov = g.iov;
  const int count = g.count;
  if (total > wire::kMaxDatagram) return WcStatus::kLocLenErr;  // above the MTU: nothing is sent
  wire::FrameHeader h;
  h.type = wire::FrameType::kDatagram;
  h.qpn = wr.ud.remoteQpn & 0xffffff;
  h.srcQpn = qpn_;
  // A Q_Key with the high bit set means: use the QP's own (IBA 10.2.5).
  h.qkey = (wr.ud.remoteQkey & 0x80000000u) ? attr_.qkey : wr.ud.remoteQkey;
  h.srcGid = ctx_->gid().raw;
  h.route = routeOf(ah.attr());
  h.payloadLen = static_cast<uint32_t>(total);
  if (wr.opcode == WrOpcode::kSendWithImm) {
    h.flags |= wire::kFlagImm;
    h.aux = wr.immData;
  }
  if (wr.sendFlags & verbs::send_flags::kSolicited) h.flags |= wire::kFlagSolicited;
  // A datagram the kernel refuses is lost, as UD allows; the send still completes.
  auto sendOne = [&](in_addr_t ip, uint16_t port) {
    iov[0] = {header, wire::encodeHeader(h, header)};
    sockaddr_in dest{};
    dest.sin_family = AF_INET;
    dest.sin_addr.s_addr = ip;
    dest.sin_port = htons(port);
    msghdr msg{};
    msg.msg_name = &dest;
    msg.msg_namelen = sizeof dest;
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    DeviceAccess device;
    (void)::sendmsg(ctx_->udpFd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  };
  if (!ah.multicast()) {
    sendOne(ah.ipv4(), ah.port());
  } else if ((wr.ud.remoteQpn & 0xffffff) == kMulticastQpn) {
    // The group's members, each in its own datagram naming its QP (mcast.h); not this QP.
    for (const mcast::Member& m : mcast::members(ah.attr().dgid)) {
      if (m.pid == static_cast<uint32_t>(::getpid()) && m.qpn == qpn_ && m.ipv4 == ctx_->ipv4()) continue;
      h.qpn = m.qpn;
      sendOne(m.ipv4, m.port);
    }
  }
  return WcStatus::kSuccess;
}

void SoftUdQp::completeSendLocked(const verbs::WorkCompletion& wc, bool signaled) {
  if (!signaled) {
    ++unsignaledRun_;
    return;
  }
  sendCq_->push(wc, false, sqHeld_, unsignaledRun_ + 1);
  unsignaledRun_ = 0;
}

Status SoftUdQp::postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) {
  bool flush = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < wrs.size(); ++i) {
      Status status;
      if (closed_) {
        status = closedError("post recv: the QP is closed");
      } else if (srq_) {
        status = refusePost("the QP takes its receives from an SRQ");
      } else if (state_ == QpState::kReset) {
        status = refusePost("receive queue not ready (QP in RESET)");
      } else if (wrs[i].sgList.size() > cap_.maxRecvSge) {
        status = refusePost("more SGEs than the QP's max_recv_sge");
      } else if (rq_.size() >= cap_.maxRecvWr) {
        status = resourceExhausted("post recv: receive queue full");
      }
      if (!status.isOk()) {
        if (badIndex) *badIndex = i;
        return status;
      }
      rq_.push_back(RecvWqe{wrs[i].wrId, Sges(wrs[i].sgList.begin(), wrs[i].sgList.end())});
    }
    flush = state_ == QpState::kErr;
  }
  if (flush) flushRecvs();
  return Status::ok();
}

void SoftUdQp::flushRecvs() {
  std::deque<RecvWqe> flushed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    flushed.swap(rq_);
  }
  for (auto& r : flushed) {
    verbs::WorkCompletion wc;
    wc.wrId = r.wrId;
    wc.status = WcStatus::kWrFlushErr;
    wc.opcode = WcOpcode::kRecv;
    wc.qpNum = qpn_;
    complete(recvCq_, wc, false);
  }
}

void SoftUdQp::close() {
  if (closed_.exchange(true)) return;
  std::set<std::array<uint8_t, 16>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups.swap(groups_);
  }
  for (const auto& raw : groups) (void)mcast::detach(verbs::Gid{raw}, ctx_->ipv4(), ownPort_, qpn_);
  ctx_->removeQp(qpn_);
}

Status SoftUdQp::attachMcast(const verbs::Gid& gid, uint16_t lid) {
  (void)lid;  // the software devices have no LIDs
  if (closed_) return closedError("attach_mcast: the QP is closed");
  std::lock_guard<std::mutex> lock(mu_);
  if (groups_.count(gid.raw) != 0) return Status::ok();
  FERRY_RETURN_IF_ERROR(mcast::attach(gid, ctx_->ipv4(), ownPort_, qpn_));
  groups_.insert(gid.raw);
  return Status::ok();
}

Status SoftUdQp::detachMcast(const verbs::Gid& gid, uint16_t lid) {
  (void)lid;
  if (closed_) return closedError("detach_mcast: the QP is closed");
  std::lock_guard<std::mutex> lock(mu_);
  if (groups_.count(gid.raw) == 0) {
    return Status(StatusCode::kInvalidArgument, "detach_mcast: the QP is not attached to that group", EINVAL);
  }
  groups_.erase(gid.raw);
  return mcast::detach(gid, ctx_->ipv4(), ownPort_, qpn_);
}

bool SoftUdQp::takeRecv(RecvWqe* out) {
  if (srq_) return srq_->take(out);
  if (rq_.empty()) return false;
  *out = std::move(rq_.front());
  rq_.pop_front();
  return true;
}

void SoftUdQp::writeGrh(const wire::FrameHeader& h, uint8_t* grh) const {
  // IPv6's header, as RoCEv2 carries it: version 6, traffic class and flow label in the first
  // word; the payload length; next header 0x1b (IBA transport); the hop limit; source and
  // destination GIDs. The route is the sender's AH; an older sender's datagram has none.
  const wire::DatagramRoute& r = h.route;
  const uint32_t word = (6u << 28) | (static_cast<uint32_t>(r.present ? r.trafficClass : 0) << 20) |
                        (r.present ? r.flowLabel & 0xfffff : 0);
  grh[0] = static_cast<uint8_t>(word >> 24);
  grh[1] = static_cast<uint8_t>(word >> 16);
  grh[2] = static_cast<uint8_t>(word >> 8);
  grh[3] = static_cast<uint8_t>(word);
  const auto payloadLen = static_cast<uint16_t>(h.payloadLen);
  grh[4] = static_cast<uint8_t>(payloadLen >> 8);
  grh[5] = static_cast<uint8_t>(payloadLen);
  grh[6] = 0x1b;
  grh[7] = r.present ? r.hopLimit : 64;
  std::memcpy(grh + 8, h.srcGid.data(), 16);
  std::memcpy(grh + 24, r.present ? r.dgid.data() : ctx_->gid().raw.data(), 16);
}

// Scatters the GRH (or, with none, leaves its 40 bytes as they were) and the payload over the
// receive's SGEs; the context's memory lock is held shared.
WcStatus SoftUdQp::placeDatagramLocked(const RecvWqe& rwqe, const uint8_t* grh, bool withGrh,
                                       const uint8_t* payload, size_t need) {
  size_t room = 0;
  std::array<const MrEntry*, kMaxSge> entries{};
  for (size_t i = 0; i < rwqe.sges.size(); ++i) {
    const auto& sge = rwqe.sges[i];
    room += sge.length;
    if (sge.length == 0) continue;
    entries[i] =
        ctx_->findMrEntryLocked(sge.lkey, pd_.get(), sge.addr, sge.length, verbs::access::kLocalWrite);
    if (entries[i] == nullptr) return WcStatus::kLocQpOpErr;
  }
  if (room < need) return WcStatus::kLocQpOpErr;  // the receive cannot hold GRH and message (as rxe)
  size_t done = 0;
  for (size_t i = 0; i < rwqe.sges.size(); ++i) {
    const auto& sge = rwqe.sges[i];
    auto* dst = reinterpret_cast<uint8_t*>(sge.addr);
    size_t left = sge.length;
    while (left > 0 && done < need) {
      size_t piece = std::min(left, need - done);
      const uint8_t* src = done < kGrhBytes ? grh + done : payload + (done - kGrhBytes);
      if (done < kGrhBytes) piece = std::min(piece, kGrhBytes - done);
      if ((withGrh || done >= kGrhBytes) && !writeRegion(*entries[i], dst, src, piece))
        return WcStatus::kLocQpOpErr;
      dst += piece;
      left -= piece;
      done += piece;
    }
  }
  return WcStatus::kSuccess;
}

void SoftUdQp::onDatagramFromLoop(const wire::FrameHeader& h, const uint8_t* payload) {
  FERRY_ON_LOOP(ctx_->reactor());
  RecvWqe rwqe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || (state_ != QpState::kRtr && state_ != QpState::kRts)) return;  // dropped
    if (h.qkey != attr_.qkey) return;  // wrong Q_Key: dropped silently, as on UD
    if (!takeRecv(&rwqe)) return;      // no receive posted: dropped
  }
  verbs::WorkCompletion wc;
  wc.wrId = rwqe.wrId;
  wc.opcode = WcOpcode::kRecv;
  wc.qpNum = qpn_;
  wc.srcQp = h.srcQpn;
  if (!h.route.present || h.route.grh) wc.wcFlags = verbs::wc_flags::kGrh;
  if (h.flags & wire::kFlagImm) {
    wc.wcFlags |= verbs::wc_flags::kWithImm;
    wc.immData = h.aux;
  }
  // A receive's first 40 bytes hold the GRH when the send had one (and are left as they were
  // when it had none, as a NIC leaves them).
  uint8_t grh[kGrhBytes] = {};
  const bool withGrh = (wc.wcFlags & verbs::wc_flags::kGrh) != 0;
  if (withGrh) writeGrh(h, grh);
  const size_t need = kGrhBytes + h.payloadLen;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    wc.status = placeDatagramLocked(rwqe, grh, withGrh, payload, need);
  }
  if (wc.status == WcStatus::kSuccess) wc.byteLen = static_cast<uint32_t>(need);
  complete(recvCq_, wc, (h.flags & wire::kFlagSolicited) != 0);
}

}  // namespace ferry::soft
