#include "providers/soft/wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ferry::soft::wire {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes encode(const FrameHeader& h) {
  std::array<uint8_t, kMaxHeaderLen> buffer{};
  size_t n = encodeHeader(h, buffer.data());
  return Bytes(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(n));
}

void put16(Bytes& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}
void put32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(Bytes& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

void expectSameFields(const FrameHeader& a, const FrameHeader& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.flags, b.flags);
  EXPECT_EQ(a.payloadLen, b.payloadLen);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.qpn, b.qpn);
  EXPECT_EQ(a.aux, b.aux);
  EXPECT_EQ(a.remoteAddr, b.remoteAddr);
  EXPECT_EQ(a.rkey, b.rkey);
  EXPECT_EQ(a.length, b.length);
  EXPECT_EQ(a.compareAdd, b.compareAdd);
  EXPECT_EQ(a.swap, b.swap);
  EXPECT_EQ(a.atomicResult, b.atomicResult);
  EXPECT_EQ(a.srcQpn, b.srcQpn);
  EXPECT_EQ(a.psn, b.psn);
  EXPECT_EQ(a.maxRdAtomic, b.maxRdAtomic);
  EXPECT_EQ(a.srcGid, b.srcGid);
  EXPECT_EQ(a.qkey, b.qkey);
  EXPECT_EQ(a.nonce, b.nonce);
  EXPECT_EQ(a.sharePid, b.sharePid);
  EXPECT_EQ(a.shareFd, b.shareFd);
  EXPECT_EQ(a.shareCookie, b.shareCookie);
  EXPECT_EQ(a.ringTicket, b.ringTicket);
  EXPECT_EQ(a.stripeTicket, b.stripeTicket);
  EXPECT_EQ(a.route.present, b.route.present);
  EXPECT_EQ(a.route.dgid, b.route.dgid);
  EXPECT_EQ(a.route.flowLabel, b.route.flowLabel);
  EXPECT_EQ(a.route.trafficClass, b.route.trafficClass);
  EXPECT_EQ(a.route.hopLimit, b.route.hopLimit);
  EXPECT_EQ(a.route.grh, b.route.grh);
}

// One frame of each type, with every field that type carries set to a distinctive value.
std::vector<FrameHeader> oneOfEachType() {
  std::vector<FrameHeader> frames;
  FrameHeader hello{.type = FrameType::kHello, .seq = 0, .qpn = 0x00beef};
  hello.srcQpn = 0x00cafe;
  hello.psn = 0xabcdef;
  hello.maxRdAtomic = 16;
  for (size_t i = 0; i < hello.srcGid.size(); ++i) hello.srcGid[i] = static_cast<uint8_t>(0xf0 + i);
  hello.nonce = 0x0123456789abcdefULL;
  frames.push_back(hello);
  frames.push_back({.type = FrameType::kHelloReply,
                    .qpn = 0x00cafe,
                    .aux = static_cast<uint32_t>(HelloResult::kMismatch)});
  frames.push_back(
      {.type = FrameType::kSend, .flags = kFlagSolicited, .payloadLen = 4096, .seq = 100, .qpn = 9});
  frames.push_back({.type = FrameType::kSendImm, .payloadLen = 1, .seq = 101, .qpn = 9, .aux = 0xdeadbeef});
  frames.push_back({.type = FrameType::kWrite,
                    .payloadLen = 65536,
                    .seq = 0xffffff,
                    .qpn = 9,
                    .remoteAddr = 0x00007f0012345000ULL,
                    .rkey = 0x1234});
  frames.push_back({.type = FrameType::kWriteImm,
                    .payloadLen = 0,
                    .seq = 5,
                    .qpn = 9,
                    .aux = 7,
                    .remoteAddr = 0x1000,
                    .rkey = 0x99});
  frames.push_back({.type = FrameType::kReadReq,
                    .seq = 6,
                    .qpn = 9,
                    .remoteAddr = 0x2000,
                    .rkey = 0x77,
                    .length = kMaxMessage});
  frames.push_back({.type = FrameType::kCmpSwap,
                    .seq = 7,
                    .qpn = 9,
                    .remoteAddr = 0x3008,
                    .rkey = 0x55,
                    .compareAdd = 0x1111222233334444ULL,
                    .swap = 0x5555666677778888ULL});
  frames.push_back({.type = FrameType::kFetchAdd,
                    .seq = 8,
                    .qpn = 9,
                    .remoteAddr = 0x3010,
                    .rkey = 0x55,
                    .compareAdd = std::numeric_limits<uint64_t>::max()});
  frames.push_back({.type = FrameType::kAck, .seq = 8, .qpn = 3});
  frames.push_back({.type = FrameType::kNak,
                    .flags = 14,
                    .seq = 9,
                    .qpn = 3,
                    .aux = static_cast<uint32_t>(Syndrome::kRnr)});
  frames.push_back({.type = FrameType::kReadResp, .payloadLen = kMaxMessage, .seq = 6, .qpn = 3});
  frames.push_back(
      {.type = FrameType::kAtomicResp, .seq = 7, .qpn = 3, .atomicResult = 0xfedcba9876543210ULL});
  frames.push_back({.type = FrameType::kDatagram,
                    .flags = kFlagImm,
                    .payloadLen = kMaxDatagram,
                    .qpn = 0x123456,
                    .aux = 0xabcdef01,
                    .srcQpn = 0x654321,
                    .srcGid = {0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0xff, 0xff, 127, 0, 0, 1},
                    .qkey = 0x11111111});
  frames.push_back({.type = FrameType::kStripeData, .payloadLen = kMaxMessage, .seq = 11, .qpn = 3});
  frames.push_back({.type = FrameType::kStripeReadResp, .payloadLen = kMaxMessage, .seq = 12, .qpn = 3});
  return frames;
}

