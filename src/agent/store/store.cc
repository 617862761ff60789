// Store::open and what every backend shares: the URL grammar, the limits on keys and values, the
// status of an unreachable store, the resync of a re-established watch.
#include "ferry/agent/store.h"

#include <cctype>
#include <charconv>
#include <string>

#include "agent/store/store_backend.h"

namespace ferry::agent {
namespace {

constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxValueBytes = size_t{1} << 20;

// A backend left out of the build (CMakeLists.txt: FERRY_WITH_REDIS, FERRY_WITH_ETCD) keeps its row,
// so that its URLs are refused as not built rather than taken for an unknown scheme.
#if defined(FERRY_WITHOUT_REDIS) || defined(FERRY_WITHOUT_ETCD)
Result<std::unique_ptr<Store>> openUnbuiltStore(const StoreUrl& url, const StoreOptions&) {
  std::string option = "FERRY_WITH_";
  for (char c : url.scheme) option += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return notSupported("store URL '" + url.text + "': this ferry was built without " + url.scheme +
                      " support (configured with " + option + "=OFF)");
}
#endif

// The one table naming every backend: a new store is one row here and one file pair.
struct Backend {
  std::string_view scheme;
  bool remote;  // host:port after the scheme
  Result<std::unique_ptr<Store>> (*open)(const StoreUrl&, const StoreOptions&);
};
constexpr Backend kBackends[] = {
    {"memory", false, openMemoryStore},
    {"ferry", true, openFerryStore},
#ifdef FERRY_WITHOUT_REDIS
    {"redis", true, openUnbuiltStore},
#else
    {"redis", true, openRedisStore},
#endif
#ifdef FERRY_WITHOUT_ETCD
    {"etcd", true, openUnbuiltStore},
#else
    {"etcd", true, openEtcdStore},
#endif
};

Status badUrl(std::string_view url, const std::string& why) {
  return invalidArgument("store URL '" + std::string(url) + "': " + why);
}

// Length of the UTF-8 sequence starting at s[i], or 0 when it is not valid UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF are not).
size_t utf8Sequence(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = byte(i);
  if (c < 0x80) return 1;
  size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
  if (n == 0 || c > 0xf4 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  }
  uint8_t c1 = byte(i + 1);
  if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
      (c == 0xf4 && c1 >= 0x90)) {
    return 0;
  }
  return n;
}

bool parsePort(std::string_view text, uint16_t* port) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value == 0 || value > 65535) {
    return false;
  }
  *port = static_cast<uint16_t>(value);
  return true;
}

// host:port or [v6]:port, then an optional "/rest".
Status parseAuthority(std::string_view url, std::string_view rest, StoreUrl* out, std::string_view* path) {
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  *path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos || authority.substr(close + 1, 1) != ":") {
      return badUrl(url, "expected [ADDRESS]:PORT");
    }
    host = authority.substr(1, close - 1);
    port = authority.substr(close + 2);
  } else {
    size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos) return badUrl(url, "no port (expected HOST:PORT)");
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return badUrl(url, "an IPv6 address goes in brackets");
  }
  if (host.empty()) return badUrl(url, "no host (expected HOST:PORT)");
  for (char c : host) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':' ||
              c == '%';
    if (!ok) return badUrl(url, "the host has a character that is not allowed in a host name or address");
  }
  if (!parsePort(port, &out->port)) return badUrl(url, "the port must be a number in [1, 65535]");
  out->host.assign(host);
  return Status::ok();
}

}  // namespace

Status checkStoreKey(std::string_view key) {
  if (key.empty()) return invalidArgument("store key is empty");
  if (key.size() > kMaxKeyBytes) {
    return invalidArgument("store key is " + std::to_string(key.size()) + " bytes long (at most " +
                           std::to_string(kMaxKeyBytes) + ")");
  }
  for (size_t i = 0; i < key.size();) {
    uint8_t c = static_cast<uint8_t>(key[i]);
    size_t n = utf8Sequence(key, i);
    // Control characters would break the line-based protocols and the logs that print keys.
    if (n == 0 || c < 0x20 || c == 0x7f) {
      return invalidArgument("store key has a control character or invalid UTF-8 at byte " +
                             std::to_string(i));
    }
    i += n;
  }
  return Status::ok();
}

Status checkStoreValue(std::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return invalidArgument("store value is " + std::to_string(value.size()) + " bytes long (at most " +
                           std::to_string(kMaxValueBytes) + ")");
  }
  return Status::ok();
}

Result<StoreUrl> parseStoreUrl(std::string_view url) {
  size_t sep = url.find("://");
  if (sep == std::string_view::npos) return badUrl(url, "expected SCHEME://... (memory, ferry, redis, etcd)");
  StoreUrl out;
  out.text.assign(url);
  out.scheme.assign(url.substr(0, sep));
  std::string_view rest = url.substr(sep + 3);
  const Backend* backend = nullptr;
  for (const Backend& b : kBackends) {
    if (b.scheme == out.scheme) backend = &b;
  }
  if (backend == nullptr)
    return badUrl(url, "unknown scheme '" + out.scheme + "' (memory, ferry, redis, etcd)");
  if (!backend->remote) {
    for (char c : rest) {
      if (static_cast<uint8_t>(c) < 0x20 || c == '/') return badUrl(url, "a memory store's name has no '/'");
    }
    out.name = rest.empty() ? "default" : std::string(rest);
    return out;
  }
  std::string_view path;
  FERRY_RETURN_IF_ERROR(parseAuthority(url, rest, &out, &path));
  if (out.scheme == "redis" && !path.empty()) {
    auto [end, ec] = std::from_chars(path.data(), path.data() + path.size(), out.database);
    if (ec != std::errc() || end != path.data() + path.size() || out.database < 0) {
      return badUrl(url, "the database after '/' must be a non-negative number");
    }
  } else if (!path.empty()) {
    return badUrl(url, "nothing may follow HOST:PORT");
  }
  return out;
}

Result<std::unique_ptr<Store>> Store::open(std::string_view url, StoreOptions options) {
  FERRY_ASSIGN_OR_RETURN(StoreUrl parsed, parseStoreUrl(url));
  if (options.timeout <= std::chrono::milliseconds(0))
    return badUrl(url, "StoreOptions::timeout must be positive");
  for (const Backend& b : kBackends) {
    if (b.scheme == parsed.scheme) return b.open(parsed, options);
  }
  return badUrl(url, "unknown scheme");  // parseStoreUrl accepted only the table's schemes
}

Status storeUnavailable(const std::string& url, const std::string& why) {
  return Status(StatusCode::kUnavailable, "store " + url + " is unavailable: " + why);
}

void WatchMirror::note(const StoreEvent& event) {
  if (event.kind == StoreEvent::Kind::kPut) {
    keys_.insert(event.key);
  } else {
    keys_.erase(event.key);
  }
}

void WatchMirror::reset(const std::vector<StoreEntry>& current) {
  keys_.clear();
  for (const StoreEntry& e : current) keys_.insert(e.key);
}

std::vector<StoreEvent> WatchMirror::resync(const std::vector<StoreEntry>& current) {
  std::set<std::string, std::less<>> now;
  for (const StoreEntry& e : current) now.insert(e.key);
  std::vector<StoreEvent> events;
  for (const std::string& key : keys_) {
    if (now.find(key) == now.end()) events.push_back({StoreEvent::Kind::kDelete, key, {}});
  }
  for (const StoreEntry& e : current) events.push_back({StoreEvent::Kind::kPut, e.key, e.value});
  keys_ = std::move(now);
  return events;
}

}  // namespace ferry::agent
