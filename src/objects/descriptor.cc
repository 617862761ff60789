#include "objects/descriptor.h"

#include <openssl/sha.h>
#include <time.h>

#include "common/base64.h"
#include "ferry/agent/address.h"

namespace ferry::objects {
namespace {

constexpr std::string_view kMagic = "FOBJ";
constexpr std::string_view kClaimMagic = "FCLM";
constexpr std::string_view kGrantMagic = "FGRT";
constexpr uint8_t kVersion = 1;
// A granted answer is the descriptor's record and 14 bytes; base64 and the prefix on top.
constexpr size_t kMaxAnswerText = kMaxDescriptorText + 64;

void putLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads fixed-size little-endian fields and byte strings, never past the end.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool u(int bytes, uint64_t& v) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(b_[pos_ + i])} << (8 * i);
    pos_ += bytes;
    return true;
  }
  bool bytes(size_t n, std::string& out) {
    if (b_.size() - pos_ < n) return false;
    out.assign(b_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

Status bad(const std::string& why) { return invalidArgument("object descriptor: " + why); }
Status badClaim(const std::string& why) { return invalidArgument("grant claim: " + why); }
Status badAnswer(const std::string& why) { return invalidArgument("grant answer: " + why); }

// The record of a descriptor, from its magic to its agent address.
std::string encodeRecord(const Descriptor& d) {
  std::string b(kMagic);
  putLe(b, kVersion, 1);
  putLe(b, d.op, 1);
  putLe(b, 0, 2);
  putLe(b, d.expiresNs, 8);
  putLe(b, d.addr, 8);
  putLe(b, d.length, 8);
  putLe(b, d.keys.size(), 1);
  for (const auto& [name, rkey] : d.keys) {
    putLe(b, name.size(), 1);
    b += name;
    putLe(b, rkey, 4);
  }
  putLe(b, d.agentAddress.size(), 2);
  b += d.agentAddress;
  return b;
}

// The record's keys: a count (1..16), then per key a device name (1..kMaxDeviceName bytes, each
// device once) and its rkey.
Status decodeKeys(Reader& r, Descriptor& d) {
  uint64_t n = 0, len = 0;
  if (!r.u(1, n) || n == 0 || n > kMaxDescriptorKeys) return bad("no keys, or more than 16");
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t rkey = 0;
    std::string name;
    if (!r.u(1, len) || len == 0 || len > kMaxDeviceName || !r.bytes(len, name) || !r.u(4, rkey)) {
      return bad("key " + std::to_string(i) + " is truncated or its device name is empty or too long");
    }
    for (const auto& k : d.keys) {
      if (k.first == name) return bad("device '" + name + "' has two keys");
    }
    d.keys.emplace_back(std::move(name), static_cast<uint32_t>(rkey));
  }
  return Status::ok();
}

// Reads a record to the end of r: anything after it is an error.
Result<Descriptor> decodeRecord(Reader& r) {
  std::string magic;
  uint64_t version = 0, op = 0, reserved = 0, len = 0;
  Descriptor d;
  if (!r.bytes(kMagic.size(), magic) || magic != kMagic) return bad("bad magic");
  if (!r.u(1, version) || version != kVersion) return bad("unknown version");
  if (!r.u(1, op) || op > 1) return bad("the operation is neither GET nor PUT");
  if (!r.u(2, reserved) || reserved != 0) return bad("reserved bytes are not zero");
  if (!r.u(8, d.expiresNs) || !r.u(8, d.addr) || !r.u(8, d.length)) return bad("truncated");
  d.op = static_cast<uint8_t>(op);
  if (d.length == 0) return bad("empty range");
  if (d.addr == 0 || d.addr + d.length < d.addr) return bad("the range is null or wraps");
  FERRY_RETURN_IF_ERROR(decodeKeys(r, d));
  if (!r.u(2, len) || len == 0 || len > kMaxAgentAddress || !r.bytes(len, d.agentAddress)) {
    return bad("the agent address is missing, truncated or too long");
  }
  if (r.left() != 0) return bad(std::to_string(r.left()) + " bytes after the end");
  auto address = agent::WorkerAddress::decode(d.agentAddress);
  if (!address.isOk()) return bad("the agent address: " + address.status().message());
  return d;
}

// The raw bytes after `prefix` of a text of at most `limit` bytes.
Result<std::string> unwrap(std::string_view text, std::string_view prefix, size_t limit,
                           Status (*fail)(const std::string&)) {
  if (text.size() > limit) return fail("longer than " + std::to_string(limit) + " bytes");
  if (text.substr(0, prefix.size()) != prefix) {
    return fail("does not start with '" + std::string(prefix) + "'");
  }
  auto raw = decodeBase64(text.substr(prefix.size()));
  if (!raw.isOk()) return fail(raw.status().message());
  return std::move(*raw);
}

}  // namespace