TEST(WireTest, EveryFrameTypeRoundTrips) {
  std::vector<FrameHeader> frames = oneOfEachType();
  ASSERT_EQ(frames.size(), 16u);  // kHello .. kStripeReadResp
  for (const FrameHeader& h : frames) {
    SCOPED_TRACE("frame type " + std::to_string(static_cast<int>(h.type)));
    Bytes bytes = encode(h);
    ASSERT_EQ(bytes.size(), headerLenFor(h.type));
    Result<size_t> len = peekHeaderLen(std::span<const uint8_t>(bytes.data(), kCommonHeaderLen));
    ASSERT_TRUE(len.isOk()) << len.status().toString();
    ASSERT_EQ(*len, bytes.size());
    FrameHeader back;
    Status s = decodeHeader(bytes, &back);
    ASSERT_TRUE(s.isOk()) << s.toString();
    EXPECT_EQ(back.headerLen, bytes.size());
    expectSameFields(back, h);
  }
}

TEST(WireTest, HelloReplyCarriesTheSameHostTableOnlyWhenOffered) {
  FrameHeader plain{.type = FrameType::kHelloReply, .qpn = 9};
  EXPECT_EQ(encode(plain).size(), kCommonHeaderLen) << "no table: the version-1 reply";
  FrameHeader offered{.type = FrameType::kHelloReply, .qpn = 9};
  offered.sharePid = 4242;
  offered.shareFd = 17;
  offered.shareCookie = 0x0123456789abcdefULL;
  Bytes bytes = encode(offered);
  ASSERT_EQ(bytes.size(), kCommonHeaderLen + kHelloReplyShareLen);
  FrameHeader back;
  ASSERT_TRUE(decodeHeader(bytes, &back).isOk());
  EXPECT_EQ(back.sharePid, 4242u);
  EXPECT_EQ(back.shareFd, 17u);
  EXPECT_EQ(back.shareCookie, 0x0123456789abcdefULL);
  EXPECT_EQ(back.ringTicket, 0u);
  // A kUseRing reply also carries its ring ticket, after the table's fields.
  FrameHeader ring = offered;
  ring.aux = static_cast<uint32_t>(HelloResult::kUseRing);
  ring.ringTicket = 0xfeedfacecafebeefULL;
  bytes = encode(ring);
  ASSERT_EQ(bytes.size(), kCommonHeaderLen + kHelloReplyRingLen);
  ASSERT_TRUE(decodeHeader(bytes, &back).isOk());
  EXPECT_EQ(back.ringTicket, 0xfeedfacecafebeefULL);
  EXPECT_EQ(back.shareCookie, 0x0123456789abcdefULL);
  // A 24-byte reply decodes with no table; so does a reply with fields appended but too few bytes
  // for the table (a later version may put other fields there).
  FrameHeader none;
  ASSERT_TRUE(decodeHeader(encode(plain), &none).isOk());
  EXPECT_EQ(none.sharePid, 0u);
  Bytes shortExt = encode(plain);
  shortExt.resize(kCommonHeaderLen + 8, 0xee);
  shortExt[4] = static_cast<uint8_t>(shortExt.size());
  ASSERT_TRUE(decodeHeader(shortExt, &none).isOk());
  EXPECT_EQ(none.sharePid, 0u);
}

