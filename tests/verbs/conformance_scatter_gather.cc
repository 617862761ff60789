// Work requests of several SGEs and inline data: gather on SEND and WRITE, scatter on receive
// and READ, the device's maximum SGE counts, and inline data copied at post time.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

// What dst looks like after the bytes named by srcSges (in order) are scattered over dstSges.
std::vector<uint8_t> scatterImage(const uint8_t* srcBase,
                                  const std::vector<std::pair<size_t, size_t>>& srcSges,
                                  std::span<const uint8_t> dstBefore,
                                  const std::vector<std::pair<size_t, size_t>>& dstSges) {
  std::vector<uint8_t> stream;
  for (auto [offset, length] : srcSges)
    stream.insert(stream.end(), srcBase + offset, srcBase + offset + length);
  std::vector<uint8_t> image(dstBefore.begin(), dstBefore.end());
  size_t at = 0;
  for (auto [offset, length] : dstSges) {
    const size_t n = std::min(length, stream.size() - at);
    std::copy_n(stream.begin() + static_cast<std::ptrdiff_t>(at), n,
                image.begin() + static_cast<std::ptrdiff_t>(offset));
    at += n;
  }
  return image;
}

std::vector<v::Sge> sgesOf(const RegisteredBuffer& buffer,
                           const std::vector<std::pair<size_t, size_t>>& ranges) {
  std::vector<v::Sge> sges;
  for (auto [offset, length] : ranges) sges.push_back(sgeOf(buffer, offset, length));
  return sges;
}

TEST_P(VerbsConformance, GatherOnSendAndScatterOnReceive) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 8192, access::kLocalWrite, 29));
  ASSERT_OK_AND_ASSIGN(auto src2, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 30));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 8192, access::kAll, 31));
  // 100 + 300 (one region) + 7 (another region) bytes into 50 + 300 + 100 bytes of receive.
  std::vector<uint8_t> before(dst.data(), dst.data() + dst.size());
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 50), sgeOf(dst, 200, 300), sgeOf(dst, 600, 100)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 100), sgeOf(src, 1000, 300), sgeOf(src2, 5, 7)}}));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(expectDelivered(*pair, {.sendId = 2, .recvId = 1}, &wc));
  EXPECT_EQ(wc.byteLen, 407u);
  std::vector<uint8_t> stream(src.data(), src.data() + 100);
  stream.insert(stream.end(), src.data() + 1000, src.data() + 1300);
  stream.insert(stream.end(), src2.data() + 5, src2.data() + 12);
  std::vector<uint8_t> expected = before;
  std::copy_n(stream.begin(), 50, expected.begin());
  std::copy_n(stream.begin() + 50, 300, expected.begin() + 200);
  std::copy_n(stream.begin() + 350, 57, expected.begin() + 600);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, dst.size()), expected));

  // WRITE gathers the same way into one remote range.
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaWrite,
                           .wrId = 3,
                           .sges = {sgeOf(src, 0, 100), sgeOf(src, 1000, 300), sgeOf(src2, 5, 7)},
                           .remoteAddr = dst.address(4096),
                           .rkey = dst.mr.rkey()},
                          &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kRdmaWrite));
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 4096, 407), stream));
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 4096 + 407, 100), 31, 4096 + 407));

  // READ scatters one remote range over several local SGEs.
  ASSERT_OK_AND_ASSIGN(auto local, registerBuffer(pair->a.pd, 4096, access::kLocalWrite, 32));
  std::vector<uint8_t> localBefore(local.data(), local.data() + local.size());
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaRead,
                           .wrId = 4,
                           .sges = {sgeOf(local, 10, 20), sgeOf(local, 100, 30)},
                           .remoteAddr = dst.address(4096),
                           .rkey = dst.mr.rkey()},
                          &wc));
  EXPECT_TRUE(succeeded(wc, 4, WcOpcode::kRdmaRead));
  std::vector<uint8_t> localExpected =
      scatterImage(dst.data(), {{4096, 50}}, localBefore, {{10, 20}, {100, 30}});
  EXPECT_TRUE(bytesEqual(bytesOf(local, 0, local.size()), localExpected));
}

