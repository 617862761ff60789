// Queue pairs: creation and its limits, the state machine as libibverbs has it, the UC type,
// reset and reconnect after an error, and two QPs of one context talking to each other.
#include <chrono>
#include <thread>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

TEST_P(VerbsConformance, CreateQpChecksCapsAndCqs) {
  Side side;
  ASSERT_OK(openSide(side, nullptr, 64));
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, side.context->queryDevice());
  const v::QpCap cap{.maxSendWr = 32, .maxRecvWr = 16, .maxSendSge = 2, .maxRecvSge = 3, .maxInlineData = 0};
  auto init = [&](v::QpCap c) {
    return v::QpInit{.type = v::QpType::kRc, .sendCq = &side.sendCq, .recvCq = &side.recvCq, .cap = c};
  };
  v::QpCap tooDeep = cap;
  tooDeep.maxSendWr = static_cast<uint32_t>(device.maxQpWr) + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooDeep)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpCap tooWide = cap;
  tooWide.maxSendSge = static_cast<uint32_t>(device.maxSge) + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooWide)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpCap tooMuchInline = cap;
  tooMuchInline.maxInlineData = device.maxInlineData + 1;
  EXPECT_TRUE(hasCode(side.pd.createQp(init(tooMuchInline)).status(), StatusCode::kInvalidArgument, EINVAL));
  v::QpInit noCq = init(cap);
  noCq.sendCq = nullptr;
  EXPECT_TRUE(hasCode(side.pd.createQp(noCq).status(), StatusCode::kInvalidArgument, EINVAL));

  ASSERT_OK_AND_ASSIGN(v::Context otherContext, openContext());
  ASSERT_OK_AND_ASSIGN(v::CompletionQueue foreignCq, otherContext.createCq({.cqe = 16}));
  v::QpInit foreign = init(cap);
  foreign.recvCq = &foreignCq;
  EXPECT_TRUE(hasCode(side.pd.createQp(foreign).status(), StatusCode::kInvalidArgument, EINVAL))
      << "a CQ of another context";

  ASSERT_OK_AND_ASSIGN(v::QueuePair qp, side.pd.createQp(init(cap)));
  ASSERT_OK_AND_ASSIGN(v::QueuePair second, side.pd.createQp(init(cap)));
  EXPECT_EQ(qp.type(), v::QpType::kRc);
  EXPECT_NE(qp.qpNum(), 0u);
  EXPECT_LT(qp.qpNum(), 1u << 24);
  EXPECT_NE(qp.qpNum(), second.qpNum());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attr, qp.query());
  EXPECT_EQ(attr.state, QpState::kReset);
  EXPECT_GE(attr.cap.maxSendWr, cap.maxSendWr);
  EXPECT_GE(attr.cap.maxRecvWr, cap.maxRecvWr);
  EXPECT_GE(attr.cap.maxSendSge, cap.maxSendSge);
  EXPECT_GE(attr.cap.maxRecvSge, cap.maxRecvSge);
}