TEST(WireTest, DatagramCarriesItsSendersRouteWhenGiven) {
  FrameHeader plain{.type = FrameType::kDatagram, .payloadLen = 16, .qpn = 5, .srcQpn = 6, .qkey = 7};
  EXPECT_EQ(encode(plain).size(), headerLenFor(FrameType::kDatagram)) << "no route: the version-1 datagram";
  FrameHeader back;
  ASSERT_TRUE(decodeHeader(encode(plain), &back).isOk());
  EXPECT_FALSE(back.route.present);
  FrameHeader routed = plain;
  routed.route = {.present = true, .flowLabel = 0xabcde, .trafficClass = 0x28, .hopLimit = 7, .grh = true};
  routed.route.dgid[0] = 0xff;
  routed.route.dgid[1] = 0x02;
  routed.route.dgid[15] = 1;
  Bytes bytes = encode(routed);
  ASSERT_EQ(bytes.size(), headerLenFor(FrameType::kDatagram) + kDatagramRouteLen);
  ASSERT_TRUE(decodeHeader(bytes, &back).isOk());
  EXPECT_TRUE(back.route.present);
  EXPECT_EQ(back.route.dgid, routed.route.dgid);
  EXPECT_EQ(back.route.flowLabel, 0xabcdeu);
  EXPECT_EQ(back.route.trafficClass, 0x28);
  EXPECT_EQ(back.route.hopLimit, 7);
  EXPECT_TRUE(back.route.grh);
  routed.route.grh = false;  // a LID-routed send
  ASSERT_TRUE(decodeHeader(encode(routed), &back).isOk());
  EXPECT_FALSE(back.route.grh);
  // A flow label above 20 bits or an unknown route flag is refused, and leaves *out as it was.
  Bytes wide = bytes;
  wide[headerLenFor(FrameType::kDatagram) + 16 + 2] = 0x10;  // flow label bit 20
  FrameHeader untouched = back;
  EXPECT_EQ(decodeHeader(wide, &back).code(), StatusCode::kProtocolError);
  Bytes flagged = bytes;
  flagged[headerLenFor(FrameType::kDatagram) + 22] = 0x82;
  EXPECT_EQ(decodeHeader(flagged, &back).code(), StatusCode::kProtocolError);
  expectSameFields(back, untouched);
}

TEST(WireTest, PlacedDataFlagOnlyOnAnEmptyWriteWithImmediate) {
  FrameHeader placed{.type = FrameType::kWriteImm,
                     .flags = kFlagPlaced,
                     .qpn = 3,
                     .remoteAddr = 0x1000,
                     .rkey = 9,
                     .length = 4096};
  FrameHeader back;
  ASSERT_TRUE(decodeHeader(encode(placed), &back).isOk());
  EXPECT_EQ(back.length, 4096u);
  EXPECT_EQ(back.flags & kFlagPlaced, kFlagPlaced);
  FrameHeader withData = placed;
  withData.payloadLen = 16;
  EXPECT_FALSE(decodeHeader(encode(withData), &back).isOk());
  FrameHeader onWrite = placed;
  onWrite.type = FrameType::kWrite;
  EXPECT_FALSE(decodeHeader(encode(onWrite), &back).isOk());
}

TEST(WireTest, CommonHeaderLayoutIsLittleEndian) {
  FrameHeader h{.type = FrameType::kSendImm,
                .flags = 0x0201,
                .payloadLen = 0x06050403,
                .seq = 0x0a090807,
                .qpn = 0x000d0c0b,
                .aux = 0x11100f0e};
  Bytes b = encode(h);
  ASSERT_EQ(b.size(), kCommonHeaderLen);
  const Bytes expected = {'F',  'Y',  kVersion, 4,    24,   0,    0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
                          0x07, 0x08, 0x09,     0x0a, 0x0b, 0x0c, 0x0d, 0x00, 0x0e, 0x0f, 0x10, 0x11};
  EXPECT_EQ(b, expected);
}

