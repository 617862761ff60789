// The verbs conformance suite: what every ferry device must do, written once against the public
// verbs API and run over every provider path (tests/support/verbs_fixture.h). The expected
// behaviour is libibverbs' (docs: shared notes "verbs semantics"); rxe is the referee.
//
// One binary, conformance_test: conformance_test.cc instantiates the suite over the provider paths,
// conformance_<topic>.cc hold its cases by topic, and this header the fixture, constants and checks
// they share (defined in conformance.cc).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "support/verbs_fixture.h"

namespace ferry::test {

namespace v = ferry::verbs;
namespace access = ferry::verbs::access;
namespace send_flags = ferry::verbs::send_flags;
using std::chrono::milliseconds;
using v::QpState;
using v::WcOpcode;
using v::WcStatus;
using v::WorkCompletion;
using v::WrOpcode;

// Every case of the suite is a TEST_P of this fixture; conformance_test.cc instantiates it once per
// provider path, so a case is named Providers/VerbsConformance.<Case>/<path>.
class VerbsConformance : public VerbsTest {
 protected:
  // Two sides, each with its own context (CQs of 64 entries) and an RC QP still in RESET, and the
  // local half of each one's path (makeLocalPath): for cases that bring the QPs up by hand, or
  // never reach the peer.
  Status openUnconnected(Side& a, Side& b, v::Path* localA, v::Path* localB) const;
};

inline constexpr size_t kKiB = 1024;
inline constexpr size_t kMiB = 1024 * 1024;

// A fast-failing link for tests that wait for a transport timeout: 4.096 us * 2^12 = 16.8 ms per
// try, 3 tries.
inline constexpr LinkOptions kShortTimeout{.timeout = 12, .retries = 2};
// Upper bound for "the peer is gone" to surface as a completion.
inline constexpr milliseconds kPeerLossBound{5000};

// ---- byte-exact transfers of every size (WRITE, READ and SEND) ----

inline constexpr size_t kSizes[] = {0, 1, 7, 4096, 65537, 1 * kMiB, 64 * kMiB};
inline constexpr size_t kLargest = 64 * kMiB;
// Odd offsets on both sides, and guard bytes after the destination that must stay untouched.
inline constexpr size_t kSrcOffset = 3;
inline constexpr size_t kDstOffset = 5;
inline constexpr size_t kGuard = 61;

// The largest message the device takes (PortAttr::maxMsgSz); sizes above it are not tried.
size_t maxMessage(const v::Context& context);

// One transfer of a byte-exact sweep (forEachSize): the size it moves, its request's wr_id (1 for
// the first size moved, then 2, ...), and the seed of the pattern the destination held before it.
struct SweepStep {
  size_t size = 0;
  uint64_t wrId = 0;
  uint64_t seed = 0;
};
// For each size of kSizes the device on `context` carries (maxMessage), in order: fills
// `destination` from its start to past the guard bytes with the pattern seedBase + size, then runs
// `transfer` under a SCOPED_TRACE naming the size. Stops after the first fatal failure, as a loop
// written in the case would (call it under ASSERT_NO_FATAL_FAILURE).
void forEachSize(const v::Context& context, const RegisteredBuffer& destination, uint64_t seedBase,
                 const std::function<void(const SweepStep& step)>& transfer);

// The `size` bytes at kDstOffset of dst equal source, and the guard bytes on both sides still hold
// the pattern `seed` that filled them before the transfer.
::testing::AssertionResult placedWithGuards(const RegisteredBuffer& dst, std::span<const uint8_t> source,
                                            size_t size, uint64_t seed);

// ---- memory, completions, events, reconnection ----

// A writable view of test memory (bytesOf's is read-only), for refilling a pattern.
std::span<uint8_t> writableBytes(const RegisteredBuffer& buffer, size_t offset, size_t length);

// The completion succeeded, for request wrId, with this opcode.
::testing::AssertionResult succeeded(const WorkCompletion& wc, uint64_t wrId, WcOpcode opcode);
// The completion for request wrId failed with this status.
::testing::AssertionResult failedWith(const WorkCompletion& wc, uint64_t wrId, WcStatus status);

// A signaled request of `opcode` (an RDMA WRITE, READ or WRITE_WITH_IMM, or an atomic) with the one
// SGE `local`, aimed at `remote` + remoteOffset under remote's own rkey: the request most cases
// post. A case that needs one field more (an immediate, other flags, a compare value) sets it on
// the result; one that aims elsewhere or under another key writes the request out in full.
SendOp rdmaRequest(WrOpcode opcode, uint64_t wrId, const v::Sge& local, const RegisteredBuffer& remote,
                   size_t remoteOffset = 0);

// Posts `op` on side's QP and waits for its completion on side's send CQ, into *wc: fails when the
// post is refused or nothing completes within kWaitTimeout. What the completion says is the case's
// to check.
::testing::AssertionResult postAndWait(Side& side, const SendOp& op, WorkCompletion* wc);

// A request the responder never carries out (its context gone, its receives missing) and the one
// posted right behind it: the first fails with `status`, the second is flushed.
struct FailedThenFlushed {
  uint64_t failedId = 0;
  WcStatus status = WcStatus::kSuccess;
  uint64_t flushedId = 0;
};
// Waits for the two completions on side's send CQ and expects them within kPeerLossBound of
// `start`, in post order and as `requests` says, and the QP then in ERR. Missing completions are a
// fatal failure (call it under ASSERT_NO_FATAL_FAILURE).
void expectFailedThenFlushed(Side& side, Clock::time_point start, const FailedThenFlushed& requests);

// The two completions of one message from pair.a to pair.b (a SEND, or a WRITE_WITH_IMM, which
// consumes a receive too): the request's on a's send CQ, then the receive's on b's receive CQ.
struct Delivery {
  uint64_t sendId = 0;
  WcOpcode sent = WcOpcode::kSend;
  uint64_t recvId = 0;
  WcOpcode received = WcOpcode::kRecv;
};
// Waits for the request's completion and expects it to have succeeded, then the same for the
// receive's, which it leaves in *wc for the case's own checks (byte_len, the immediate). A missing
// completion is a fatal failure (call it under ASSERT_NO_FATAL_FAILURE).
void expectDelivered(ConnectedPair& pair, const Delivery& delivery, WorkCompletion* wc);

// Waits for an async event of `type` on context, skipping others (which are listed on failure).
::testing::AssertionResult waitAsyncEvent(v::Context& context, v::AsyncEventType type, v::AsyncEvent* out,
                                          milliseconds timeout = kWaitTimeout);

// Moves both QPs of pair to RESET and connects them again with fresh paths (new PSNs).
::testing::AssertionResult resetAndReconnect(ConnectedPair& pair, const LinkOptions& link = {},
                                             uint32_t accessA = kRemoteAccess,
                                             uint32_t accessB = kRemoteAccess);

}  // namespace ferry::test