TEST_P(VerbsConformance, QpStateMachineFollowsLibibverbs) {
  namespace m = v::qp_attr_mask;
  Side a, b;
  v::Path localA, localB;
  ASSERT_OK(openUnconnected(a, b, &localA, &localB));
  ASSERT_OK_AND_ASSIGN(v::Path pathA, pathTowardsPeer(*a.context, a.qp, localA, localB, {}));
  ASSERT_OK_AND_ASSIGN(v::Path pathB, pathTowardsPeer(*b.context, b.qp, localB, localA, {}));
  auto refused = [](const Status& status) { return hasCode(status, StatusCode::kInvalidArgument, EINVAL); };
  auto stateOf = [](const v::QueuePair& qp) {
    Result<v::QpAttr> attr = qp.query();
    return attr.isOk() ? attr->state : QpState::kSqe;
  };
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, access::kLocalWrite, 3));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(b.pd, 4096, access::kAll, 4));
  const SendOp write = rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 64), dst);

  // RESET: only INIT (and RESET, ERR) is reachable; posting is refused.
  v::QpAttr attr;
  attr.state = QpState::kRtr;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RESET -> RTR";
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RESET -> RTS";
  attr = {};
  attr.state = QpState::kInit;
  attr.pkeyIndex = 0;
  attr.portNum = 1;
  attr.qpAccessFlags = kRemoteAccess;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort)))
      << "INIT without ACCESS_FLAGS";
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kAccessFlags))) << "INIT without PORT";
  attr.destQpNum = b.qp.qpNum();
  EXPECT_TRUE(
      refused(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags | m::kDestQpn)))
      << "DEST_QPN is not an attribute of RESET -> INIT";
  EXPECT_EQ(stateOf(a.qp), QpState::kReset) << "a refused modify changes nothing";
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in RESET";
  EXPECT_TRUE(refused(postReceive(a.qp, 1, {sgeOf(src, 0, 64)}))) << "postRecv in RESET";

  ASSERT_OK(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
  ASSERT_OK_AND_ASSIGN(v::QpAttr init, a.qp.query());
  EXPECT_EQ(init.state, QpState::kInit);
  EXPECT_EQ(init.qpAccessFlags, kRemoteAccess);
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in INIT";
  ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(a.pd, 4096, access::kLocalWrite, 5));
  EXPECT_OK(postReceive(a.qp, 77, {sgeOf(inbox, 0, 256)})) << "postRecv in INIT is allowed";

  // INIT -> RTR needs the address vector, MTU, destination QPN, RQ PSN, responder depth, RNR timer.
  attr = {};
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "INIT -> RTS";
  attr = {};
  attr.state = QpState::kRtr;
  attr.ahAttr = pathA.ahAttr();
  attr.pathMtu = pathA.mtu;
  attr.destQpNum = pathA.dqpn;
  attr.rqPsn = pathA.dqpsn;
  attr.maxDestRdAtomic = pathA.drdatomic;
  attr.minRnrTimer = pathA.minRnrTimer;
  attr.sqPsn = pathA.sqpsn;
  const uint32_t rtrMask =
      m::kState | m::kAv | m::kPathMtu | m::kDestQpn | m::kRqPsn | m::kMaxDestRdAtomic | m::kMinRnrTimer;
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kAv))) << "RTR without AV";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kDestQpn))) << "RTR without DEST_QPN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask & ~m::kRqPsn))) << "RTR without RQ_PSN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtrMask | m::kSqPsn))) << "SQ_PSN is not an attribute of INIT -> RTR";
  EXPECT_EQ(stateOf(a.qp), QpState::kInit);
  ASSERT_OK(a.qp.modify(attr, rtrMask));
  EXPECT_EQ(stateOf(a.qp), QpState::kRtr);
  EXPECT_TRUE(refused(post(a.qp, write))) << "postSend in RTR";

  // RTR -> RTS needs SQ PSN, initiator depth, retry counts and the timeout.
  attr = {};
  attr.state = QpState::kRts;
  attr.sqPsn = pathA.sqpsn;
  attr.maxRdAtomic = pathA.srdatomic;
  attr.retryCnt = pathA.retries;
  attr.rnrRetry = pathA.rnrRetries;
  attr.timeout = pathA.packetLifeTime;
  const uint32_t rtsMask =
      m::kState | m::kSqPsn | m::kMaxQpRdAtomic | m::kRetryCnt | m::kRnrRetry | m::kTimeout;
  EXPECT_TRUE(refused(a.qp.modify(attr, rtsMask & ~m::kSqPsn))) << "RTS without SQ_PSN";
  EXPECT_TRUE(refused(a.qp.modify(attr, rtsMask | m::kDestQpn)))
      << "DEST_QPN is not an attribute of RTR -> RTS";
  EXPECT_EQ(stateOf(a.qp), QpState::kRtr);
  ASSERT_OK(a.qp.modify(attr, rtsMask));
  ASSERT_OK_AND_ASSIGN(v::QpAttr rts, a.qp.query());
  EXPECT_EQ(rts.state, QpState::kRts);
  EXPECT_EQ(rts.destQpNum, b.qp.qpNum());

  // The hand-built side talks to a side built by establish(), both ways.
  ASSERT_OK(b.qp.establish(pathB, kRemoteAccess));
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(a, write, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 64), bytesOf(src, 0, 64)));
  ASSERT_OK(post(b.qp, {.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(dst, 0, 100)}}));
  ASSERT_TRUE(pollOne(a.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 77, WcOpcode::kRecv)) << "the receive posted in INIT";
  EXPECT_EQ(wc.byteLen, 100u);

  // RTS -> RTR is illegal; any state -> ERR and ERR -> RESET -> INIT are legal.
  attr = {};
  attr.state = QpState::kRtr;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "RTS -> RTR";
  attr.state = QpState::kErr;
  ASSERT_OK(a.qp.modify(attr, m::kState));
  EXPECT_EQ(stateOf(a.qp), QpState::kErr);
  attr.state = QpState::kRts;
  EXPECT_TRUE(refused(a.qp.modify(attr, m::kState))) << "ERR -> RTS";
  attr.state = QpState::kReset;
  ASSERT_OK(a.qp.modify(attr, m::kState));
  EXPECT_EQ(stateOf(a.qp), QpState::kReset);
  attr = {};
  attr.state = QpState::kInit;
  attr.portNum = 1;
  attr.qpAccessFlags = 0;
  EXPECT_OK(a.qp.modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
  EXPECT_EQ(stateOf(a.qp), QpState::kInit);
}

