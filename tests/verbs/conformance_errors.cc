// Bad input and the errors it gives: requests refused at post (SGE counts, inline size, full
// queues), and error completions (access violations, bad keys, short receives, flushes).
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

// ============================ posting refusals ============================

TEST_P(VerbsConformance, PostRefusesTooManySgesAndOversizedInline) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrA, pair->a.qp.query());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrB, pair->b.qp.query());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * kKiB, access::kLocalWrite, 6));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 7));

  std::vector<v::Sge> tooMany(attrA.cap.maxSendSge + 1, sgeOf(src, 0, 8));
  size_t bad = 99;
  EXPECT_TRUE(hasCode(postAll(pair->a.qp, {{.opcode = WrOpcode::kSend, .wrId = 1, .sges = tooMany}}, &bad),
                      StatusCode::kInvalidArgument, EINVAL));
  EXPECT_EQ(bad, 0u);
  std::vector<v::Sge> tooManyRecv(attrB.cap.maxRecvSge + 1, sgeOf(dst, 0, 8));
  EXPECT_TRUE(hasCode(postReceive(pair->b.qp, 1, tooManyRecv), StatusCode::kInvalidArgument, EINVAL));

  std::vector<uint8_t> inlineData(attrA.cap.maxInlineData + 1, 0x5a);
  const v::Sge inlineSge{.addr = reinterpret_cast<uint64_t>(inlineData.data()),
                         .length = static_cast<uint32_t>(inlineData.size()),
                         .lkey = 0};
  EXPECT_TRUE(hasCode(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                                        .wrId = 2,
                                        .sges = {inlineSge},
                                        .flags = send_flags::kSignaled | send_flags::kInline,
                                        .remoteAddr = dst.address(),
                                        .rkey = dst.mr.rkey()}),
                      StatusCode::kInvalidArgument, EINVAL))
      << "inline data of " << inlineData.size() << " bytes, cap " << attrA.cap.maxInlineData;

  // A refused request in a list: the ones before it stay posted, the ones after are not posted.
  const SendOp good = rdmaRequest(WrOpcode::kRdmaWrite, 10, sgeOf(src, 0, 256), dst);
  SendOp refused = good;
  refused.wrId = 11;
  refused.sges = tooMany;
  SendOp after = good;
  after.wrId = 12;
  bad = 99;
  EXPECT_TRUE(
      hasCode(postAll(pair->a.qp, {good, refused, after}, &bad), StatusCode::kInvalidArgument, EINVAL));
  EXPECT_EQ(bad, 1u);
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(succeeded(wc, 10, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(noCompletionFor(pair->a.sendCq, milliseconds(50)));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kRts, milliseconds(0))) << "a refusal is not a QP error";
}

