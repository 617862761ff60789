// The worker address codec (address.h).
#include "ferry/agent/address.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

namespace ferry::agent {
namespace {

constexpr char kMagic[4] = {'F', 'R', 'Y', 'A'};
constexpr size_t kHeaderBytes = 10;

enum Tag : uint8_t {
  kTagUuid = 1,
  kTagStart = 2,
  kTagAlias = 3,
  kTagHost = 4,
  kTagControl = 5,
  kTagDevice = 6,
};

Status malformedAddress(const std::string& what) {
  return Status(StatusCode::kProtocolError, "worker address: " + what);
}

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) {
    u8(static_cast<uint8_t>(v));
    u8(static_cast<uint8_t>(v >> 8));
  }
  void u32(uint32_t v) {
    u16(static_cast<uint16_t>(v));
    u16(static_cast<uint16_t>(v >> 16));
  }
  void u64(uint64_t v) {
    u32(static_cast<uint32_t>(v));
    u32(static_cast<uint32_t>(v >> 32));
  }
  void bytes(std::string_view b) { out_.append(b); }
  // A length-prefixed (1 byte) string, cut at 255 bytes.
  void shortText(std::string_view s) {
    s = s.substr(0, 255);
    u8(static_cast<uint8_t>(s.size()));
    bytes(s);
  }
  void field(uint8_t tag, std::string_view value) {
    u8(tag);
    u16(static_cast<uint16_t>(value.size()));
    bytes(value);
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// Reads what a Writer wrote; every read checks what is left first.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  size_t left() const { return in_.size() - pos_; }
  bool u8(uint8_t* v) {
    if (left() < 1) return false;
    *v = static_cast<uint8_t>(in_[pos_++]);
    return true;
  }
  bool u16(uint16_t* v) {
    uint8_t a, b;
    if (!u8(&a) || !u8(&b)) return false;
    *v = static_cast<uint16_t>(a | (b << 8));
    return true;
  }
  bool u32(uint32_t* v) {
    uint16_t a, b;
    if (!u16(&a) || !u16(&b)) return false;
    *v = a | (static_cast<uint32_t>(b) << 16);
    return true;
  }
  bool u64(uint64_t* v) {
    uint32_t a, b;
    if (!u32(&a) || !u32(&b)) return false;
    *v = a | (static_cast<uint64_t>(b) << 32);
    return true;
  }
  bool bytes(size_t n, std::string_view* out) {
    if (left() < n) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool shortText(std::string* out) {
    uint8_t n;
    std::string_view b;
    if (!u8(&n) || !bytes(n, &b)) return false;
    out->assign(b);
    return true;
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

bool validUtf8Text(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

Result<ControlEndpoint> decodeControl(std::string_view value) {
  Reader r(value);
  uint8_t family;
  uint16_t port;
  std::string_view raw;
  if (!r.u8(&family) || !r.u16(&port)) return malformedAddress("a control endpoint is truncated");
  if (family != 4 && family != 6)
    return malformedAddress("a control endpoint has address family " + std::to_string(family));
  size_t n = family == 4 ? 4 : 16;
  if (!r.bytes(n, &raw) || r.left() != 0) return malformedAddress("a control endpoint has the wrong length");
  if (port == 0) return malformedAddress("a control endpoint has port 0");
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family == 4 ? AF_INET : AF_INET6, raw.data(), text, sizeof text);
  return ControlEndpoint{.ipv6 = family == 6, .ip = text, .port = port};
}

Result<DeviceAddress> decodeDevice(std::string_view value) {
  Reader r(value);
  DeviceAddress d;
  uint8_t kind;
  std::string_view gid;
  if (!r.u8(&kind) || !r.shortText(&d.name) || !r.shortText(&d.ip) || !r.u8(&d.prefixLength) ||
      !r.u8(&d.port) || !r.u8(&d.linkLayer) || !r.u16(&d.lid) || !r.bytes(16, &gid)) {
    return malformedAddress("a device entry is truncated");
  }
  if (kind != 1 && kind != 2) return malformedAddress("a device entry has kind " + std::to_string(kind));
  d.kind = static_cast<DeviceAddress::Kind>(kind);
  if (d.name.empty() || !validUtf8Text(d.name))
    return malformedAddress("a device entry has no printable name");
  if (!validUtf8Text(d.ip)) return malformedAddress("a device entry has an unprintable address");
  if (d.kind == DeviceAddress::Kind::kSoft) {
    in_addr a;
    if (inet_pton(AF_INET, d.ip.c_str(), &a) != 1)
      return malformedAddress("software device '" + d.name + "' has no IPv4 address");
    if (d.prefixLength > 32)
      return malformedAddress("software device '" + d.name + "' has prefix length > 32");
  }
  std::memcpy(d.gid.data(), gid.data(), 16);
  return d;
}

// One field of an address into `a` (a field of a newer version is skipped).
Status readField(uint8_t tag, std::string_view value, WorkerAddress& a, bool* haveUuid) {
  switch (tag) {
    case kTagUuid:
      if (value.size() != 16) return malformedAddress("the uuid is not 16 bytes");
      std::memcpy(a.uuid.data(), value.data(), 16);
      *haveUuid = true;
      break;
    case kTagStart: {
      Reader v(value);
      if (value.size() != 8 || !v.u64(&a.startNs)) return malformedAddress("the start time is not 8 bytes");
      break;
    }
    case kTagAlias:
      if (value.size() > kMaxAliasBytes || !validUtf8Text(value))
        return malformedAddress("the alias is too long or unprintable");
      a.alias.assign(value);
      break;
    case kTagHost:
      if (!validUtf8Text(value)) return malformedAddress("the host identity is unprintable");
      a.hostId.assign(value);
      break;
    case kTagControl: {
      if (a.control.size() >= kMaxAddressListEntries) return malformedAddress("too many control endpoints");
      FERRY_ASSIGN_OR_RETURN(ControlEndpoint c, decodeControl(value));
      a.control.push_back(std::move(c));
      break;
    }
    case kTagDevice: {
      if (a.devices.size() >= kMaxAddressListEntries) return malformedAddress("too many devices");
      FERRY_ASSIGN_OR_RETURN(DeviceAddress d, decodeDevice(value));
      a.devices.push_back(std::move(d));
      break;
    }
    default: break;  // a field of a newer version
  }
  return Status::ok();
}

}  // namespace

std::string uuidText(const Uuid& uuid) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : uuid) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Uuid newUuid() {
  std::random_device rd;
  Uuid u;
  for (size_t i = 0; i < u.size(); i += 4) {
    uint32_t v = rd();
    std::memcpy(u.data() + i, &v, 4);
  }
  u[6] = static_cast<uint8_t>((u[6] & 0x0f) | 0x40);
  u[8] = static_cast<uint8_t>((u[8] & 0x3f) | 0x80);
  return u;
}

std::string WorkerAddress::encode() const {
  Writer body;
  body.field(kTagUuid, std::string_view(reinterpret_cast<const char*>(uuid.data()), uuid.size()));
  {
    Writer v;
    v.u64(startNs);
    body.field(kTagStart, v.str());
  }
  body.field(kTagAlias, std::string_view(alias).substr(0, kMaxAliasBytes));
  body.field(kTagHost, std::string_view(hostId).substr(0, 1024));
  for (size_t i = 0; i < control.size() && i < kMaxAddressListEntries; ++i) {
    const ControlEndpoint& c = control[i];
    uint8_t raw[16] = {};
    if (inet_pton(c.ipv6 ? AF_INET6 : AF_INET, c.ip.c_str(), raw) != 1) continue;
    Writer v;
    v.u8(c.ipv6 ? 6 : 4);
    v.u16(c.port);
    v.bytes(std::string_view(reinterpret_cast<const char*>(raw), c.ipv6 ? 16 : 4));
    body.field(kTagControl, v.str());
  }
  for (size_t i = 0; i < devices.size() && i < kMaxAddressListEntries; ++i) {
    const DeviceAddress& d = devices[i];
    Writer v;
    v.u8(static_cast<uint8_t>(d.kind));
    v.shortText(d.name);
    v.shortText(d.ip);
    v.u8(d.prefixLength);
    v.u8(d.port);
    v.u8(d.linkLayer);
    v.u16(d.lid);
    v.bytes(std::string_view(reinterpret_cast<const char*>(d.gid.data()), 16));
    body.field(kTagDevice, v.str());
  }
  Writer out;
  out.bytes(std::string_view(kMagic, 4));
  out.u8(kAddressVersion);
  out.u8(0);
  out.u32(static_cast<uint32_t>(body.str().size()));
  out.bytes(body.str());
  return std::move(out.str());
}

Result<WorkerAddress> WorkerAddress::decode(std::string_view bytes) {
  if (bytes.size() > kMaxAddressBytes)
    return malformedAddress("longer than " + std::to_string(kMaxAddressBytes) + " bytes");
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return malformedAddress("not a ferry worker address (no \"FRYA\" header)");
  }
  Reader r(bytes.substr(4));
  uint8_t version, flags;
  uint32_t length;
  r.u8(&version);
  r.u8(&flags);
  r.u32(&length);
  if (version < 1) return malformedAddress("version 0");
  // A newer version only appends fields (skipped below), so it is read as far as this one knows.
  if (length != r.left()) return malformedAddress("the body length does not match the input");
  WorkerAddress a;
  bool haveUuid = false;
  while (r.left() > 0) {
    uint8_t tag;
    uint16_t n;
    std::string_view value;
    if (!r.u8(&tag) || !r.u16(&n) || !r.bytes(n, &value)) return malformedAddress("a field is truncated");
    FERRY_RETURN_IF_ERROR(readField(tag, value, a, &haveUuid));
  }
  if (!haveUuid) return malformedAddress("no uuid");
  if (a.control.empty()) return malformedAddress("no wireup listener address");
  return a;
}

std::string WorkerAddress::describe() const {
  std::string s = "'" + alias + "' " + uuidText(uuid).substr(0, 8) + " wireup";
  for (const auto& c : control)
    s += c.ipv6 ? " [" + c.ip + "]:" + std::to_string(c.port) : " " + c.ip + ":" + std::to_string(c.port);
  s += " devices";
  for (const auto& d : devices) {
    s += " " + d.name;
    if (d.kind == DeviceAddress::Kind::kSoft) s += "(" + d.ip + "/" + std::to_string(d.prefixLength) + ")";
  }
  return s;
}

std::string localHostId() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st {};
  std::string ns = stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : "?";
  return boot + "/net:" + ns;
}

}  // namespace ferry::agent
