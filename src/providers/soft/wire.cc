#include "providers/soft/wire.h"

#include <bit>
#include <cstring>
#include <string>

namespace ferry::soft::wire {
namespace {

// Little-endian fields: one store each on this little-endian host, byte by byte elsewhere.
template <typename T>
void putLe(uint8_t* p, T v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (size_t i = 0; i < sizeof v; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
void put16(uint8_t* p, uint16_t v) { putLe(p, v); }
void put32(uint8_t* p, uint32_t v) { putLe(p, v); }
void put64(uint8_t* p, uint64_t v) { putLe(p, v); }
// And their loads.
uint16_t get16(const uint8_t* p) {
  if constexpr (std::endian::native == std::endian::little) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t get32(const uint8_t* p) {
  if constexpr (std::endian::native == std::endian::little) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  if constexpr (std::endian::native == std::endian::little) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status protocolError(const std::string& what) { return Status(StatusCode::kProtocolError, what); }

}  // namespace

size_t headerLenFor(FrameType type) {
  switch (type) {
    case FrameType::kHello: return kCommonHeaderLen + 40;
    case FrameType::kHelloReply:
    case FrameType::kStripeData:
    case FrameType::kSend:
    case FrameType::kSendImm:
    case FrameType::kAck:
    case FrameType::kNak:
    case FrameType::kReadResp:
    case FrameType::kStripeReadResp: return kCommonHeaderLen;
    case FrameType::kWrite:
    case FrameType::kWriteImm:
    case FrameType::kReadReq: return kCommonHeaderLen + 16;
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd: return kCommonHeaderLen + 32;
    case FrameType::kAtomicResp: return kCommonHeaderLen + 8;
    case FrameType::kDatagram: return kCommonHeaderLen + 24;
  }
  return 0;
}

size_t encodedHeaderLen(const FrameHeader& h) {
  size_t len = headerLenFor(h.type);
  if (h.type == FrameType::kDatagram && h.route.present) {
    len += kDatagramRouteLen;
  } else if (h.type == FrameType::kHelloReply && h.stripeTicket != 0) {
    len += kHelloReplyStripeLen;
  } else if (h.type == FrameType::kHelloReply && h.sharePid != 0) {
    len += h.ringTicket != 0 ? kHelloReplyRingLen : kHelloReplyShareLen;
  }
  return len;
}

size_t trailerLen(FrameType type) {
  return type == FrameType::kReadResp || type == FrameType::kStripeReadResp ? 4 : 0;
}

bool carriesPayload(FrameType type) {
  switch (type) {
    case FrameType::kSend:
    case FrameType::kSendImm:
    case FrameType::kWrite:
    case FrameType::kWriteImm:
    case FrameType::kReadResp:
    case FrameType::kDatagram:
    case FrameType::kStripeData:
    case FrameType::kStripeReadResp: return true;
    default: return false;
  }
}

namespace {

// The common header's first fault (kNone: none, and *headerLen is set). Kept apart from the words
// of the refusal, so that a frame that passes builds no Status.
enum class CommonFault : uint8_t {
  kNone,
  kTruncated,
  kMagic,
  kVersion,
  kType,
  kHeaderLen,
  kPayloadOnType,
  kPayloadLen
};

CommonFault checkCommon(const uint8_t* p, size_t size, size_t* headerLen) {
  if (size < kCommonHeaderLen) return CommonFault::kTruncated;
  if (get16(p) != kMagic) return CommonFault::kMagic;
  if (p[2] != kVersion) return CommonFault::kVersion;
  const auto type = static_cast<FrameType>(p[3]);
  const size_t minLen = headerLenFor(type);
  if (minLen == 0) return CommonFault::kType;
  const size_t len = get16(p + 4);
  if (len < minLen || len > kMaxHeaderLen) return CommonFault::kHeaderLen;
  const uint32_t payloadLen = get32(p + 8);
  if (payloadLen != 0 && !carriesPayload(type)) return CommonFault::kPayloadOnType;
  if (payloadLen > kMaxMessage) return CommonFault::kPayloadLen;
  *headerLen = len;
  return CommonFault::kNone;
}

Status refuseCommon(CommonFault fault, const uint8_t* p) {
  switch (fault) {
    case CommonFault::kNone: break;
    case CommonFault::kTruncated: return protocolError("frame header truncated");
    case CommonFault::kMagic: return protocolError("bad frame magic");
    case CommonFault::kVersion: return protocolError("unsupported wire version " + std::to_string(p[2]));
    case CommonFault::kType: return protocolError("unknown frame type " + std::to_string(p[3]));
    case CommonFault::kHeaderLen:
      return protocolError("bad header length " + std::to_string(get16(p + 4)) + " for frame type " +
                           std::to_string(p[3]));
    case CommonFault::kPayloadOnType:
      return protocolError("frame type " + std::to_string(p[3]) + " cannot carry a payload");
    case CommonFault::kPayloadLen: return protocolError("payload length above the message limit");
  }
  return Status::ok();
}

}  // namespace

Result<size_t> peekHeaderLen(std::span<const uint8_t> prefix) {
  size_t len = 0;
  if (CommonFault fault = checkCommon(prefix.data(), prefix.size(), &len); fault != CommonFault::kNone) {
    return refuseCommon(fault, prefix.data());
  }
  return len;
}

namespace {

// The type-specific readers of decodeHeader: each reads its fields at x (the bytes after the
// common header, len - kCommonHeaderLen of them) into h, or says why the frame is refused.

Status readHello(const uint8_t* x, FrameHeader& h) {
  h.srcQpn = get32(x);
  h.qpn = get32(x + 4) == 0 ? h.qpn : get32(x + 4);
  h.psn = get32(x + 8);
  h.maxRdAtomic = get32(x + 12);
  std::memcpy(h.srcGid.data(), x + 16, 16);
  h.nonce = get64(x + 32);
  if (h.srcQpn >= (1u << 24) || h.qpn >= (1u << 24) || h.psn >= (1u << 24)) {
    return protocolError("hello with a QP number or PSN above 24 bits");
  }
  return Status::ok();
}

// WRITE, WRITE_WITH_IMM and READ_REQ: an address range, and the placed and striped flags.
Status readRdma(const uint8_t* x, FrameHeader& h) {
  h.remoteAddr = get64(x);
  h.rkey = get32(x + 8);
  h.length = get32(x + 12);
  const bool read = h.type == FrameType::kReadReq;
  if (read && h.length > kMaxMessage) return protocolError("read request above the message limit");
  if ((h.flags & kFlagPlaced) &&
      (h.type != FrameType::kWriteImm || h.payloadLen != 0 || h.length > kMaxMessage)) {
    return protocolError("a placed-data flag on a frame that carries data or is not WRITE_WITH_IMM");
  }
  if (h.flags & kFlagStriped) {
    const bool stripeableWrite =
        h.type == FrameType::kWrite && h.length > h.payloadLen && h.length <= kMaxMessage;
    const bool stripeableRead = read && h.length > 0;
    if (!stripeableWrite && !stripeableRead) {
      return protocolError(
          "a striped-data flag on a frame that is not a WRITE of more than its payload or a READ");
    }
  }
  // A striped WRITE's range is its whole length, the rest of it on the stripe.
  const uint64_t span = read || (h.flags & kFlagStriped) ? h.length : h.payloadLen;
  if (h.remoteAddr + span < h.remoteAddr) {
    return protocolError(read ? "read range wraps around the address space"
                              : "write range wraps around the address space");
  }
  return Status::ok();
}

Status readDatagram(const uint8_t* x, size_t len, FrameHeader& h) {
  h.srcQpn = get32(x);
  h.qkey = get32(x + 4);
  std::memcpy(h.srcGid.data(), x + 8, 16);
  if (h.payloadLen > kMaxDatagram) return protocolError("datagram above the MTU");
  if (h.srcQpn >= (1u << 24) || h.qpn >= (1u << 24)) return protocolError("datagram QP number above 24 bits");
  if (len < kCommonHeaderLen + 24 + kDatagramRouteLen) return Status::ok();  // no route: the defaults
  h.route.present = true;
  std::memcpy(h.route.dgid.data(), x + 24, 16);
  h.route.flowLabel = get32(x + 40);
  h.route.trafficClass = x[44];
  h.route.hopLimit = x[45];
  h.route.grh = (x[46] & kRouteGrh) != 0;
  if (h.route.flowLabel >= (1u << 20)) return protocolError("datagram flow label above 20 bits");
  if ((x[46] & ~kRouteGrh) != 0) return protocolError("datagram route with unknown flags");
  return Status::ok();
}

Status readHelloReply(const uint8_t* x, size_t len, FrameHeader& h) {
  if (h.aux > static_cast<uint32_t>(HelloResult::kNotReady))
    return protocolError("hello reply with an unknown result");
  if (len >= kCommonHeaderLen + kHelloReplyShareLen && get32(x) != 0) {  // pid 0: no table
    h.sharePid = get32(x);
    h.shareFd = get32(x + 4);
    h.shareCookie = get64(x + 8);
    if (len >= kCommonHeaderLen + kHelloReplyRingLen) h.ringTicket = get64(x + 16);
  }
  if (len >= kCommonHeaderLen + kHelloReplyStripeLen) h.stripeTicket = get64(x + 24);
  return Status::ok();
}

Status readTypeFields(const uint8_t* x, size_t len, FrameHeader& h) {
  switch (h.type) {
    case FrameType::kHello: return readHello(x, h);
    case FrameType::kWrite:
    case FrameType::kWriteImm:
    case FrameType::kReadReq: return readRdma(x, h);
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd:
      h.remoteAddr = get64(x);
      h.rkey = get32(x + 8);
      h.compareAdd = get64(x + 16);
      h.swap = get64(x + 24);
      return Status::ok();
    case FrameType::kAtomicResp: h.atomicResult = get64(x); return Status::ok();
    case FrameType::kDatagram: return readDatagram(x, len, h);
    case FrameType::kNak:
      if (h.aux < static_cast<uint32_t>(Syndrome::kRnr) || h.aux > static_cast<uint32_t>(Syndrome::kRemOp)) {
        return protocolError("NAK with an unknown syndrome");
      }
      return Status::ok();
    case FrameType::kHelloReply: return readHelloReply(x, len, h);
    default: return Status::ok();
  }
}

}  // namespace

Status decodeHeader(std::span<const uint8_t> bytes, FrameHeader* out) {
  const uint8_t* p = bytes.data();
  size_t len = 0;
  if (CommonFault fault = checkCommon(p, bytes.size(), &len); fault != CommonFault::kNone) {
    return refuseCommon(fault, p);
  }
  if (len != bytes.size()) return protocolError("header length does not match the bytes given");
  // Into a copy: a refused header leaves *out as it was.
  FrameHeader h;
  h.type = static_cast<FrameType>(p[3]);
  h.headerLen = static_cast<uint16_t>(len);
  h.flags = get16(p + 6);
  h.payloadLen = get32(p + 8);
  h.seq = get32(p + 12);
  h.qpn = get32(p + 16);
  h.aux = get32(p + 20);
  FERRY_RETURN_IF_ERROR(readTypeFields(p + kCommonHeaderLen, len, h));
  *out = h;
  return Status::ok();
}

size_t encodeHeader(const FrameHeader& h, uint8_t* out) {
  size_t len = encodedHeaderLen(h);
  std::memset(out, 0, len);
  put16(out, kMagic);
  out[2] = kVersion;
  out[3] = static_cast<uint8_t>(h.type);
  put16(out + 4, static_cast<uint16_t>(len));
  put16(out + 6, h.flags);
  put32(out + 8, h.payloadLen);
  put32(out + 12, h.seq);
  put32(out + 16, h.qpn);
  put32(out + 20, h.aux);
  uint8_t* x = out + kCommonHeaderLen;
  switch (h.type) {
    case FrameType::kHello:
      put32(x, h.srcQpn);
      put32(x + 4, h.qpn);
      put32(x + 8, h.psn);
      put32(x + 12, h.maxRdAtomic);
      std::memcpy(x + 16, h.srcGid.data(), 16);
      put64(x + 32, h.nonce);
      break;
    case FrameType::kWrite:
    case FrameType::kWriteImm:
    case FrameType::kReadReq:
      put64(x, h.remoteAddr);
      put32(x + 8, h.rkey);
      put32(x + 12, h.length);
      break;
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd:
      put64(x, h.remoteAddr);
      put32(x + 8, h.rkey);
      put64(x + 16, h.compareAdd);
      put64(x + 24, h.swap);
      break;
    case FrameType::kAtomicResp: put64(x, h.atomicResult); break;
    case FrameType::kDatagram:
      put32(x, h.srcQpn);
      put32(x + 4, h.qkey);
      std::memcpy(x + 8, h.srcGid.data(), 16);
      if (h.route.present) {
        std::memcpy(x + 24, h.route.dgid.data(), 16);
        put32(x + 40, h.route.flowLabel & 0xfffff);
        x[44] = h.route.trafficClass;
        x[45] = h.route.hopLimit;
        x[46] = h.route.grh ? kRouteGrh : 0;
      }
      break;
    case FrameType::kHelloReply:
      if (h.sharePid != 0) {
        put32(x, h.sharePid);
        put32(x + 4, h.shareFd);
        put64(x + 8, h.shareCookie);
        if (h.ringTicket != 0) put64(x + 16, h.ringTicket);
      }
      if (h.stripeTicket != 0) put64(x + 24, h.stripeTicket);
      break;
    default: break;
  }
  return len;
}

}  // namespace ferry::soft::wire