TEST_P(VerbsConformance, FullQueuesRefuseWithEnomemAndKeepEarlierRequests) {
  const QpOptions small{.cap = {.maxSendWr = 16, .maxRecvWr = 16, .maxSendSge = 1, .maxRecvSge = 1}};
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = small, .qpB = small, .link = {.minRnrTimer = 10}}));
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrA, pair->a.qp.query());
  ASSERT_OK_AND_ASSIGN(v::QpAttr attrB, pair->b.qp.query());
  const uint32_t recvDepth = attrB.cap.maxRecvWr;
  const uint32_t sendDepth = attrB.cap.maxSendWr;
  ASSERT_GE(attrA.cap.maxRecvWr, sendDepth);
  ASSERT_OK_AND_ASSIGN(auto bufA, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 8));
  ASSERT_OK_AND_ASSIGN(auto bufB, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 9));

  // Receive queue of B: recvDepth + 1 receives in one list.
  std::vector<std::vector<v::Sge>> recvSges;
  std::vector<v::RecvWr> recvs;
  for (uint32_t i = 0; i <= recvDepth; ++i) recvSges.push_back({sgeOf(bufB, i * 64, 64)});
  for (uint32_t i = 0; i <= recvDepth; ++i) recvs.push_back({.wrId = 100 + i, .sgList = recvSges[i]});
  size_t bad = 0;
  EXPECT_TRUE(hasCode(pair->b.qp.postRecv(recvs, &bad), StatusCode::kResourceExhausted, ENOMEM));
  EXPECT_EQ(bad, recvDepth);

  // Send queue of B: A has no receive posted, so every SEND waits (RNR) and holds its slot.
  std::vector<SendOp> sends;
  for (uint32_t i = 0; i <= sendDepth; ++i) {
    sends.push_back(
        {.opcode = WrOpcode::kSend, .wrId = 200 + i, .sges = {sgeOf(bufB, 32 * kKiB + i * 8, 8)}});
  }
  bad = 0;
  EXPECT_TRUE(hasCode(postAll(pair->b.qp, sends, &bad), StatusCode::kResourceExhausted, ENOMEM));
  EXPECT_EQ(bad, sendDepth);

  // Everything accepted before the refusal is carried out, in order.
  for (uint32_t i = 0; i < sendDepth; ++i)
    ASSERT_OK(postReceive(pair->a.qp, 300 + i, {sgeOf(bufA, i * 8, 8)}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->b.sendCq, sendDepth, &completions));
  for (uint32_t i = 0; i < sendDepth; ++i) EXPECT_TRUE(succeeded(completions[i], 200 + i, WcOpcode::kSend));
  EXPECT_TRUE(bytesEqual(bytesOf(bufA, 0, sendDepth * 8), bytesOf(bufB, 32 * kKiB, sendDepth * 8)));

  for (uint32_t i = 0; i < recvDepth; ++i) {
    ASSERT_OK(
        post(pair->a.qp,
             {.opcode = WrOpcode::kSend, .wrId = 400 + i, .sges = {sgeOf(bufA, 16 * kKiB + i * 64, 64)}}));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    ASSERT_TRUE(succeeded(wc, 400 + i, WcOpcode::kSend));
  }
  completions.clear();
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, recvDepth, &completions));
  for (uint32_t i = 0; i < recvDepth; ++i) EXPECT_TRUE(succeeded(completions[i], 100 + i, WcOpcode::kRecv));
  EXPECT_TRUE(bytesEqual(bytesOf(bufB, 0, recvDepth * 64), bytesOf(bufA, 16 * kKiB, recvDepth * 64)));
}

// ============================ error completions ============================

struct AccessCase {
  const char* name;
  WrOpcode opcode;
  uint32_t targetMrAccess = access::kAll;
  uint32_t targetQpAccess = kRemoteAccess;
  bool badRkey = false;
  int64_t offset = 0;  // of the remote address from the start of the region
  uint32_t length = 64;
  bool signaled = true;
  bool otherPd = false;  // the region belongs to another PD than the responder's QP
  // What the requester sees. A QP whose access flags refuse the operation answers "invalid
  // request", as the kernel's rxe does; a region that refuses it answers "remote access".
  WcStatus expected = WcStatus::kRemAccessErr;
};