uint64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string encodeDescriptor(const Descriptor& d) {
  return std::string(kDescriptorPrefix) + encodeBase64(encodeRecord(d));
}

Result<Descriptor> decodeDescriptor(std::string_view text) {
  auto raw = unwrap(text, kDescriptorPrefix, kMaxDescriptorText, bad);
  if (!raw.isOk()) return raw.status();
  Reader r(*raw);
  return decodeRecord(r);
}

std::string descriptorDigest(std::string_view text) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), md);
  return std::string(reinterpret_cast<const char*>(md), sizeof md);
}

std::string encodeClaim(const GrantClaim& c) {
  std::string b(kClaimMagic);
  putLe(b, kVersion, 1);
  putLe(b, c.id, 8);
  b += c.digest;
  return std::string(kClaimPrefix) + encodeBase64(b);
}

Result<GrantClaim> decodeClaim(std::string_view text) {
  // The prefix, and base64 of 4 + 1 + 8 + 32 bytes.
  auto raw = unwrap(text, kClaimPrefix, kClaimPrefix.size() + 64, badClaim);
  if (!raw.isOk()) return raw.status();
  Reader r(*raw);
  std::string magic;
  uint64_t version = 0;
  GrantClaim c;
  if (!r.bytes(kClaimMagic.size(), magic) || magic != kClaimMagic) return badClaim("bad magic");
  if (!r.u(1, version) || version != kVersion) return badClaim("unknown version");
  if (!r.u(8, c.id) || !r.bytes(kDescriptorDigestSize, c.digest)) return badClaim("truncated");
  if (r.left() != 0) return badClaim(std::to_string(r.left()) + " bytes after the end");
  return c;
}

std::string encodeAnswer(const GrantAnswer& a) {
  std::string b(kGrantMagic);
  putLe(b, kVersion, 1);
  putLe(b, a.id, 8);
  putLe(b, a.granted ? 1 : 0, 1);
  if (a.granted) {
    b += encodeRecord(a.descriptor);
  } else {
    std::string_view reason = std::string_view(a.reason).substr(0, kMaxGrantReason);
    putLe(b, reason.size(), 2);
    b += reason;
  }
  return std::string(kGrantPrefix) + encodeBase64(b);
}

Result<GrantAnswer> decodeAnswer(std::string_view text) {
  auto raw = unwrap(text, kGrantPrefix, kMaxAnswerText, badAnswer);
  if (!raw.isOk()) return raw.status();
  Reader r(*raw);
  std::string magic;
  uint64_t version = 0, granted = 0, len = 0;
  GrantAnswer a;
  if (!r.bytes(kGrantMagic.size(), magic) || magic != kGrantMagic) return badAnswer("bad magic");
  if (!r.u(1, version) || version != kVersion) return badAnswer("unknown version");
  if (!r.u(8, a.id) || !r.u(1, granted)) return badAnswer("truncated");
  if (granted > 1) return badAnswer("the grant flag is neither 0 nor 1");
  a.granted = granted == 1;
  if (a.granted) {
    auto d = decodeRecord(r);
    if (!d.isOk()) return badAnswer(d.status().message());
    a.descriptor = std::move(*d);
    return a;
  }
  if (!r.u(2, len) || len > kMaxGrantReason || !r.bytes(len, a.reason)) {
    return badAnswer("the reason is truncated or too long");
  }
  if (r.left() != 0) return badAnswer(std::to_string(r.left()) + " bytes after the end");
  return a;
}

}  // namespace ferry::objects
