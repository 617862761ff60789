#include "objects/descriptor.h"

#include <time.h>

#include "common/base64.h"
#include "ferry/agent/address.h"

namespace ferry::objects {
namespace {

constexpr std::string_view kMagic = "FOBJ";
constexpr uint8_t kVersion = 1;

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

}  // namespace

uint64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string encodeDescriptor(const Descriptor& d) {
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
  return std::string(kDescriptorPrefix) + encodeBase64(b);
}

Result<Descriptor> decodeDescriptor(std::string_view text) {
  if (text.size() > kMaxDescriptorText)
    return bad("longer than " + std::to_string(kMaxDescriptorText) + " bytes");
  if (text.substr(0, kDescriptorPrefix.size()) != kDescriptorPrefix) {
    return bad("does not start with '" + std::string(kDescriptorPrefix) + "'");
  }
  auto raw = decodeBase64(text.substr(kDescriptorPrefix.size()));
  if (!raw.isOk()) return bad(raw.status().message());
  Reader r(*raw);
  std::string magic;
  uint64_t version = 0, op = 0, reserved = 0, n = 0, len = 0;
  Descriptor d;
  if (!r.bytes(kMagic.size(), magic) || magic != kMagic) return bad("bad magic");
  if (!r.u(1, version) || version != kVersion) return bad("unknown version");
  if (!r.u(1, op) || op > 1) return bad("the operation is neither GET nor PUT");
  if (!r.u(2, reserved) || reserved != 0) return bad("reserved bytes are not zero");
  if (!r.u(8, d.expiresNs) || !r.u(8, d.addr) || !r.u(8, d.length)) return bad("truncated");
  d.op = static_cast<uint8_t>(op);
  if (d.length == 0) return bad("empty range");
  if (d.addr == 0 || d.addr + d.length < d.addr) return bad("the range is null or wraps");
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
  if (!r.u(2, len) || len == 0 || len > kMaxAgentAddress || !r.bytes(len, d.agentAddress)) {
    return bad("the agent address is missing, truncated or too long");
  }
  if (r.left() != 0) return bad(std::to_string(r.left()) + " bytes after the end");
  auto address = agent::WorkerAddress::decode(d.agentAddress);
  if (!address.isOk()) return bad("the agent address: " + address.status().message());
  return d;
}

}  // namespace ferry::objects