TEST_P(VerbsConformance, RemoteAccessViolationsFailWithoutTouchingMemory) {
  constexpr uint32_t noRemoteWrite = access::kLocalWrite | access::kRemoteRead | access::kRemoteAtomic;
  constexpr uint32_t noRemoteRead = access::kLocalWrite | access::kRemoteWrite | access::kRemoteAtomic;
  constexpr uint32_t noRemoteAtomic = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;
  constexpr uint32_t qpNoWrite = access::kRemoteRead | access::kRemoteAtomic;
  constexpr uint32_t qpNoRead = access::kRemoteWrite | access::kRemoteAtomic;
  constexpr uint32_t qpNoAtomic = access::kRemoteWrite | access::kRemoteRead;
  const AccessCase cases[] = {
      {.name = "WRITE, bad rkey", .opcode = WrOpcode::kRdmaWrite, .badRkey = true},
      {.name = "WRITE, bad rkey, unsignaled",
       .opcode = WrOpcode::kRdmaWrite,
       .badRkey = true,
       .signaled = false},
      {.name = "WRITE past the end", .opcode = WrOpcode::kRdmaWrite, .offset = 4096 - 32},
      {.name = "WRITE before the start", .opcode = WrOpcode::kRdmaWrite, .offset = -8, .length = 16},
      {.name = "WRITE, region without REMOTE_WRITE",
       .opcode = WrOpcode::kRdmaWrite,
       .targetMrAccess = noRemoteWrite},
      {.name = "WRITE, QP without REMOTE_WRITE",
       .opcode = WrOpcode::kRdmaWrite,
       .targetQpAccess = qpNoWrite,
       .expected = WcStatus::kRemInvReqErr},
      {.name = "WRITE, region of another PD", .opcode = WrOpcode::kRdmaWrite, .otherPd = true},
      {.name = "READ, region of another PD", .opcode = WrOpcode::kRdmaRead, .otherPd = true},
      {.name = "WRITE_WITH_IMM, bad rkey", .opcode = WrOpcode::kRdmaWriteWithImm, .badRkey = true},
      {.name = "READ, bad rkey", .opcode = WrOpcode::kRdmaRead, .badRkey = true},
      {.name = "READ past the end", .opcode = WrOpcode::kRdmaRead, .offset = 4096 - 8},
      {.name = "READ, region without REMOTE_READ",
       .opcode = WrOpcode::kRdmaRead,
       .targetMrAccess = noRemoteRead},
      {.name = "READ, QP without REMOTE_READ",
       .opcode = WrOpcode::kRdmaRead,
       .targetQpAccess = qpNoRead,
       .expected = WcStatus::kRemInvReqErr},
      {.name = "FETCH_ADD, bad rkey", .opcode = WrOpcode::kAtomicFetchAndAdd, .badRkey = true, .length = 8},
      {.name = "FETCH_ADD past the end", .opcode = WrOpcode::kAtomicFetchAndAdd, .offset = 4096, .length = 8},
      {.name = "FETCH_ADD, region without REMOTE_ATOMIC",
       .opcode = WrOpcode::kAtomicFetchAndAdd,
       .targetMrAccess = noRemoteAtomic,
       .length = 8},
      {.name = "CMP_SWAP, QP without REMOTE_ATOMIC",
       .opcode = WrOpcode::kAtomicCmpAndSwp,
       .targetQpAccess = qpNoAtomic,
       .length = 8,
       .expected = WcStatus::kRemInvReqErr},
  };
  for (const AccessCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout, .accessB = c.targetQpAccess}));
    // The region is the middle page of three, so stray accesses on either side show up.
    TestBuffer memory(3 * 4096);
    fillPattern(memory.bytes(), 57);
    v::ProtectionDomain otherPd;
    if (c.otherPd) {
      ASSERT_OK_AND_ASSIGN(otherPd, pair->b.context->allocPd());
    }
    v::ProtectionDomain& regionPd = c.otherPd ? otherPd : pair->b.pd;
    ASSERT_OK_AND_ASSIGN(v::MemoryRegion region,
                         regionPd.registerMemory(memory.data() + 4096, 4096, c.targetMrAccess));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 58));
    ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 59));
    ASSERT_OK(postReceive(pair->b.qp, 900, {sgeOf(inbox, 0, 256)}));

    const uint64_t remote = memory.address(4096) + static_cast<uint64_t>(c.offset);
    ASSERT_OK(postAll(pair->a.qp, {{.opcode = c.opcode,
                                    .wrId = 1,
                                    .sges = {sgeOf(local, 0, c.length)},
                                    .flags = c.signaled ? send_flags::kSignaled : 0u,
                                    .remoteAddr = remote,
                                    .rkey = c.badRkey ? corruptKey(region.rkey()) : region.rkey(),
                                    .imm = 5,
                                    .compareAdd = 1},
                                   {.opcode = WrOpcode::kRdmaWrite,
                                    .wrId = 2,
                                    .sges = {sgeOf(local, 0, 8)},
                                    .remoteAddr = memory.address(4096),
                                    .rkey = region.rkey()}}));
    std::vector<WorkCompletion> completions;
    ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
    EXPECT_TRUE(failedWith(completions[0], 1, c.expected));
    EXPECT_TRUE(failedWith(completions[1], 2, WcStatus::kWrFlushErr));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
    EXPECT_TRUE(reachesState(pair->b.qp, QpState::kErr));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
    EXPECT_EQ(wc.wrId, 900u);
    if (c.opcode == WrOpcode::kRdmaWriteWithImm) {
      // The responder may have taken the receive for this request before the check failed.
      EXPECT_NE(wc.status, WcStatus::kSuccess) << describe(wc);
    } else {
      EXPECT_EQ(wc.status, WcStatus::kWrFlushErr) << describe(wc);
    }
    EXPECT_TRUE(matchesPattern(memory.bytes(), 57)) << "target memory";
    EXPECT_TRUE(matchesPattern(bytesOf(local, 0, local.size()), 58)) << "requester memory";
    EXPECT_TRUE(matchesPattern(bytesOf(inbox, 0, inbox.size()), 59)) << "responder's receive buffer";
  }
}

