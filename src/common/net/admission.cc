#include "common/net/admission.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.h"

namespace ferry::net {
namespace {

using Clock = std::chrono::steady_clock;

bool isLoopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
    return (ntohl(a.sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_LOOPBACK(&a.sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a.sin6_addr) && a.sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// This host's interface addresses in text form, read again at most once a second.
class HostAddresses {
 public:
  bool contains(const std::string& host) {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    if (read_ == Clock::time_point{} || now - read_ > std::chrono::seconds(1)) {
      refresh();
      read_ = now;
    }
    return std::find(hosts_.begin(), hosts_.end(), host) != hosts_.end();
  }

 private:
  void refresh() {
    hosts_.clear();
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) return;
    for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr) continue;
      sockaddr_storage s{};
      if (it->ifa_addr->sa_family == AF_INET) {
        std::memcpy(&s, it->ifa_addr, sizeof(sockaddr_in));
      } else if (it->ifa_addr->sa_family == AF_INET6) {
        std::memcpy(&s, it->ifa_addr, sizeof(sockaddr_in6));
      } else {
        continue;
      }
      std::string h = hostOf(s);
      if (!h.empty()) hosts_.push_back(std::move(h));
    }
    freeifaddrs(list);
  }

  std::mutex mu_;
  Clock::time_point read_{};
  std::vector<std::string> hosts_;
};

HostAddresses& hostAddresses() {
  static HostAddresses* addresses = new HostAddresses();  // never destroyed: used from any thread at exit
  return *addresses;
}

}  // namespace

std::string hostOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof text);
  } else if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {  // an IPv4 peer of a dual-stack socket
      inet_ntop(AF_INET, &a.sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof text);
    }
  }
  return text;
}

sockaddr_storage peerOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) addr.ss_family = AF_UNSPEC;
  return addr;
}

bool isThisHost(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_UNIX) return true;
  if (isLoopback(addr)) return true;
  std::string host = hostOf(addr);
  return !host.empty() && hostAddresses().contains(host);
}

bool LogLimiter::allow(uint64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = Clock::now();
  if (refilled_ == Clock::time_point{}) refilled_ = now;
  if (now - refilled_ >= interval_) {
    auto periods = static_cast<uint64_t>((now - refilled_) / interval_);
    tokens_ = static_cast<uint32_t>(std::min<uint64_t>(burst_, tokens_ + periods));
    refilled_ += interval_ * periods;
  }
  if (tokens_ == 0) {
    ++held_;
    ++heldTotal_;
    return false;
  }
  --tokens_;
  if (suppressed != nullptr) *suppressed = held_;
  held_ = 0;
  return true;
}

uint64_t LogLimiter::suppressedTotal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heldTotal_;
}

Admission::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(std::move(other.owner_)), source_(std::move(other.source_)) {
  other.owner_.reset();
  other.source_.clear();
}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    source_ = std::move(other.source_);
    other.owner_.reset();
    other.source_.clear();
  }
  return *this;
}

Admission::Ticket::~Ticket() { release(); }

void Admission::Ticket::release() {
  if (auto owner = owner_.lock()) owner->release(source_);
  owner_.reset();
  source_.clear();
}

std::shared_ptr<Admission> Admission::create(AdmissionLimits limits, std::string who) {
  return std::shared_ptr<Admission>(new Admission(limits, std::move(who)));
}

Result<Admission::Ticket> Admission::admit(const sockaddr_storage& peer) {
  std::string source = peer.ss_family == AF_UNIX ? std::string("local") : hostOf(peer);
  if (source.empty()) source = "unknown";
  if (limits_.thisHostOnly && !isThisHost(peer)) {
    std::lock_guard<std::mutex> lock(mu_);
    ++refused_;
    return Status(StatusCode::kPermissionDenied,
                  who_ + " refused a connection from " + source +
                      ": it has no secret, so it accepts peers from this host only (protected mode; "
                      "docs/security.md says how to serve other hosts)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t& mine = perSource_[source];
  if (total_ >= limits_.maxTotal || mine >= limits_.maxPerSource) {
    bool all = total_ >= limits_.maxTotal;
    if (mine == 0) perSource_.erase(source);
    ++refused_;
    return resourceExhausted(who_ + " refused a connection from " + source + ": " +
                             (all ? "it holds " + std::to_string(total_) + " connections, its cap"
                                  : "that source holds " + std::to_string(limits_.maxPerSource) +
                                        " connections, the cap per source"));
  }
  ++mine;
  ++total_;
  Ticket ticket;
  ticket.owner_ = weak_from_this();
  ticket.source_ = std::move(source);
  return ticket;
}

void Admission::release(const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = perSource_.find(source);
  if (it == perSource_.end()) return;
  if (--it->second == 0) perSource_.erase(it);
  if (total_ > 0) --total_;
}

void Admission::logRefusal(const Status& why) {
  uint64_t held = 0;
  if (!log_.allow(&held)) return;
  if (held > 0) {
    FERRY_LOG(kWarn, "%s (and %llu refusals not logged since the last line)", why.message().c_str(),
              static_cast<unsigned long long>(held));
  } else {
    FERRY_LOG(kWarn, "%s", why.message().c_str());
  }
}

size_t Admission::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

size_t Admission::heldFrom(const std::string& source) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = perSource_.find(source);
  return it == perSource_.end() ? 0 : it->second;
}

uint64_t Admission::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

}  // namespace ferry::net