TEST(WireTest, HeaderLengthsAndTrailers) {
  EXPECT_EQ(headerLenFor(FrameType::kHello), 64u);
  EXPECT_EQ(headerLenFor(FrameType::kWrite), 40u);
  EXPECT_EQ(headerLenFor(FrameType::kReadReq), 40u);
  EXPECT_EQ(headerLenFor(FrameType::kCmpSwap), 56u);
  EXPECT_EQ(headerLenFor(FrameType::kAtomicResp), 32u);
  EXPECT_EQ(headerLenFor(FrameType::kAck), 24u);
  EXPECT_EQ(headerLenFor(static_cast<FrameType>(0)), 0u);
  EXPECT_EQ(headerLenFor(FrameType::kDatagram), 48u);
  EXPECT_EQ(headerLenFor(FrameType::kStripeData), 24u);
  EXPECT_EQ(headerLenFor(FrameType::kStripeReadResp), 24u);
  EXPECT_EQ(headerLenFor(static_cast<FrameType>(17)), 0u);
  EXPECT_EQ(trailerLen(FrameType::kReadResp), 4u);
  EXPECT_EQ(trailerLen(FrameType::kStripeReadResp), 4u);
  EXPECT_EQ(trailerLen(FrameType::kSend), 0u);
  for (const FrameHeader& h : oneOfEachType()) {
    bool expected = h.type == FrameType::kSend || h.type == FrameType::kSendImm ||
                    h.type == FrameType::kWrite || h.type == FrameType::kWriteImm ||
                    h.type == FrameType::kReadResp || h.type == FrameType::kDatagram ||
                    h.type == FrameType::kStripeData || h.type == FrameType::kStripeReadResp;
    EXPECT_EQ(carriesPayload(h.type), expected) << static_cast<int>(h.type);
  }
}

// Expects both peekHeaderLen (on the common header) and decodeHeader (on the whole header, sized
// from the headerLen field when that is sane) to refuse `bytes` with kProtocolError.
void expectRefusedByPeek(const Bytes& bytes, const std::string& why) {
  Result<size_t> len = peekHeaderLen(bytes);
  ASSERT_FALSE(len.isOk()) << why;
  EXPECT_EQ(len.status().code(), StatusCode::kProtocolError) << why;
  FrameHeader out;
  out.seq = 0x5eed;
  Status s = decodeHeader(bytes, &out);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << why;
  EXPECT_EQ(out.seq, 0x5eedu) << "a refused decode must not touch its output";
}

void expectRefusedByDecode(const Bytes& bytes, const std::string& why) {
  Result<size_t> len = peekHeaderLen(bytes);
  ASSERT_TRUE(len.isOk()) << why << ": the common header alone is fine";
  FrameHeader out;
  out.seq = 0x5eed;
  Status s = decodeHeader(bytes, &out);
  ASSERT_FALSE(s.isOk()) << why;
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << why;
  EXPECT_EQ(out.seq, 0x5eedu) << "a refused decode must not touch its output";
}

Bytes ack() { return encode({.type = FrameType::kAck, .seq = 1, .qpn = 2}); }