// As the kernel's rxe: the responder cannot place the message in its receive (a malformed receive
// work request): LOC_QP_OP_ERR there, REM_OP_ERR at the requester.
TEST_P(VerbsConformance, MessageLongerThanTheReceiveIsARemoteOperationError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 60));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 61));
  ASSERT_OK(postReceive(pair->b.qp, 5, {sgeOf(dst, 0, 16)}));
  ASSERT_OK(postReceive(pair->b.qp, 6, {sgeOf(dst, 1024, 16)}));
  ASSERT_OK(postAll(pair->a.qp, {{.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 32)}},
                                 {.opcode = WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 8)}}}));
  std::vector<WorkCompletion> sent, received;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &sent));
  EXPECT_TRUE(failedWith(sent[0], 1, WcStatus::kRemOpErr));
  EXPECT_TRUE(failedWith(sent[1], 2, WcStatus::kWrFlushErr));
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &received));
  EXPECT_TRUE(failedWith(received[0], 5, WcStatus::kLocQpOpErr));
  EXPECT_TRUE(failedWith(received[1], 6, WcStatus::kWrFlushErr));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  EXPECT_TRUE(reachesState(pair->b.qp, QpState::kErr));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024, 3072), 61, 1024));
}

TEST_P(VerbsConformance, BadLocalKeyFailsLocally) {
  struct LocalCase {
    const char* name;
    WrOpcode opcode;
    bool badLkey;
    size_t offset;
    size_t length;
    WcStatus expected;
  };
  // As the kernel's rxe: a source key that names no region fails the request as a local QP
  // operation error; a range outside the region, or a bad key for a READ's destination, as a
  // local protection error.
  const LocalCase cases[] = {
      {"WRITE, bad lkey", WrOpcode::kRdmaWrite, true, 0, 64, WcStatus::kLocQpOpErr},
      {"WRITE, SGE past the region", WrOpcode::kRdmaWrite, false, 4096 - 16, 64, WcStatus::kLocProtErr},
      {"SEND, bad lkey", WrOpcode::kSend, true, 0, 64, WcStatus::kLocQpOpErr},
      {"READ into a bad lkey", WrOpcode::kRdmaRead, true, 0, 64, WcStatus::kLocProtErr},
  };
  for (const LocalCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
    ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 62));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 63));
    ASSERT_OK_AND_ASSIGN(auto inbox, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 64));
    ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(inbox, 0, 4096)}));
    v::Sge sge = sgeOf(local, c.offset, c.length);
    if (c.badLkey) sge.lkey = corruptKey(sge.lkey);
    ASSERT_OK(post(pair->a.qp, rdmaRequest(c.opcode, 7, sge, dst)));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
    EXPECT_TRUE(failedWith(wc, 7, c.expected));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
    EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 63));
    EXPECT_TRUE(matchesPattern(bytesOf(inbox, 0, 4096), 64));
    EXPECT_TRUE(matchesPattern(bytesOf(local, 0, 4096), 62));
  }
}

