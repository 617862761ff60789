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
class VerbsConformance : public VerbsTest {};

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

// Waits for an async event of `type` on context, skipping others (which are listed on failure).
::testing::AssertionResult waitAsyncEvent(v::Context& context, v::AsyncEventType type, v::AsyncEvent* out,
                                          milliseconds timeout = kWaitTimeout);

// Moves both QPs of pair to RESET and connects them again with fresh paths (new PSNs).
::testing::AssertionResult resetAndReconnect(ConnectedPair& pair, const LinkOptions& link = {},
                                             uint32_t accessA = kRemoteAccess,
                                             uint32_t accessB = kRemoteAccess);

}  // namespace ferry::test