// UC queue pairs: WRITE, WRITE_WITH_IMM and SEND arrive byte-exact; READ and atomics are refused
// at post; there are no acknowledgements and no retries, so a WRITE the target refuses (a bad
// rkey) and a SEND that finds no receive posted still complete at the requester, are dropped at
// the target without a word, and the connection goes on.
TEST_P(VerbsConformance, UcCarriesWritesAndSendsAndDropsWhatTheTargetRefuses) {
  PairOptions options;
  options.qpA.type = options.qpB.type = v::QpType::kUc;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair(options));
  constexpr size_t kSize = 64 * 1024;
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, kSize, access::kLocalWrite, 41));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 2 * kSize, access::kAll, 42));
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, kSize), dst), &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRdmaWrite));
  // The requester's completion says the WRITE left, not that it landed: poll the target.
  auto landed = [&](size_t offset, size_t length, uint64_t seed, uint64_t position) {
    for (auto until = Clock::now() + kWaitTimeout; Clock::now() < until;) {
      if (firstPatternMismatch(bytesOf(dst, offset, length), seed, position) == length) return true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return false;
  };
  EXPECT_TRUE(landed(0, kSize, 41, 0)) << "the WRITE arrived byte-exact";
  // WRITE_WITH_IMM and SEND consume receives, as on RC.
  ASSERT_OK(postReceive(pair->b.qp, 10, {sgeOf(dst, kSize, kSize)}));
  ASSERT_OK(postReceive(pair->b.qp, 11, {sgeOf(dst, kSize, kSize)}));
  SendOp writeWithImm = rdmaRequest(WrOpcode::kRdmaWriteWithImm, 2, sgeOf(src, 0, 4096), dst);
  writeWithImm.imm = 0x5151;
  ASSERT_OK(post(pair->a.qp, writeWithImm));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 100, 1000)}}));
  std::vector<WorkCompletion> got;
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &got));
  EXPECT_EQ(got[0].wrId, 10u);
  EXPECT_EQ(got[0].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(got[0].immData, 0x5151u);
  EXPECT_EQ(got[1].wrId, 11u);
  EXPECT_EQ(got[1].opcode, WcOpcode::kRecv);
  EXPECT_EQ(got[1].byteLen, 1000u);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, kSize, 1000), 41, 100));
  std::vector<WorkCompletion> sent;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(succeeded(sent[0], 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(sent[1], 3, WcOpcode::kSend));
  // No READ, no atomics.
  EXPECT_TRUE(hasCode(post(pair->a.qp, rdmaRequest(WrOpcode::kRdmaRead, 4, sgeOf(src, 0, 8), dst)),
                      StatusCode::kInvalidArgument, EINVAL));
  SendOp fetchAdd = rdmaRequest(WrOpcode::kAtomicFetchAndAdd, 5, sgeOf(src, 0, 8), dst);
  fetchAdd.compareAdd = 1;
  EXPECT_TRUE(hasCode(post(pair->a.qp, fetchAdd), StatusCode::kInvalidArgument, EINVAL));
  // A WRITE with a bad rkey and a SEND that finds no receive: both complete here, neither changes
  // the target, and the QPs stay RTS.
  fillPattern(writableBytes(dst, 0, 2 * kSize), 43);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 6,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = dst.address(0),
                              .rkey = corruptKey(dst.mr.rkey())}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 7, .sges = {sgeOf(src, 0, 64)}}));
  sent.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(succeeded(sent[0], 6, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(sent[1], 7, WcOpcode::kSend));
  EXPECT_TRUE(noCompletionFor(pair->b.recvCq, milliseconds(50)));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 2 * kSize), 43)) << "nothing refused was placed";
  EXPECT_TRUE(reachesState(pair->a.qp, v::QpState::kRts));
  EXPECT_TRUE(reachesState(pair->b.qp, v::QpState::kRts));
  // And the next message arrives.
  ASSERT_OK(postReceive(pair->b.qp, 12, {sgeOf(dst, kSize, kSize)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 8, .sges = {sgeOf(src, 0, 512)}}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.wrId, 12u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_EQ(wc.byteLen, 512u);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, kSize, 512), 41, 0));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 8, WcOpcode::kSend));
  // UC's transitions take no READ/atomic resources, RNR timer, timeout or retry counts.
  v::QpAttr attr;
  attr.state = v::QpState::kRts;
  attr.timeout = 14;
  EXPECT_TRUE(hasCode(pair->a.qp.modify(attr, v::qp_attr_mask::kState | v::qp_attr_mask::kTimeout),
                      StatusCode::kInvalidArgument, EINVAL));
}

