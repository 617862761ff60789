// The posting rules the verbs layer applies once for every provider (src/verbs/posting.h): what a
// QP's type and capabilities forbid is refused before the provider sees it, the requests before a
// refused one reach the provider, and a provider's own refusal among those comes first. The same
// rules on real devices run in the conformance suite (PostRefusesTooManySgesAndOversizedInline,
// MisalignedAtomicIsRefusedAtPost, the UC and UD suites) on every provider.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/verbs/verbs.h"

namespace ferry::verbs {
namespace {

// A provider's QP that records what reaches it, and refuses at a given index when told to.
class RecordingQp : public QpImpl {
 public:
  RecordingQp(QpType type, QpCap cap) : type_(type), cap_(cap) {}
  uint32_t qpNum() const override { return 7; }
  QpType type() const override { return type_; }
  Status modify(const QpAttr&, uint32_t) override { return notSupported("recording QP"); }
  Result<QpAttr> query() override { return notSupported("recording QP"); }
  QpCap cap() const override { return cap_; }
  Status postSend(std::span<const SendWr> wrs, size_t* badIndex) override {
    return take(wrs.size(), badIndex, &sends);
  }
  Status postRecv(std::span<const RecvWr> wrs, size_t* badIndex) override {
    return take(wrs.size(), badIndex, &recvs);
  }
  void close() override {}

  std::vector<size_t> sends;  // the number of requests of each postSend that reached the provider
  std::vector<size_t> recvs;
  size_t refuseAt = SIZE_MAX;  // the provider refuses the request at this index (queue full)

 private:
  Status take(size_t count, size_t* badIndex, std::vector<size_t>* calls) {
    calls->push_back(count);
    if (refuseAt < count) {
      if (badIndex) *badIndex = refuseAt;
      return resourceExhausted("recording QP: queue full");
    }
    return Status::ok();
  }
  QpType type_;
  QpCap cap_;
};

class RecordingSrq : public SrqImpl {
 public:
  explicit RecordingSrq(uint32_t maxSge) : maxSge_(maxSge) {}
  uint32_t maxSge() const override { return maxSge_; }
  Status postRecv(std::span<const RecvWr> wrs, size_t*) override {
    recvs.push_back(wrs.size());
    return Status::ok();
  }
  Status armLimit(uint32_t) override { return Status::ok(); }
  Result<SrqInit> query() override { return SrqInit{}; }
  void close() override {}

  std::vector<size_t> recvs;

