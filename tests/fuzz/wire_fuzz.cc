// Feeds arbitrary bytes to the soft provider's frame decoder, as a hostile peer would. Beyond "no
// crash, no out-of-bounds read", every header the decoder accepts must satisfy the limits it
// promises and must survive encode -> decode unchanged.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "providers/soft/wire.h"

namespace {

using ferry::soft::wire::FrameHeader;
using ferry::soft::wire::FrameType;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "wire_fuzz: %s\n", what);
    std::abort();
  }
}

bool sameFields(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.payloadLen == b.payloadLen && a.seq == b.seq &&
         a.qpn == b.qpn && a.aux == b.aux && a.remoteAddr == b.remoteAddr && a.rkey == b.rkey &&
         a.length == b.length && a.compareAdd == b.compareAdd && a.swap == b.swap &&
         a.atomicResult == b.atomicResult && a.srcQpn == b.srcQpn && a.psn == b.psn &&
         a.maxRdAtomic == b.maxRdAtomic && a.srcGid == b.srcGid && a.qkey == b.qkey && a.nonce == b.nonce &&
         a.sharePid == b.sharePid && a.shareFd == b.shareFd && a.shareCookie == b.shareCookie &&
         a.ringTicket == b.ringTicket && a.stripeTicket == b.stripeTicket &&
         a.route.present == b.route.present && a.route.dgid == b.route.dgid &&
         a.route.flowLabel == b.route.flowLabel && a.route.trafficClass == b.route.trafficClass &&
         a.route.hopLimit == b.route.hopLimit && a.route.grh == b.route.grh;
}

void checkAccepted(const FrameHeader& h, size_t headerLen) {
  namespace w = ferry::soft::wire;
  check(h.headerLen == headerLen, "headerLen differs from the bytes decoded");
  check(headerLen >= w::headerLenFor(h.type) && headerLen <= w::kMaxHeaderLen, "accepted a bad headerLen");
  check(h.payloadLen <= w::kMaxMessage, "accepted a payload above kMaxMessage");
  check(h.payloadLen == 0 || w::carriesPayload(h.type), "accepted a payload on a type without one");
  if (h.type == FrameType::kReadReq) {
    check(h.length <= w::kMaxMessage, "accepted a READ above kMaxMessage");
    check(h.remoteAddr + h.length >= h.remoteAddr, "accepted a wrapping READ range");
  }
  if (h.type == FrameType::kWrite || h.type == FrameType::kWriteImm) {
    check(h.remoteAddr + h.payloadLen >= h.remoteAddr, "accepted a wrapping WRITE range");
  }
  if (h.type == FrameType::kNak) {
    check(h.aux >= static_cast<uint32_t>(w::Syndrome::kRnr) &&
              h.aux <= static_cast<uint32_t>(w::Syndrome::kRemOp),
          "accepted an unknown NAK syndrome");
  }
  // The placed-data bit means something only to WRITE and READ frames (elsewhere it is an unused bit).
  const bool rdma =
      h.type == FrameType::kWrite || h.type == FrameType::kWriteImm || h.type == FrameType::kReadReq;
  if (rdma && (h.flags & w::kFlagPlaced)) {
    check(h.type == FrameType::kWriteImm && h.payloadLen == 0 && h.length <= w::kMaxMessage,
          "accepted a placed-data flag where it does not belong");
  }
  // The striped bit: a WRITE with more than its payload, the rest on the stripe; or a READ of something.
  if (rdma && (h.flags & w::kFlagStriped)) {
    check((h.type == FrameType::kWrite && h.length > h.payloadLen && h.length <= w::kMaxMessage &&
           h.remoteAddr + h.length >= h.remoteAddr) ||
              (h.type == FrameType::kReadReq && h.length > 0),
          "accepted a striped flag where it does not belong");
  }
  check(h.sharePid != 0 || (h.shareFd == 0 && h.shareCookie == 0), "a same-host table without a pid");
  if (h.type == FrameType::kHello) {
    check(h.srcQpn < (1u << 24) && h.qpn < (1u << 24) && h.psn < (1u << 24),
          "accepted a hello above 24 bits");
  }

  // Re-encode and decode again: the same fields must come back.
  std::array<uint8_t, w::kMaxHeaderLen> buffer{};
  size_t n = w::encodeHeader(h, buffer.data());
  check(n == w::encodedHeaderLen(h), "encode wrote an unexpected length");
  std::span<const uint8_t> encoded(buffer.data(), n);
  auto len = w::peekHeaderLen(encoded);
  check(len.isOk() && *len == n, "peek refused a re-encoded header");
  FrameHeader again;
  check(w::decodeHeader(encoded, &again).isOk(), "decode refused a re-encoded header");
  check(sameFields(h, again), "re-encoded header decodes to different fields");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace w = ferry::soft::wire;
  std::span<const uint8_t> input(data, size);

  // Whatever the input, a decode of all of it must not crash; if it succeeds it was exactly one header.
  FrameHeader whole;
  if (w::decodeHeader(input, &whole).isOk()) checkAccepted(whole, size);

  auto len = w::peekHeaderLen(input);
  if (!len.isOk()) return 0;
  check(*len >= w::kCommonHeaderLen && *len <= w::kMaxHeaderLen, "peek returned a bad headerLen");
  if (*len > size) return 0;  // a reader would wait for more bytes
  FrameHeader h;
  if (w::decodeHeader(input.first(*len), &h).isOk()) checkAccepted(h, *len);
  return 0;
}