TEST(WireTest, StripedFlagOnlyOnAWriteLongerThanItsPayloadOrARead) {
  // A striped WRITE: 8 KiB in all, the first 4 KiB in this frame, the rest on the stripe.
  FrameHeader striped{.type = FrameType::kWrite,
                      .flags = kFlagStriped,
                      .payloadLen = 4096,
                      .qpn = 3,
                      .remoteAddr = 0x10000,
                      .rkey = 9,
                      .length = 8192};
  FrameHeader back;
  ASSERT_TRUE(decodeHeader(encode(striped), &back).isOk());
  EXPECT_EQ(back.length, 8192u);
  EXPECT_EQ(back.payloadLen, 4096u);
  FrameHeader nothingLeft = striped;  // the stripe would carry nothing
  nothingLeft.length = 4096;
  expectRefusedByDecode(encode(nothingLeft), "a striped WRITE no longer than its payload");
  FrameHeader tooLong = striped;
  tooLong.length = kMaxMessage + 1;
  expectRefusedByDecode(encode(tooLong), "a striped WRITE above the message limit");
  FrameHeader wraps = striped;
  wraps.remoteAddr = ~uint64_t{0} - 6000;  // its frame fits, the whole WRITE does not
  expectRefusedByDecode(encode(wraps), "a striped WRITE that wraps around");
  FrameHeader writeImm = striped;  // (types with no extended header ignore the bit)
  writeImm.type = FrameType::kWriteImm;
  expectRefusedByDecode(encode(writeImm), "a striped flag on a WRITE_WITH_IMM");
  // A striped READ: any length but none (the response comes in two parts).
  FrameHeader read{.type = FrameType::kReadReq,
                   .flags = kFlagStriped,
                   .qpn = 3,
                   .remoteAddr = 0x10000,
                   .rkey = 9,
                   .length = 8192};
  ASSERT_TRUE(decodeHeader(encode(read), &back).isOk());
  EXPECT_EQ(back.flags & kFlagStriped, kFlagStriped);
  FrameHeader empty = read;
  empty.length = 0;
  expectRefusedByDecode(encode(empty), "a striped READ of nothing");
  FrameHeader readWraps = read;
  readWraps.remoteAddr = ~uint64_t{0} - 6000;
  expectRefusedByDecode(encode(readWraps), "a striped READ that wraps around");
}

TEST(WireTest, HelloReplyCarriesAStripeTicketWithOrWithoutTheTable) {
  FrameHeader reply{.type = FrameType::kHelloReply, .qpn = 9};
  reply.stripeTicket = 0x1122334455667788ULL;
  Bytes bytes = encode(reply);
  ASSERT_EQ(bytes.size(), kCommonHeaderLen + kHelloReplyStripeLen);
  FrameHeader back;
  ASSERT_TRUE(decodeHeader(bytes, &back).isOk());
  EXPECT_EQ(back.stripeTicket, 0x1122334455667788ULL);
  EXPECT_EQ(back.sharePid, 0u) << "no table: its fields stay zero";
  reply.sharePid = 4242;
  reply.shareCookie = 77;
  ASSERT_TRUE(decodeHeader(encode(reply), &back).isOk());
  EXPECT_EQ(back.stripeTicket, 0x1122334455667788ULL);
  EXPECT_EQ(back.sharePid, 4242u);
  EXPECT_EQ(back.shareCookie, 77u);
  // A reply of the earlier lengths has no ticket.
  reply.stripeTicket = 0;
  ASSERT_TRUE(decodeHeader(encode(reply), &back).isOk());
  EXPECT_EQ(back.stripeTicket, 0u);
}