// One post of several WRITEs naming the same lkey: a later one whose range runs past the region
// fails with a local protection error, though an earlier one of the same key passed (a check made
// once for the key must still be made for each range); the ones before it land, it and what
// follows move nothing.
TEST_P(VerbsConformance, ABatchChecksEachRangeOfARepeatedLocalKey) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 67));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 68));
  // One WRITE first, so the connection is up and a provider's batch path (if any) is ready.
  WorkCompletion first;
  ASSERT_OK(post(pair->a.qp, rdmaRequest(WrOpcode::kRdmaWrite, 9, sgeOf(local, 0, 64), dst)));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &first));
  ASSERT_EQ(first.status, WcStatus::kSuccess);
  std::vector<SendOp> ops;
  for (uint64_t i = 0; i < 4; ++i) {
    const size_t offset = i == 2 ? 4096 - 16 : i * 64;  // the third runs 48 bytes past the region
    ops.push_back(rdmaRequest(WrOpcode::kRdmaWrite, 10 + i, sgeOf(local, offset, 64), dst, 1024 + i * 64));
  }
  ASSERT_OK(postAll(pair->a.qp, ops));
  std::vector<WorkCompletion> wcs;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &wcs));
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wcs[1].status, WcStatus::kSuccess);
  EXPECT_TRUE(failedWith(wcs[2], 12, WcStatus::kLocProtErr));
  EXPECT_TRUE(failedWith(wcs[3], 13, WcStatus::kWrFlushErr));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 1024, 128), bytesOf(local, 0, 128)));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 64, 1024 - 64), 68, 64));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 1024 + 128, 4096 - 1024 - 128), 68, 1024 + 128))
      << "the failed WRITE or the one after it moved bytes";
}

TEST_P(VerbsConformance, BadKeyInTheResponderReceiveIsARemoteOperationError) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 65));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kLocalWrite, 66));
  v::Sge sge = sgeOf(dst, 0, 256);
  sge.lkey = corruptKey(sge.lkey);
  ASSERT_OK(postReceive(pair->b.qp, 3, {sge}));
  WorkCompletion wc;
  ASSERT_TRUE(postAndWait(pair->a, {.opcode = WrOpcode::kSend, .wrId = 4, .sges = {sgeOf(src, 0, 32)}}, &wc));
  EXPECT_TRUE(failedWith(wc, 4, WcStatus::kRemOpErr));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(failedWith(wc, 3, WcStatus::kLocQpOpErr));  // as the kernel's rxe
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, 4096), 66));
  EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
}

TEST_P(VerbsConformance, ResultIntoRegionWithoutLocalWriteIsALocalProtectionError) {
  for (WrOpcode opcode : {WrOpcode::kRdmaRead, WrOpcode::kAtomicFetchAndAdd}) {
    SCOPED_TRACE(opcode == WrOpcode::kRdmaRead ? "READ" : "FETCH_ADD");
    ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
    ASSERT_OK_AND_ASSIGN(auto readOnly, registerBuffer(pair->a.pd, 4096, access::kRemoteRead, 67));
    ASSERT_OK_AND_ASSIGN(auto remote, registerBuffer(pair->b.pd, 4096, access::kAll, 68));
    SendOp request = rdmaRequest(opcode, 1, sgeOf(readOnly, 0, 8), remote);
    request.compareAdd = 1;  // taken by the FETCH_ADD
    WorkCompletion wc;
    ASSERT_TRUE(postAndWait(pair->a, request, &wc));
    EXPECT_TRUE(failedWith(wc, 1, WcStatus::kLocProtErr));
    EXPECT_TRUE(matchesPattern(bytesOf(readOnly, 0, 4096), 67));
    EXPECT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  }
}

