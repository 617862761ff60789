// Admission of inbound connections, written once for every listener that faces the network (the
// agent's wireup listener, `ferry store`, the object store's HTTP server, the soft devices'
// listeners), so that each applies the same bounds the same way:
//
//   - protected mode: a listener with no secret or credentials accepts peers from this host only
//     (a loopback address, or an address of one of this host's interfaces), as Redis's protected
//     mode does, and says so when it refuses one;
//   - caps: connections at once per source address and in total;
//   - refusals logged at a bounded rate (LogLimiter), so that a flood of bad input cannot flood
//     the log too.
//
// Deadlines (handshake, idle) belong to the connection that reads the bytes; this file decides
// only whether a connection may exist. Every type here is thread-safe.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/common/status.h"

namespace ferry::net {

// The text form of a socket address ("127.0.0.1", "::1"), without the port; "" for other families.
std::string hostOf(const sockaddr_storage& addr);
// The peer of a connected socket, or an AF_UNSPEC address when it has none.
sockaddr_storage peerOf(int fd);

// Whether `addr` belongs to this host: loopback (127/8, ::1, IPv4-mapped loopback), or assigned to
// one of this host's interfaces in this network namespace. The interfaces are read again at most
// once a second, so an address added at run time is seen.
bool isThisHost(const sockaddr_storage& addr);

// What a listener admits.
struct AdmissionLimits {
  // Only peers on this host (protected mode): the default of every listener without a secret.
  bool thisHostOnly = true;
  // Connections held at once from one source address, and in all.
  size_t maxPerSource = 64;
  size_t maxTotal = 1024;
};

// Logs at most `burst` lines at once and then one line per `interval`; the lines it held back are
// counted, and the next line it lets through says how many there were.
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1), uint32_t burst = 5)
      : interval_(interval), burst_(burst), tokens_(burst) {}
  // True when a line may be written now; `suppressed` is then the number held back since the last.
  bool allow(uint64_t* suppressed);
  uint64_t suppressedTotal() const;

 private:
  mutable std::mutex mu_;
  const std::chrono::milliseconds interval_;
  const uint32_t burst_;
  uint32_t tokens_;
  std::chrono::steady_clock::time_point refilled_{};
  uint64_t held_ = 0;
  uint64_t heldTotal_ = 0;
};

// Counts the connections a listener holds and decides whether one more may be opened.
//
//   net::Admission admission({.thisHostOnly = secret.empty()}, "ferry store");
//   auto ticket = admission.admit(net::peerOf(fd));
//   if (!ticket.isOk()) { admission.logRefusal(ticket.status()); ::close(fd); return; }
//   conn->ticket = std::move(*ticket);   // released when the connection goes
class Admission : public std::enable_shared_from_this<Admission> {
 public:
  // One admitted connection; its slot is released when the ticket is destroyed (also after the
  // Admission itself went).
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&&) noexcept;
    Ticket& operator=(Ticket&&) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    // The source the ticket was issued to ("" for an empty ticket).
    const std::string& source() const { return source_; }
    // Gives the slot back now.
    void release();

   private:
    friend class Admission;
    std::weak_ptr<Admission> owner_;
    std::string source_;
  };

  // `who` names the listener in refusals ("agent 'decode-0'", "ferry store").
  static std::shared_ptr<Admission> create(AdmissionLimits limits, std::string who);

  // A ticket for one connection from `peer`, or why not: PermissionDenied for a peer of another
  // host in protected mode, ResourceExhausted for a source or listener at its cap.
  Result<Ticket> admit(const sockaddr_storage& peer);
  // Logs `why` at WARN through this listener's LogLimiter (one line a second after a burst).
  void logRefusal(const Status& why);

  const AdmissionLimits& limits() const { return limits_; }
  size_t held() const;
  size_t heldFrom(const std::string& source) const;
  uint64_t refused() const;

 private:
  Admission(AdmissionLimits limits, std::string who) : limits_(limits), who_(std::move(who)) {}
  void release(const std::string& source);

  const AdmissionLimits limits_;
  const std::string who_;
  mutable std::mutex mu_;
  std::map<std::string, size_t> perSource_;
  size_t total_ = 0;
  uint64_t refused_ = 0;
  LogLimiter log_;
};

}  // namespace ferry::net