TEST(WireTest, RefusesTruncatedCommonHeader) {
  Bytes b = ack();
  for (size_t n = 0; n < kCommonHeaderLen; ++n) {
    Bytes prefix(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(peekHeaderLen(prefix).isOk()) << n;
    FrameHeader out;
    EXPECT_FALSE(decodeHeader(prefix, &out).isOk()) << n;
  }
}

TEST(WireTest, RefusesBadMagic) {
  Bytes b = ack();
  b[0] = 'G';
  expectRefusedByPeek(b, "magic");
  b = ack();
  put16(b, 0, 0x4659);  // byte-swapped
  expectRefusedByPeek(b, "byte-swapped magic");
}

TEST(WireTest, RefusesOtherVersions) {
  for (uint8_t v : {0, 2, 255}) {
    Bytes b = ack();
    b[2] = v;
    expectRefusedByPeek(b, "version " + std::to_string(v));
  }
}

TEST(WireTest, RefusesUnknownTypes) {
  for (uint8_t t : {0, 17, 18, 128, 255}) {
    Bytes b = ack();
    b[3] = t;
    expectRefusedByPeek(b, "type " + std::to_string(t));
  }
}

TEST(WireTest, RefusesHeaderLengthsShorterThanTheTypeNeeds) {
  for (const FrameHeader& h : oneOfEachType()) {
    Bytes b = encode(h);
    for (uint16_t len : {uint16_t{0}, uint16_t{kCommonHeaderLen - 1}, static_cast<uint16_t>(b.size() - 1)}) {
      if (len >= b.size()) continue;
      Bytes shortened = b;
      put16(shortened, 4, len);
      shortened.resize(std::max<size_t>(len, kCommonHeaderLen));
      expectRefusedByPeek(shortened, "type " + std::to_string(static_cast<int>(h.type)) + " headerLen " +
                                         std::to_string(len));
    }
  }
}

TEST(WireTest, RefusesHeaderLengthsAboveTheMaximum) {
  Bytes b = ack();
  put16(b, 4, kMaxHeaderLen + 1);
  b.resize(kMaxHeaderLen + 1);
  expectRefusedByPeek(b, "headerLen 257");
  put16(b, 4, 0xffff);
  expectRefusedByPeek(b, "headerLen 65535");
}

TEST(WireTest, RefusesDecodeOfTheWrongNumberOfBytes) {
  Bytes b = encode(oneOfEachType()[0]);  // a hello: 64 bytes
  FrameHeader out;
  Bytes shorter(b.begin(), b.end() - 1);
  EXPECT_EQ(decodeHeader(shorter, &out).code(), StatusCode::kProtocolError);
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_EQ(decodeHeader(longer, &out).code(), StatusCode::kProtocolError);
}

TEST(WireTest, RefusesPayloadOnTypesThatHaveNone) {
  for (const FrameHeader& h : oneOfEachType()) {
    if (carriesPayload(h.type)) continue;
    Bytes b = encode(h);
    put32(b, 8, 1);
    expectRefusedByPeek(b, "payload on type " + std::to_string(static_cast<int>(h.type)));
  }
}

TEST(WireTest, RefusesPayloadAboveTheMessageLimit) {
  for (FrameType t : {FrameType::kSend, FrameType::kWrite, FrameType::kReadResp}) {
    FrameHeader h{.type = t, .payloadLen = kMaxMessage};
    Bytes b = encode(h);
    FrameHeader out;
    EXPECT_TRUE(decodeHeader(b, &out).isOk()) << "exactly kMaxMessage is allowed";
    put32(b, 8, kMaxMessage + 1);
    expectRefusedByPeek(b, "payload kMaxMessage + 1");
    put32(b, 8, 0xffffffff);
    expectRefusedByPeek(b, "payload 4 GiB - 1");
  }
}

TEST(WireTest, RefusesReadRequestsAboveTheMessageLimit) {
  FrameHeader h{.type = FrameType::kReadReq, .remoteAddr = 0x1000, .rkey = 1, .length = kMaxMessage + 1};
  expectRefusedByDecode(encode(h), "read length kMaxMessage + 1");
}

TEST(WireTest, RefusesRangesThatWrapAroundTheAddressSpace) {
  constexpr uint64_t kTop = std::numeric_limits<uint64_t>::max();
  FrameHeader write{.type = FrameType::kWrite, .payloadLen = 11, .remoteAddr = kTop - 10, .rkey = 1};
  expectRefusedByDecode(encode(write), "write wraps");
  write.type = FrameType::kWriteImm;
  expectRefusedByDecode(encode(write), "write-with-immediate wraps");
  FrameHeader read{.type = FrameType::kReadReq, .remoteAddr = kTop - 10, .rkey = 1, .length = 4096};
  expectRefusedByDecode(encode(read), "read wraps");

  // Right up to the last byte is fine.
  FrameHeader out;
  write.payloadLen = 10;
  EXPECT_TRUE(decodeHeader(encode(write), &out).isOk());
  read.length = 10;
  EXPECT_TRUE(decodeHeader(encode(read), &out).isOk());
}

TEST(WireTest, RefusesUnknownNakSyndromes) {
  for (uint32_t syndrome : {0u, 5u, 0xffffffffu}) {
    FrameHeader nak{.type = FrameType::kNak, .seq = 3, .aux = syndrome};
    expectRefusedByDecode(encode(nak), "syndrome " + std::to_string(syndrome));
  }
  for (Syndrome s : {Syndrome::kRnr, Syndrome::kRemAccess, Syndrome::kRemInvReq, Syndrome::kRemOp}) {
    FrameHeader nak{.type = FrameType::kNak, .seq = 3, .aux = static_cast<uint32_t>(s)};
    FrameHeader out;
    EXPECT_TRUE(decodeHeader(encode(nak), &out).isOk());
    EXPECT_EQ(out.aux, static_cast<uint32_t>(s));
  }
}

TEST(WireTest, RefusesUnknownHelloResults) {
  FrameHeader reply{.type = FrameType::kHelloReply, .aux = 6};
  expectRefusedByDecode(encode(reply), "hello result 6");
  reply.aux = static_cast<uint32_t>(HelloResult::kNotReady);
  FrameHeader out;
  EXPECT_TRUE(decodeHeader(encode(reply), &out).isOk());
  EXPECT_EQ(out.aux, static_cast<uint32_t>(HelloResult::kNotReady));
}

TEST(WireTest, UseRingReplyCarriesTheListener) {
  // kUseRing names the responder's ring listener in the optional table fields.
  FrameHeader reply{.type = FrameType::kHelloReply,
                    .aux = static_cast<uint32_t>(HelloResult::kUseRing),
                    .sharePid = 4242,
                    .shareCookie = 0x0123456789abcdefull};
  FrameHeader out;
  ASSERT_TRUE(decodeHeader(encode(reply), &out).isOk());
  EXPECT_EQ(out.aux, static_cast<uint32_t>(HelloResult::kUseRing));
  EXPECT_EQ(out.sharePid, 4242u);
  EXPECT_EQ(out.shareCookie, 0x0123456789abcdefull);
  FrameHeader hello = oneOfEachType()[0];
  hello.flags = kFlagRingOffer;
  ASSERT_TRUE(decodeHeader(encode(hello), &out).isOk());
  EXPECT_EQ(out.flags, kFlagRingOffer);
}

TEST(WireTest, RefusesHelloNumbersAbove24Bits) {
  FrameHeader hello = oneOfEachType()[0];
  FrameHeader bad = hello;
  bad.srcQpn = 1u << 24;
  expectRefusedByDecode(encode(bad), "srcQpn");
  bad = hello;
  bad.qpn = 1u << 24;
  expectRefusedByDecode(encode(bad), "destination qpn");
  bad = hello;
  bad.psn = 1u << 24;
  expectRefusedByDecode(encode(bad), "psn");
}

TEST(WireTest, HeaderWithAppendedFieldsDecodesIgnoringThem) {
  for (const FrameHeader& h : oneOfEachType()) {
    SCOPED_TRACE("frame type " + std::to_string(static_cast<int>(h.type)));
    Bytes b = encode(h);
    size_t v1Len = b.size();
    // A later version's fields: arbitrary bytes after the ones version 1 knows.
    for (size_t i = 0; i < 12; ++i) b.push_back(static_cast<uint8_t>(0xa5 ^ i));
    put16(b, 4, static_cast<uint16_t>(b.size()));
    Result<size_t> len = peekHeaderLen(b);
    ASSERT_TRUE(len.isOk()) << len.status().toString();
    EXPECT_EQ(*len, v1Len + 12);
    FrameHeader out;
    ASSERT_TRUE(decodeHeader(b, &out).isOk());
    EXPECT_EQ(out.headerLen, v1Len + 12);
    expectSameFields(out, h);
  }
  // The largest header allowed.
  Bytes b = ack();
  b.resize(kMaxHeaderLen, 0xff);
  put16(b, 4, kMaxHeaderLen);
  FrameHeader out;
  ASSERT_TRUE(decodeHeader(b, &out).isOk());
  EXPECT_EQ(out.headerLen, kMaxHeaderLen);
  EXPECT_EQ(out.seq, 1u);
}

TEST(WireTest, HelloFallsBackToTheCommonQpnWhenItsOwnIsZero) {
  FrameHeader hello = oneOfEachType()[0];
  Bytes b = encode(hello);
  put32(b, kCommonHeaderLen + 4, 0);  // destination QPN inside the hello body
  put32(b, 16, 0x4242);               // common header qpn
  FrameHeader out;
  ASSERT_TRUE(decodeHeader(b, &out).isOk());
  EXPECT_EQ(out.qpn, 0x4242u);
  put64(b, kCommonHeaderLen + 32, 7);
  ASSERT_TRUE(decodeHeader(b, &out).isOk());
  EXPECT_EQ(out.nonce, 7u);
}

}  // namespace
}  // namespace ferry::soft::wire
