// Feeds arbitrary input to the same-host ring's two decoders of peer input, as a hostile local
// process would: the setup message a ring listener receives (with descriptors chosen by the input:
// a sealed or unsealed memfd of some size, eventfds that block or not, preset counters), and then,
// for a setup that is adopted, a shared segment whose control block the peer scribbles on while
// the listener's side reads and writes. A refused setup must close every descriptor it came with;
// an adopted ring must never report more bytes than asked, nor read or write outside its segment
// (AddressSanitizer watches the copies).
//
// Input: [0, 24) the setup message; byte 24 the descriptor choices; bytes 25.. scribbles, each
// (offset byte, 8 value bytes) into the control block, interleaved with reads and writes.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "providers/soft/ring.h"

namespace {

using ferry::soft::RingPair;
using ferry::soft::RingSetupMessage;

constexpr uint64_t kTicket = 0x5eed5eed5eed5eedull;
constexpr size_t kRing = 64 * 1024;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "ring_fuzz: %s\n", what);
    std::abort();
  }
}

int openCount() {
  int n = 0;
  for (int fd = 0; fd < 256; ++fd) n += ::fcntl(fd, F_GETFD) != -1 ? 1 : 0;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(RingSetupMessage) + 1) return 0;
  RingSetupMessage msg;
  std::memcpy(&msg, data, sizeof msg);
  const uint8_t choice = data[sizeof msg];
  // Keep the size of the memfd near what the message names, or off by a little, as a peer might.
  const size_t ringBytes = (choice & 1) ? kRing : (size_t{msg.ringBytes} & ((1u << 22) - 1));
  const size_t segBytes = 4096 + 2 * ringBytes + ((choice & 2) ? 4096 : 0);
  const int before = openCount();

  int sv[2];
  check(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  int memfd = ::memfd_create("ring_fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  check(memfd >= 0, "memfd_create");
  if (::ftruncate(memfd, static_cast<off_t>(segBytes)) != 0) {
    ::close(memfd);
    ::close(sv[0]);
    ::close(sv[1]);
    return 0;
  }
  if (choice & 4) (void)::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  int wakeA = (choice & 8) ? ::eventfd(0, EFD_CLOEXEC) : ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int wakeB = (choice & 16) ? ::memfd_create("not-an-eventfd", MFD_CLOEXEC) : ::eventfd(0, EFD_CLOEXEC);
  if (choice & 32) {
    const uint64_t nearLimit = UINT64_MAX - 1;
    (void)!::write(wakeA, &nearLimit, sizeof nearLimit);
  }
  if (choice & 64) msg.ticket = kTicket;

  // Hand them over as a requester would (or with one descriptor too few).
  int fds[3] = {memfd, wakeA, wakeB};
  const size_t nfds = (choice & 128) ? 2 : 3;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{&msg, sizeof msg};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  check(::sendmsg(sv[0], &mh, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof msg), "sendmsg");

  bool admitted = false;
  auto link = ferry::soft::receiveRingSetup(sv[1], [&](uint64_t ticket) {
    admitted = ticket == kTicket;
    return admitted;
  });
  if (!link.isOk()) {
    check(!(msg.ticket != kTicket && admitted), "admitted a wrong ticket");
  } else {
    check(msg.ticket == kTicket, "adopted a setup without the ticket");
    // The peer's side of the segment: scribble on the control block between reads and writes.
    void* seg = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    check(seg != MAP_FAILED, "mmap of the adopted segment");
    std::vector<uint8_t> buf(2 * kRing + 17);
    size_t at = sizeof msg + 1;
    for (int round = 0; round < 64 && at + 9 <= size; ++round, at += 9) {
      const size_t offset = (data[at] * 8u) % 4096;
      std::memcpy(static_cast<uint8_t*>(seg) + offset, data + at + 1, 8);
      const size_t want = (data[at + 1] * 997u) % buf.size();
      iovec v{buf.data(), want};
      ssize_t n = (data[at] & 1) ? (*link)->readv(&v, 1) : (*link)->writev(&v, 1);
      check(n < 0 || static_cast<size_t>(n) <= want, "moved more bytes than asked");
      // A reading of the clock before any lease the segment may claim (0), or after every one.
      if (data[at] & 2) (void)(*link)->prepareToSleep((data[at] & 8) ? 0 : INT64_MAX);
      if (data[at] & 4) (*link)->clearWake();
      (void)(*link)->readable();
    }
    ::munmap(seg, 4096);
    link->reset();
  }
  ::close(memfd);
  ::close(wakeA);
  ::close(wakeB);
  ::close(sv[0]);
  ::close(sv[1]);
  check(openCount() == before, "a descriptor leaked");
  return 0;
}
