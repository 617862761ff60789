// The soft provider's wire protocol: the frames two software devices exchange over TCP.
//
// Every frame starts with a 24-byte common header (little-endian):
//   0 u16 magic (kMagic)   2 u8 version   3 u8 type   4 u16 headerLen   6 u16 flags
//   8 u32 payloadLen      12 u32 seq     16 u32 qpn  20 u32 aux
// followed by type-specific header fields up to headerLen bytes, then payloadLen payload bytes,
// then a trailer for the types that have one (READ_RESP: u32 status). Later versions only append
// header fields: a decoder reads the fields it knows and skips the rest of headerLen.
// docs/wire-protocol.md is the full specification. decodeHeader() is the only decoder.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/common/status.h"

namespace ferry::soft::wire {

inline constexpr uint16_t kMagic = 0x5946;  // bytes 'F' 'Y'
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kCommonHeaderLen = 24;
inline constexpr size_t kMaxHeaderLen = 256;
inline constexpr uint32_t kMaxMessage = 1u << 31;  // largest payload of one message (2 GiB)

enum class FrameType : uint8_t {
  kHello = 1,            // requester -> responder, first frame on a new connection
  kHelloReply = 2,       // responder -> requester: aux = HelloResult; optionally sharePid, shareFd,
                         // shareCookie: where a same-host requester finds the responder's table
                         // (for kUseRing: the responder's ring listener)
  kSend = 3,             // flags: kFlagSolicited; payload: the message
  kSendImm = 4,          // aux = immediate
  kWrite = 5,            // remoteAddr, rkey; payload: the data
  kWriteImm = 6,         // aux = immediate; consumes a receive at the target; flags: kFlagPlaced
  kReadReq = 7,          // remoteAddr, rkey, length
  kCmpSwap = 8,          // remoteAddr, rkey, compareAdd, swap
  kFetchAdd = 9,         // remoteAddr, rkey, compareAdd (the addend)
  kAck = 10,             // seq: every request up to and including seq is done
  kNak = 11,             // seq: the request refused; aux = Syndrome; flags low 5 bits: RNR timer code
  kReadResp = 12,        // seq; payload: the data; trailer: u32 Syndrome (0 = all data valid)
  kAtomicResp = 13,      // seq; atomicResult: the original value
  kDatagram = 14,        // UD over UDP: qpn = destination QP; srcQpn, qkey, srcGid; aux = immediate
                         // when flags has kFlagImm; optionally the sender's route (DatagramRoute);
                         // payload: the message (at most kMaxDatagram)
  kStripeData = 15,      // on a stripe (kFlagStripe): seq = the striped WRITE's; payload: the WRITE's bytes
                         // from payloadLen to length, placed after that WRITE's own frame is checked
  kStripeReadResp = 16,  // on a stripe, back to the requester: seq = the striped READ's; payload: its data
                         // from the first part's end on; trailer: u32 Syndrome (0 = all data valid)
};

inline constexpr uint16_t kFlagSolicited = 1;
inline constexpr uint16_t kFlagImm = 2;  // kDatagram: aux carries an immediate
// kWriteImm: the data is already in place (the requester copied it on the same-host path);
// payloadLen is 0 and `length` is the WRITE's length, reported in the receive's completion.
inline constexpr uint16_t kFlagPlaced = 4;
// kHello on TCP: the requester, on this host, can move the connection to shared-memory rings
// (ring.h). A responder that offers them answers kUseRing instead of adopting the connection.
inline constexpr uint16_t kFlagRingOffer = 8;
// kHello: this connection is a stripe of the requester's connection to the same QP (nonce = the
// stripeTicket of the responder's hello reply on that connection): a second byte stream, sent by a
// thread of its own, that carries the second part of large WRITEs.
inline constexpr uint16_t kFlagStripe = 16;
// kWrite: the WRITE is `length` bytes; this frame carries the first payloadLen of them and the
// rest come on the stripe as a kStripeData frame with the same seq. The WRITE is done (acknowledged,
// and anything after it carried out) only once both parts have landed.
// kReadReq: the requester asks for the response in two parts: the kReadResp carries the first
// stripeSplitAt(length) bytes (stripe.h), and a kStripeReadResp with the same seq on the stripe the rest.
// The READ is done only once both parts have landed.
inline constexpr uint16_t kFlagStriped = 32;
inline constexpr uint32_t kMaxDatagram = 4096;  // the soft devices' MTU

enum class Syndrome : uint32_t {
  kOk = 0,
  kRnr = 1,        // receiver not ready: retry after the RNR timer
  kRemAccess = 2,  // bad rkey, range or permission
  kRemInvReq = 3,  // invalid request (message too long, misaligned atomic, ...)
  kRemOp = 4,      // the responder failed to carry out a valid request
};

enum class HelloResult : uint32_t {
  kAccepted = 0,
  kNoSuchQp = 1,  // no QP with that number, or it is closed or in ERR: the peer's QP is gone
  kMismatch = 2,  // the QP is connected to another peer, or the PSN differs
  kBusy = 3,      // the QP already has a live connection from its peer
  kUseRing = 4,   // (to a hello with kFlagRingOffer) the QP would accept: connect again over
                  // shared-memory rings; sharePid = the responder's pid, shareCookie = the nonce
                  // in its ring listener's name (ringListenerName), ringTicket = the one-time
                  // secret the ring setup must carry (the name is visible to every process of
                  // the host; the ticket went only over this connection)
  kNotReady = 5,  // the QP exists but is not in RTR/RTS yet (RESET, INIT): try again, as a NIC
                  // retries a QP that drops its packets until it is ready
};

// A datagram's route, as the sender's address handle gave it: what a NIC writes into the GRH the
// receive gets. Optional on the wire (24 bytes after the datagram's fields: dgid[16], u32 flow
// label, u8 traffic class, u8 hop limit, u8 flags, u8 reserved); without it the receiver takes a
// GRH to its own GID with flow label 0, traffic class 0 and hop limit 64.
inline constexpr size_t kDatagramRouteLen = 24;
inline constexpr uint8_t kRouteGrh = 1;  // the route's flags: the send had a GRH (a global AH)
struct DatagramRoute {
  bool present = false;            // encode: write the section; decode: the frame carried it
  std::array<uint8_t, 16> dgid{};  // the AH's destination GID: a multicast group's, or the target's
  uint32_t flowLabel = 0;          // 20 bits
  uint8_t trafficClass = 0;
  uint8_t hopLimit = 64;
  bool grh = true;  // false: the AH had no GRH (a LID-routed path); the receive has no GRH either
};

struct FrameHeader {
  FrameType type = FrameType::kAck;
  uint16_t headerLen = 0;  // set by encode
  uint16_t flags = 0;
  uint32_t payloadLen = 0;
  uint32_t seq = 0;
  uint32_t qpn = 0;  // the destination QP number
  uint32_t aux = 0;
  // kWrite*, kReadReq, kCmpSwap, kFetchAdd
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;        // kReadReq
  uint64_t compareAdd = 0;    // kCmpSwap, kFetchAdd
  uint64_t swap = 0;          // kCmpSwap
  uint64_t atomicResult = 0;  // kAtomicResp
  // kHello, kDatagram
  uint32_t srcQpn = 0;
  uint32_t psn = 0;
  uint32_t maxRdAtomic = 0;
  std::array<uint8_t, 16> srcGid{};  // kHello, kDatagram
  uint32_t qkey = 0;                 // kDatagram
  DatagramRoute route = {};          // kDatagram (optional)
  uint64_t nonce = 0;
  // kHelloReply (optional: present when sharePid != 0; a shorter reply means "none")
  uint32_t sharePid = 0;
  uint32_t shareFd = 0;
  uint64_t shareCookie = 0;
  // kHelloReply with kUseRing (optional, after the share fields: present when non-zero)
  uint64_t ringTicket = 0;
  // kHelloReply of an accepted TCP connection (optional, after ringTicket: present when non-zero):
  // the secret a stripe of this connection presents in its hello (kFlagStripe)
  uint64_t stripeTicket = 0;
};

// The shortest header version 1 accepts for a type (0 for an unknown type).
size_t headerLenFor(FrameType type);
// The header length encodeHeader() writes for h: headerLenFor(h.type) plus its optional fields.
size_t encodedHeaderLen(const FrameHeader& h);
inline constexpr size_t kHelloReplyShareLen = 16;   // sharePid, shareFd, shareCookie
inline constexpr size_t kHelloReplyRingLen = 24;    // the share fields, then ringTicket
inline constexpr size_t kHelloReplyStripeLen = 32;  // the share fields, ringTicket, then stripeTicket
// Bytes after the payload (4 for kReadResp, else 0).
size_t trailerLen(FrameType type);
// True for the types whose payloadLen may be non-zero.
bool carriesPayload(FrameType type);

// Checks the common header in `prefix` (at least kCommonHeaderLen bytes) and returns headerLen.
// kProtocolError for a wrong magic, an unsupported version, an unknown type, a headerLen shorter
// than its type needs or longer than kMaxHeaderLen, or a payload length the type cannot carry.
Result<size_t> peekHeaderLen(std::span<const uint8_t> prefix);

// Decodes one whole header (bytes.size() must equal the headerLen peekHeaderLen() returned).
// Applies every check of peekHeaderLen plus the type's own (e.g. a READ request longer than
// kMaxMessage). Never reads outside `bytes`.
Status decodeHeader(std::span<const uint8_t> bytes, FrameHeader* out);

// Encodes h (headerLen computed from the type) into out, which must hold kMaxHeaderLen bytes.
// Returns the number of bytes written.
size_t encodeHeader(const FrameHeader& h, uint8_t* out);

}  // namespace ferry::soft::wire