TEST_P(VerbsConformance, ResetAndReconnectRecoversAfterAnError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 * kMiB, access::kLocalWrite, 92));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 * kMiB, access::kAll, 93));
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 1,
                           .sges = {sgeOf(src, 0, 64)},
                           .remoteAddr = dst.address(),
                           .rkey = corruptKey(dst.mr.rkey())},
                          &wc));
  ASSERT_TRUE(failedWith(wc, 1, WcStatus::kRemAccessErr));
  ASSERT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  ASSERT_TRUE(reachesState(pair->b.qp, QpState::kErr));

  ASSERT_TRUE(resetAndReconnect(*pair));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kRts, milliseconds(0)));
  EXPECT_TRUE(reachesState(pair->b.qp, QpState::kRts, milliseconds(0)));
  ASSERT_TRUE(postAndWait(pair->a, rdmaRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 1 * kMiB), dst), &wc));
  EXPECT_TRUE(succeeded(wc, 2, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 1 * kMiB), bytesOf(src, 0, 1 * kMiB)));

  // RESET from RTS drops queued receives without completing them.
  ASSERT_OK(postReceive(pair->b.qp, 70, {sgeOf(dst, 0, 4096)}));
  ASSERT_TRUE(resetAndReconnect(*pair));
  ASSERT_OK(postReceive(pair->b.qp, 71, {sgeOf(dst, 4096, 4096)}));
  ASSERT_TRUE(
      postAndWait(pair->a, {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 0, 100)}}, &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kSend));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 71, WcOpcode::kRecv)) << "the receive posted before RESET is gone";
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 4096, 100), bytesOf(src, 0, 100)));
}

TEST_P(VerbsConformance, QpsOfOneContextTalkToEachOther) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.sameContext = true}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 256 * kKiB, access::kAll, 94));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 256 * kKiB, access::kAll, 95));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 128 * kKiB, 64 * kKiB)}));
  ASSERT_OK(postAll(pair->a.qp,
                    {rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 64 * kKiB), dst),
                     rdmaRequest(WrOpcode::kRdmaRead, 2, sgeOf(src, 64 * kKiB, 64 * kKiB), dst, 64 * kKiB),
                     {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 192 * kKiB, 64 * kKiB)}}}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 3, &completions));
  EXPECT_TRUE(succeeded(completions[0], 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(succeeded(completions[1], 2, WcOpcode::kRdmaRead));
  EXPECT_TRUE(succeeded(completions[2], 3, WcOpcode::kSend));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 64 * kKiB), bytesOf(src, 0, 64 * kKiB)));
  EXPECT_TRUE(bytesEqual(bytesOf(src, 64 * kKiB, 64 * kKiB), bytesOf(dst, 64 * kKiB, 64 * kKiB)));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 128 * kKiB, 64 * kKiB), bytesOf(src, 192 * kKiB, 64 * kKiB)));
}

}  // namespace
}  // namespace ferry::test
