// The object store's text formats: XML escaping, S3 and HTTP times, bucket and key names,
// headers, client addresses and MD5.
#include "objects/store_server_impl.h"

namespace ferry::objects {

std::string xmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string isoTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  tm utc{};
  gmtime_r(&secs, &utc);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>((ns / 1000000) % 1000));
  return buf;
}

std::string httpTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  tm utc{};
  gmtime_r(&secs, &utc);
  char buf[64];
  strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &utc);
  return buf;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// S3's bucket naming rules, and keys that can be files under the data directory.
bool validBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '-' || c == '.')) {
      return false;
    }
  }
  return b.front() != '-' && b.front() != '.' && b.back() != '-' && b.back() != '.';
}

bool validKey(const std::string& k) {
  if (k.empty() || k.size() > 1024 || k.find('\0') != std::string::npos) return false;
  // No segment may be "." or ".." (a key is a path under the data directory).
  size_t start = 0;
  for (size_t i = 0; i <= k.size(); ++i) {
    if (i == k.size() || k[i] == '/') {
      std::string_view seg(k.data() + start, i - start);
      if (seg == "." || seg == ".." || (seg.empty() && i != k.size())) return false;
      start = i + 1;
    }
  }
  return true;
}

std::optional<uint64_t> number(const std::string& text) { return parseDecimal(text); }

std::vector<std::string_view> headerValues(const httplib::Request& req, const char* name) {
  std::vector<std::string_view> out;
  auto range = req.headers.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.emplace_back(it->second);
  return out;
}

// cpp-httplib's text form of a peer ("127.0.0.1", "::1") as a socket address; AF_UNSPEC when it
// is neither.
sockaddr_storage socketAddress(const std::string& text) {
  sockaddr_storage out{};
  out.ss_family = AF_UNSPEC;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (inet_pton(AF_INET6, text.substr(0, text.find('%')).c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  }
  return out;
}

// Whether the store serves a client at `remoteAddr` before reading its request further: with
// credentials every client (each request is then signed); without them, protected mode, only
// clients of this host unless the deployment opted out.
bool admitsClient(const StoreOptions& opts, const std::string& remoteAddr) {
  if (!opts.accessKey.empty() || opts.allowRemoteWithoutCredentials) return true;
  return net::isThisHost(socketAddress(remoteAddr));
}

std::string md5Of(const void* data, size_t n) {
  Md5 md5;
  md5.update(data, n);
  return md5.digest();
}

// A Content-MD5 header's 16 bytes (strict base64), or nullopt.
std::optional<std::string> contentMd5(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() != 24 || text.substr(22) != "==") return std::nullopt;
  std::string out;
  uint32_t bits = 0;
  int held = 0;
  for (char c : text.substr(0, 22)) {
    int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xFF));
    }
  }
  if (out.size() != 16 || (bits & ((1u << held) - 1)) != 0) return std::nullopt;
  return out;
}

Result<UserMetadata> userMetadataOf(const httplib::Request& req) {
  static constexpr std::string_view kPrefix = "x-amz-meta-";
  UserMetadata meta;
  size_t bytes = 0;
  for (const auto& [name, value] : req.headers) {
    if (name.size() <= kPrefix.size()) continue;
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (lower.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    bytes += lower.size() - kPrefix.size() + value.size();
    if (bytes > kMaxUserMetadataBytes) {
      return invalidArgument("the x-amz-meta-* headers hold more than " +
                             std::to_string(kMaxUserMetadataBytes) + " bytes of names and values");
    }
    meta.emplace_back(std::move(lower), value);
  }
  return meta;
}

void setUserMetadata(httplib::Response& res, const UserMetadata& meta) {
  for (const auto& [name, value] : meta) res.set_header(name, value);
}

}  // namespace ferry::objects