TEST_P(VerbsConformance, MaximumSgeCountsWork) {
  ASSERT_OK_AND_ASSIGN(v::Context probe, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, probe.queryDevice());
  const uint32_t k = static_cast<uint32_t>(std::min(device.maxSge, 16));
  const uint32_t kRead = static_cast<uint32_t>(std::min({device.maxSgeRd, device.maxSge, 16}));
  const QpOptions wide{.cap = {.maxSendWr = 16, .maxRecvWr = 16, .maxSendSge = k, .maxRecvSge = k}};
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = wide, .qpB = wide}));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * kKiB, access::kAll, 33));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * kKiB, access::kAll, 34));

  std::vector<std::pair<size_t, size_t>> gather, scatter;
  size_t total = 0;
  for (uint32_t i = 0; i < k; ++i) {
    gather.push_back({i * 1000 + i, (i + 1) * 7});
    total += (i + 1) * 7;
  }
  for (uint32_t i = 0; i < k; ++i) scatter.push_back({i * 2000 + 3, total / k + 1});
  std::vector<uint8_t> before(dst.data(), dst.data() + dst.size());
  ASSERT_OK(postReceive(pair->b.qp, 1, sgesOf(dst, scatter)));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend, .wrId = 2, .sges = sgesOf(src, gather)}));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(expectDelivered(*pair, {.sendId = 2, .recvId = 1}, &wc));
  EXPECT_EQ(wc.byteLen, total);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, dst.size()), scatterImage(src.data(), gather, before, scatter)));

  // READ into kRead local SGEs.
  std::vector<std::pair<size_t, size_t>> readScatter;
  size_t readTotal = 0;
  for (uint32_t i = 0; i < kRead; ++i) {
    readScatter.push_back({32 * kKiB + i * 500, 11 + i});
    readTotal += 11 + i;
  }
  std::vector<uint8_t> srcBefore(src.data(), src.data() + src.size());
  ASSERT_TRUE(postAndWait(pair->a,
                          {.opcode = WrOpcode::kRdmaRead,
                           .wrId = 3,
                           .sges = sgesOf(src, readScatter),
                           .remoteAddr = dst.address(40 * kKiB),
                           .rkey = dst.mr.rkey()},
                          &wc));
  EXPECT_TRUE(succeeded(wc, 3, WcOpcode::kRdmaRead));
  EXPECT_TRUE(bytesEqual(bytesOf(src, 0, src.size()),
                         scatterImage(dst.data(), {{40 * kKiB, readTotal}}, srcBefore, readScatter)));
}

TEST_P(VerbsConformance, InlineDataIsCopiedAtPostTime) {
  ASSERT_OK_AND_ASSIGN(v::Context probe, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, probe.queryDevice());
  if (device.maxInlineData == 0) GTEST_SKIP() << providerPath().device << " offers no inline data";
  const uint32_t inlineCap = std::min<uint32_t>(device.maxInlineData, 64);
  QpOptions withInline;
  withInline.cap.maxInlineData = inlineCap;
  ASSERT_OK_AND_ASSIGN(auto pair, makePair({.qpA = withInline}));
  ASSERT_OK_AND_ASSIGN(v::QpAttr attr, pair->a.qp.query());
  EXPECT_GE(attr.cap.maxInlineData, inlineCap);
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, access::kAll, 35));

  // Unregistered memory (lkey 0), overwritten as soon as postSend returns.
  std::vector<uint8_t> scratch(inlineCap);
  fillPattern(scratch, 36);
  const v::Sge sge{.addr = reinterpret_cast<uint64_t>(scratch.data()), .length = inlineCap, .lkey = 0};
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 1024)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kSend,
                              .wrId = 2,
                              .sges = {sge},
                              .flags = send_flags::kSignaled | send_flags::kInline}));
  std::fill(scratch.begin(), scratch.end(), 0);
  ASSERT_OK(post(pair->a.qp, {.opcode = WrOpcode::kRdmaWrite,
                              .wrId = 3,
                              .sges = {sge},
                              .flags = send_flags::kSignaled | send_flags::kInline,
                              .remoteAddr = dst.address(2048),
                              .rkey = dst.mr.rkey()}));
  fillPattern(scratch, 37);
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(pair->a.sendCq, 2, &completions));
  EXPECT_TRUE(succeeded(completions[0], 2, WcOpcode::kSend));
  EXPECT_TRUE(succeeded(completions[1], 3, WcOpcode::kRdmaWrite));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_TRUE(succeeded(wc, 1, WcOpcode::kRecv));
  EXPECT_EQ(wc.byteLen, inlineCap);
  EXPECT_TRUE(matchesPattern(bytesOf(dst, 0, inlineCap), 36));
  EXPECT_TRUE(std::all_of(dst.data() + 2048, dst.data() + 2048 + inlineCap, [](uint8_t x) { return x == 0; }))
      << "the inline WRITE carries the bytes as they were at post time";
}

}  // namespace
}  // namespace ferry::test