TEST_P(VerbsConformance, ErrorFlushesEverythingOutstandingAndLater) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.link = kShortTimeout}));
  ASSERT_OK_AND_ASSIGN(auto bufA, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 69));
  ASSERT_OK_AND_ASSIGN(auto bufB, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 70));
  for (uint64_t id = 50; id < 53; ++id) ASSERT_OK(postReceive(pair->a.qp, id, {sgeOf(bufA, 32 * kKiB, 64)}));
  for (uint64_t id = 60; id < 62; ++id) ASSERT_OK(postReceive(pair->b.qp, id, {sgeOf(bufB, 32 * kKiB, 64)}));
  ASSERT_OK(postAll(pair->a.qp, {rdmaRequest(WrOpcode::kRdmaWrite, 1, sgeOf(bufA, 0, 1024), bufB),
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 2,
                                  .sges = {sgeOf(bufA, 0, 1024)},
                                  .remoteAddr = bufB.address(4096),
                                  .rkey = corruptKey(bufB.mr.rkey())},
                                 {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(bufA, 0, 16)}},
                                 rdmaRequest(WrOpcode::kRdmaRead, 4, sgeOf(bufA, 8192, 1024), bufB),
                                 {.opcode = WrOpcode::kRdmaWrite,
                                  .wrId = 5,
                                  .sges = {sgeOf(bufA, 0, 1024)},
                                  .flags = 0,
                                  .remoteAddr = bufB.address(8192),
                                  .rkey = bufB.mr.rkey()}}));
  std::vector<WorkCompletion> sent;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 4, &sent));
  EXPECT_TRUE(succeeded(sent[0], 1, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(failedWith(sent[1], 2, WcStatus::kRemAccessErr));
  EXPECT_TRUE(failedWith(sent[2], 3, WcStatus::kWrFlushErr));
  EXPECT_TRUE(failedWith(sent[3], 4, WcStatus::kWrFlushErr));
  // WR 5 is unsignaled: flushed requests complete even so (libibverbs flushes every WR).
  sent.clear();
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 1, &sent));
  EXPECT_TRUE(failedWith(sent[0], 5, WcStatus::kWrFlushErr));

  std::vector<WorkCompletion> received;
  ASSERT_TRUE(pollCompletions(pair->a.recvCq, 3, &received));
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(failedWith(received[i], 50 + i, WcStatus::kWrFlushErr));
  received.clear();
  ASSERT_TRUE(pollCompletions(pair->b.recvCq, 2, &received));
  for (uint64_t i = 0; i < 2; ++i) EXPECT_TRUE(failedWith(received[i], 60 + i, WcStatus::kWrFlushErr));

  // Work posted to a QP in ERR completes at once with WR_FLUSH_ERR.
  ASSERT_TRUE(reachesState(pair->a.qp, QpState::kErr));
  ASSERT_OK(post(pair->a.qp, rdmaRequest(WrOpcode::kRdmaWrite, 6, sgeOf(bufA, 0, 8), bufB)));
  ASSERT_OK(postReceive(pair->a.qp, 53, {sgeOf(bufA, 32 * kKiB, 64)}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_TRUE(failedWith(wc, 6, WcStatus::kWrFlushErr));
  ASSERT_TRUE(pollOne(pair->a.recvCq, &wc));
  EXPECT_TRUE(failedWith(wc, 53, WcStatus::kWrFlushErr));

  EXPECT_TRUE(bytesEqual(bytesOf(bufB, 0, 1024), bytesOf(bufA, 0, 1024)))
      << "WR 1 completed before the error";
  EXPECT_TRUE(matchesPattern(bytesOf(bufB, 1024, 31 * kKiB), 70, 1024)) << "nothing after WR 1 was written";
  EXPECT_TRUE(matchesPattern(bytesOf(bufA, 8192, 1024), 69, 8192)) << "the flushed READ wrote nothing";
}

}  // namespace
}  // namespace ferry::test