 private:
  uint32_t maxSge_;
};

constexpr QpCap kCap{.maxSendWr = 16, .maxRecvWr = 16, .maxSendSge = 2, .maxRecvSge = 2, .maxInlineData = 64};

bool refusedWithEinval(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument && status.cause() == EINVAL;
}

struct Sges {
  std::vector<Sge> list;
  explicit Sges(std::vector<uint32_t> lengths) {
    for (uint32_t length : lengths) list.push_back(Sge{.addr = 0x1000, .length = length, .lkey = 1});
  }
};

SendWr sendWr(WrOpcode opcode, const Sges& sges, uint32_t flags = 0, uint64_t atomicAddr = 0x2000) {
  SendWr wr;
  wr.opcode = opcode;
  wr.sendFlags = flags;
  wr.sgList = sges.list;
  wr.atomic.remoteAddr = atomicAddr;
  return wr;
}

TEST(Posting, WhatTheCapabilitiesForbidIsRefusedBeforeTheProvider) {
  const Sges one({8}), two({8, 8}), three({8, 8, 8}), inlineMax({64}), inlineOver({65}), short4({4}),
      two8({4, 4});
  struct Case {
    std::string why;
    QpType type;
    SendWr wr;
  };
  const std::vector<Case> cases = {
      {"unknown opcode", QpType::kRc, sendWr(static_cast<WrOpcode>(7), one)},
      {"more SGEs than max_send_sge", QpType::kRc, sendWr(WrOpcode::kSend, three)},
      {"inline data above max_inline_data", QpType::kRc,
       sendWr(WrOpcode::kRdmaWrite, inlineOver, send_flags::kInline)},
      {"inline READ", QpType::kRc, sendWr(WrOpcode::kRdmaRead, one, send_flags::kInline)},
      {"inline atomic", QpType::kRc, sendWr(WrOpcode::kAtomicFetchAndAdd, one, send_flags::kInline)},
      {"atomic of 4 bytes", QpType::kRc, sendWr(WrOpcode::kAtomicCmpAndSwp, short4)},
      {"atomic of two SGEs", QpType::kRc, sendWr(WrOpcode::kAtomicFetchAndAdd, two8)},
      {"misaligned atomic", QpType::kRc, sendWr(WrOpcode::kAtomicFetchAndAdd, one, 0, 0x2004)},
      {"READ on UC", QpType::kUc, sendWr(WrOpcode::kRdmaRead, one)},
      {"atomic on UC", QpType::kUc, sendWr(WrOpcode::kAtomicCmpAndSwp, one)},
      {"WRITE on UD", QpType::kUd, sendWr(WrOpcode::kRdmaWrite, one)},
      {"READ on UD", QpType::kUd, sendWr(WrOpcode::kRdmaRead, one)},
  };
  for (const Case& c : cases) {
    auto impl = std::make_shared<RecordingQp>(c.type, kCap);
    QueuePair qp(impl);
    size_t bad = 99;
    Status st = qp.postSend(std::span<const SendWr>(&c.wr, 1), &bad);
    EXPECT_TRUE(refusedWithEinval(st)) << c.why << ": " << st.toString();
    EXPECT_EQ(bad, 0u) << c.why;
    EXPECT_TRUE(impl->sends.empty()) << c.why << ": the provider saw the request";
  }
  // At the limits, everything passes to the provider.
  const std::vector<Case> allowed = {
      {"max_send_sge SGEs", QpType::kRc, sendWr(WrOpcode::kSend, two)},
      {"max_inline_data inline", QpType::kRc, sendWr(WrOpcode::kSend, inlineMax, send_flags::kInline)},
      {"aligned 8-byte atomic", QpType::kRc, sendWr(WrOpcode::kAtomicCmpAndSwp, one)},
      {"WRITE_WITH_IMM on UC", QpType::kUc, sendWr(WrOpcode::kRdmaWriteWithImm, one)},
      {"SEND_WITH_IMM on UD", QpType::kUd, sendWr(WrOpcode::kSendWithImm, one)},
  };
  for (const Case& c : allowed) {
    auto impl = std::make_shared<RecordingQp>(c.type, kCap);
    QueuePair qp(impl);
    EXPECT_TRUE(qp.postSend(c.wr).isOk()) << c.why;
    EXPECT_EQ(impl->sends, std::vector<size_t>{1}) << c.why;
  }
}

TEST(Posting, TheRequestsBeforeARefusedOneReachTheProviderAndNoneAfterIt) {
  const Sges one({8}), three({8, 8, 8});
  auto impl = std::make_shared<RecordingQp>(QpType::kRc, kCap);
  QueuePair qp(impl);
  std::vector<SendWr> wrs = {sendWr(WrOpcode::kSend, one), sendWr(WrOpcode::kRdmaWrite, one),
                             sendWr(WrOpcode::kSend, three), sendWr(WrOpcode::kSend, one)};
  size_t bad = 99;
  EXPECT_TRUE(refusedWithEinval(qp.postSend(wrs, &bad)));
  EXPECT_EQ(bad, 2u);
  EXPECT_EQ(impl->sends, std::vector<size_t>{2});
  // The provider refuses one of those before it (a full queue): its refusal and index come back.
  impl->sends.clear();
  impl->refuseAt = 1;
  bad = 99;
  Status st = qp.postSend(wrs, &bad);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.toString();
  EXPECT_EQ(bad, 1u);
  EXPECT_EQ(impl->sends, std::vector<size_t>{2});
  // A list whose first request is refused reaches the provider not at all.
  impl->sends.clear();
  bad = 99;
  EXPECT_TRUE(refusedWithEinval(qp.postSend(std::span<const SendWr>(wrs).subspan(2), &bad)));
  EXPECT_EQ(bad, 0u);
  EXPECT_TRUE(impl->sends.empty());
}

TEST(Posting, ReceivesAreCheckedAgainstTheirQueuesSgeLimit) {
  const Sges two({8, 8}), three({8, 8, 8});
  auto impl = std::make_shared<RecordingQp>(QpType::kRc, kCap);
  QueuePair qp(impl);
  std::vector<RecvWr> recvs = {{.wrId = 1, .sgList = two.list}, {.wrId = 2, .sgList = three.list}};
  size_t bad = 99;
  EXPECT_TRUE(refusedWithEinval(qp.postRecv(recvs, &bad)));
  EXPECT_EQ(bad, 1u);
  EXPECT_EQ(impl->recvs, std::vector<size_t>{1});

  auto srqImpl = std::make_shared<RecordingSrq>(2);
  SharedReceiveQueue srq(srqImpl);
  bad = 99;
  EXPECT_TRUE(refusedWithEinval(srq.postRecv(recvs, &bad)));
  EXPECT_EQ(bad, 1u);
  EXPECT_EQ(srqImpl->recvs, std::vector<size_t>{1});
  EXPECT_TRUE(srq.postRecv(recvs[0]).isOk());
  EXPECT_EQ(srqImpl->recvs, (std::vector<size_t>{1, 1}));
}

}  // namespace
}  // namespace ferry::verbs
