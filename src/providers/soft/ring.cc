#include "providers/soft/ring.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "common/cpu_relax.h"
#include "common/device_access.h"
#include "ferry/common/config.h"

namespace ferry::soft {
namespace ring_layout {

// One ring's indices. head: bytes the producer has published; tail: bytes the consumer has taken.
// Each on its own cache line, so producer and consumer do not share one.
constexpr uint32_t kConsumerAwake = 0;
constexpr uint32_t kConsumerAsleep = 1;
constexpr uint32_t kConsumerAttended = 2;

struct alignas(64) Control {
  std::atomic<uint64_t> head{0};
  uint8_t pad0[56];
  std::atomic<uint64_t> tail{0};
  uint8_t pad1[56];
  // The consumer's state, which it sets: kConsumerAwake, kConsumerAsleep (before it waits on its
  // eventfd) or kConsumerAttended (awake, and its application polls: leave what you write).
  std::atomic<uint32_t> consumerSleeping{1};
  std::atomic<uint32_t> producerWaiting{0};  // set by the producer when it waits for room
  // CLOCK_MONOTONIC ns until which the consumer's application polls (and progresses this ring
  // itself): a producer does not wake a sleeping consumer before then. Written by the consumer.
  std::atomic<int64_t> attendedUntilNs{0};
  uint8_t pad2[48];
};

struct RingSegment {
  uint64_t magic;
  uint32_t version;
  uint32_t ringBytes;
  uint8_t pad[48];
  Control ctl[2];  // [0]: requester -> responder, [1]: responder -> requester
};

constexpr size_t kDataOffset = 4096;
static_assert(sizeof(RingSegment) <= kDataOffset);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the rings need address-free atomics");

}  // namespace ring_layout

namespace {

using ring_layout::Control;
using ring_layout::kConsumerAsleep;
using ring_layout::kConsumerAttended;
using ring_layout::kConsumerAwake;
using ring_layout::kDataOffset;
using ring_layout::RingSegment;

std::atomic<uint64_t> linksMade{0};
std::atomic<uint64_t> bytesWritten{0};
std::atomic<uint64_t> setupsRefused{0};
std::atomic<uint64_t> wakesSpared{0};

constexpr size_t kMinRing = 64 * 1024;
constexpr size_t kMaxRing = 64 * 1024 * 1024;

// The longest a consumer polls its ring before it sleeps: FERRY_SOFT_SPIN_US (0 turns polling
// off), default 0 on machines with fewer than four cores (the polling thread would take the core
// the application's own threads need), else 20 us.
int64_t maxSpinNs() {
  static const int64_t value = [] {
    if (std::optional<int64_t> us = config::softSpinUs()) return *us * 1000;
    long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    return cores >= 4 ? int64_t{20000} : int64_t{0};
  }();
  return value;
}

bool isEventFd(int fd) {
  char path[64];
  char target[64] = {};
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(path, target, sizeof target - 1);
  return n > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

void closeAll(int a, int b, int c) {
  for (int fd : {a, b, c}) {
    if (fd >= 0) ::close(fd);
  }
}

// Copies n bytes between a ring of `size` bytes (at position pos, wrapping) and an iovec list,
// starting `skip` bytes into the list.
void copyRing(uint8_t* ring, size_t size, uint64_t pos, const iovec* iov, int count, size_t n, bool toRing) {
  size_t at = static_cast<size_t>(pos & (size - 1));
  for (int i = 0; i < count && n > 0; ++i) {
    auto* p = static_cast<uint8_t*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, n);
    n -= len;
    while (len > 0) {
      size_t piece = std::min(len, size - at);
      DeviceAccess device;  // iov may be registered memory
      if (toRing) {
        std::memcpy(ring + at, p, piece);
      } else {
        std::memcpy(p, ring + at, piece);
      }
      p += piece;
      len -= piece;
      at = (at + piece) & (size - 1);
    }
  }
}

}  // namespace

uint64_t ringLinksMade() { return linksMade.load(std::memory_order_relaxed); }
uint64_t ringBytesWritten() { return bytesWritten.load(std::memory_order_relaxed); }
uint64_t ringWakesSpared() { return wakesSpared.load(std::memory_order_relaxed); }
uint64_t ringSetupsRefused() { return setupsRefused.load(std::memory_order_relaxed); }
void countRingSetupRefused() { setupsRefused.fetch_add(1, std::memory_order_relaxed); }

size_t RingPair::defaultRingBytes() {
  static const size_t value = [] {
    size_t bytes = size_t{1} << 20;
    if (std::optional<uint64_t> v = config::softRingBytes(); v && *v >= kMinRing && *v <= kMaxRing) {
      bytes = std::bit_floor(static_cast<size_t>(*v));
    }
    return bytes;
  }();
  return value;
}

std::string ringListenerName(uint32_t pid, uint64_t nonce) {
  char name[64];
  std::snprintf(name, sizeof name, "ferry-soft-ring-%u-%016llx", pid, static_cast<unsigned long long>(nonce));
  return name;
}

socklen_t ringListenerAddress(uint32_t pid, uint64_t nonce, sockaddr_un* out) {
  std::string name = ringListenerName(pid, nonce);
  *out = sockaddr_un{};
  out->sun_family = AF_UNIX;
  std::memcpy(out->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

namespace {
constexpr size_t kSetupFds = 3;  // memfd, the requester's eventfd, the responder's eventfd

// A message of one piece with room for ancillary data (the descriptors).
msghdr setupHeader(iovec* iov, void* control, size_t controlLen) {
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = controlLen;
  return mh;
}
}  // namespace

Status sendRingSetup(int sock, const RingPair& rings, uint64_t ticket) {
  RingSetupMessage msg = rings.setupMessage();
  msg.ticket = ticket;
  int fds[kSetupFds] = {rings.memfd(), rings.ownWakeFd(), rings.peerWakeFd()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{&msg, sizeof msg};
  msghdr mh = setupHeader(&iov, control, sizeof control);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (::sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof msg)) {
    return ioError("sending a ring's setup");
  }
  return Status::ok();
}

Result<std::unique_ptr<RingPair>> receiveRingSetup(int sock,
                                                   const std::function<bool(uint64_t ticket)>& admit) {
  RingSetupMessage msg;
  // Room for one descriptor more than a setup has, so that too many show as MSG_CTRUNC or a count.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kSetupFds + 1))];
  iovec iov{&msg, sizeof msg};
  msghdr mh = setupHeader(&iov, control, sizeof control);
  ssize_t n = ::recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    return Status(StatusCode::kUnavailable, "no ring setup yet", EAGAIN);
  }
  // Every descriptor that came is ours to close unless the ring adopts it.
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t k = 0; k < count; ++k) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + k * sizeof(int), sizeof got);
      fds.push_back(got);
    }
  }
  auto refuse = [&](const char* why) -> Status {
    for (int f : fds) ::close(f);
    countRingSetupRefused();
    return Status(StatusCode::kProtocolError, std::string("refused a ring connection: ") + why);
  };
  if (n == 0) return refuse("the peer hung up before its setup");
  if (n < 0) return refuse("the setup could not be read");
  if (n != static_cast<ssize_t>(sizeof msg) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    return refuse("a setup message of the wrong size");
  }
  if (fds.size() != kSetupFds) return refuse("a setup message without exactly three descriptors");
  if (!admit(msg.ticket)) return refuse("a ticket no hello reply of this process gave");
  // [memfd, the requester's eventfd, ours]
  auto rings = RingPair::adopt(msg, fds[0], fds[2], fds[1]);
  if (!rings.isOk()) countRingSetupRefused();
  return rings;
}

Result<std::unique_ptr<RingPair>> RingPair::create(size_t ringBytes) {
  if (ringBytes < kMinRing || ringBytes > kMaxRing || !std::has_single_bit(ringBytes)) {
    return Status(StatusCode::kInvalidArgument, "ring size must be a power of two from 64 KiB to 64 MiB");
  }
  std::unique_ptr<RingPair> rings(new RingPair);
  rings->requester_ = true;
  rings->ringBytes_ = ringBytes;
  rings->mapBytes_ = kDataOffset + 2 * ringBytes;
  rings->memfd_ = ::memfd_create("ferry-soft-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (rings->memfd_ < 0) return ioError("memfd_create for a shared-memory ring");
  if (::ftruncate(rings->memfd_, static_cast<off_t>(rings->mapBytes_)) != 0)
    return ioError("ftruncate of a ring");
  if (::fcntl(rings->memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ioError("sealing a ring's memfd");
  }
  void* base = ::mmap(nullptr, rings->mapBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, rings->memfd_, 0);
  if (base == MAP_FAILED) return ioError("mmap of a ring");
  rings->base_ = static_cast<uint8_t*>(base);
  auto* seg = new (rings->base_) RingSegment{};
  seg->magic = RingSetupMessage::kMagic;
  seg->version = RingSetupMessage::kVersion;
  seg->ringBytes = static_cast<uint32_t>(ringBytes);
  rings->ownWake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  rings->peerWake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (rings->ownWake_ < 0 || rings->peerWake_ < 0) return ioError("eventfd for a ring");
  rings->outData_ = rings->base_ + kDataOffset;
  rings->inData_ = rings->base_ + kDataOffset + ringBytes;
  rings->spinNs_ = maxSpinNs() / 4;
  linksMade.fetch_add(1, std::memory_order_relaxed);
  return rings;
}

Result<std::unique_ptr<RingPair>> RingPair::adopt(const RingSetupMessage& msg, int memfd, int ownWake,
                                                  int peerWake) {
  auto refuse = [&](const std::string& why) -> Status {
    closeAll(memfd, ownWake, peerWake);
    return Status(StatusCode::kProtocolError, "refused a shared-memory ring: " + why);
  };
  if (msg.magic != RingSetupMessage::kMagic) return refuse("bad magic");
  if (msg.version != RingSetupMessage::kVersion)
    return refuse("unsupported version " + std::to_string(msg.version));
  size_t ringBytes = msg.ringBytes;
  if (ringBytes < kMinRing || ringBytes > kMaxRing || !std::has_single_bit(ringBytes)) {
    return refuse("ring size " + std::to_string(ringBytes) + " is not a power of two from 64 KiB to 64 MiB");
  }
  if (memfd < 0 || ownWake < 0 || peerWake < 0) return refuse("descriptors missing");
  int seals = ::fcntl(memfd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return refuse("the segment is not a memfd sealed against shrinking and growing");
  }
  struct stat st {};
  size_t mapBytes = kDataOffset + 2 * ringBytes;
  if (::fstat(memfd, &st) != 0 || static_cast<size_t>(st.st_size) != mapBytes) {
    return refuse("the segment's size does not match its rings");
  }
  if (!isEventFd(ownWake) || !isEventFd(peerWake)) return refuse("a wake-up descriptor is not an eventfd");
  // The peer chose these descriptors' flags: a blocking eventfd would stall this progress thread in
  // clearWake() (a read with the counter at zero) or in a wake-up (a write with the counter preset
  // near its limit). Both are made non-blocking, for the peer's copies too (one open file).
  for (int fd : {ownWake, peerWake}) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ((flags & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)) {
      return refuse("a wake-up descriptor cannot be made non-blocking");
    }
  }
  void* base = ::mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    closeAll(memfd, ownWake, peerWake);
    return ioError("mmap of a peer's ring", err);
  }
  std::unique_ptr<RingPair> rings(new RingPair);
  rings->requester_ = false;
  rings->memfd_ = memfd;
  rings->ownWake_ = ownWake;
  rings->peerWake_ = peerWake;
  rings->base_ = static_cast<uint8_t*>(base);
  rings->mapBytes_ = mapBytes;
  rings->ringBytes_ = ringBytes;
  rings->outData_ = rings->base_ + kDataOffset + ringBytes;
  rings->inData_ = rings->base_ + kDataOffset;
  // The indices start where the requester left them (zero unless it is hostile; checked on use).
  rings->outHead_ = rings->outCtl().head.load(std::memory_order_acquire);
  rings->outTailSeen_ = rings->outHead_;  // an empty ring; a tail the peer set otherwise is refused on use
  rings->inTail_ = rings->inCtl().tail.load(std::memory_order_acquire);
  rings->spinNs_ = maxSpinNs() / 4;
  linksMade.fetch_add(1, std::memory_order_relaxed);
  return rings;
}

RingPair::~RingPair() {
  if (base_) ::munmap(base_, mapBytes_);
  closeAll(memfd_, ownWake_, peerWake_);
}

RingSetupMessage RingPair::setupMessage() const {
  RingSetupMessage msg;
  msg.ringBytes = static_cast<uint32_t>(ringBytes_);
  return msg;
}

Control& RingPair::outCtl() const { return reinterpret_cast<RingSegment*>(base_)->ctl[requester_ ? 0 : 1]; }
Control& RingPair::inCtl() const { return reinterpret_cast<RingSegment*>(base_)->ctl[requester_ ? 1 : 0]; }

void RingPair::wakePeer() {
  uint64_t one = 1;
  ssize_t n = ::write(peerWake_, &one, sizeof one);
  (void)n;  // EAGAIN: the counter is saturated, so the peer is woken anyway
}

void RingPair::wakeSelf() {
  uint64_t one = 1;
  ssize_t n = ::write(ownWake_, &one, sizeof one);
  (void)n;
}

void RingPair::clearWake() {
  uint64_t value;
  ssize_t n = ::read(ownWake_, &value, sizeof value);
  (void)n;
}

bool RingPair::refreshOutTail(Control& ctl, std::memory_order order, size_t* room) {
  const uint64_t tail = ctl.tail.load(order);
  if (tail - outTailSeen_ > outHead_ - outTailSeen_) {  // before what we saw, or past our head
    errno = EPROTO;
    return false;
  }
  outTailSeen_ = tail;
  *room = ringBytes_ - static_cast<size_t>(outHead_ - tail);
  return true;
}

ssize_t RingPair::writev(const iovec* iov, int count) {
  Control& ctl = outCtl();
  size_t want = 0;
  for (int i = 0; i < count; ++i) want += iov[i].iov_len;
  size_t room = ringBytes_ - static_cast<size_t>(outHead_ - outTailSeen_);
  if (room < want && !refreshOutTail(ctl, std::memory_order_acquire, &room)) return -1;
  if (room == 0) {
    // Ask for a wake-up, then look again: the consumer may have made room in between.
    ctl.producerWaiting.store(1, std::memory_order_seq_cst);
    if (!refreshOutTail(ctl, std::memory_order_seq_cst, &room)) return -1;
    if (room == 0) {
      errno = EAGAIN;
      return -1;
    }
  }
  size_t n = std::min(room, want);
  if (n == 0) return 0;
  copyRing(outData_, ringBytes_, outHead_, iov, count, n, /*toRing=*/true);
  outHead_ += n;
  ctl.head.store(outHead_, std::memory_order_seq_cst);
  bytesWritten.fetch_add(n, std::memory_order_relaxed);
  // A sleeping consumer is woken, unless its application polls the ring meanwhile (it said until
  // when); then its own timer at that moment takes what it left.
  // A consumer whose application polls (attend) said so itself: nothing to weigh.
  if (const uint32_t consumer = ctl.consumerSleeping.load(std::memory_order_seq_cst);
      consumer == kConsumerAttended) {
    wakesSpared.fetch_add(1, std::memory_order_relaxed);
  } else if (consumer != kConsumerAwake) {
    const int64_t attended = ctl.attendedUntilNs.load(std::memory_order_seq_cst);
    if (attended != 0 && attended > steadyNs()) {
      wakesSpared.fetch_add(1, std::memory_order_relaxed);
    } else if (ctl.consumerSleeping.exchange(kConsumerAwake, std::memory_order_seq_cst) != kConsumerAwake) {
      wakePeer();
    }
  }
  return static_cast<ssize_t>(n);
}

void RingPair::attend(int64_t untilNs) { inCtl().attendedUntilNs.store(untilNs, std::memory_order_seq_cst); }

// Sequentially consistent: after attend(0), this read and the producer's check of the lease
// cannot both miss (the producer's store of head comes before its read of the lease).
bool RingPair::readable() const { return inCtl().head.load(std::memory_order_seq_cst) != inTail_; }

ssize_t RingPair::readv(const iovec* iov, int count) {
  Control& ctl = inCtl();
  uint64_t head = ctl.head.load(std::memory_order_acquire);
  uint64_t avail = head - inTail_;
  if (avail > ringBytes_) {
    errno = EPROTO;
    return -1;
  }
  if (avail == 0) {
    errno = EAGAIN;
    return -1;
  }
  size_t want = 0;
  for (int i = 0; i < count; ++i) want += iov[i].iov_len;
  size_t n = std::min<size_t>(avail, want);
  if (n == 0) return 0;
  copyRing(inData_, ringBytes_, inTail_, iov, count, n, /*toRing=*/false);
  inTail_ += n;
  ctl.tail.store(inTail_, std::memory_order_seq_cst);
  if (ctl.producerWaiting.load(std::memory_order_seq_cst) != 0 &&
      ctl.producerWaiting.exchange(0, std::memory_order_seq_cst) != 0) {
    wakePeer();
  }
  return static_cast<ssize_t>(n);
}

bool RingPair::prepareToSleep(int64_t nowNs, bool spin) {
  Control& ctl = inCtl();
  if (readable()) return true;
  // While our application polls the ring (a lease), its polls take what comes: no spin here,
  // which would hold the poll that just took a frame from returning it, and no sleep. A reading of
  // the clock older than now may see a lease that has just ended: the thread that sweeps after
  // the lease's end (under the loop this caller holds, so after it) arms the ring then.
  const int64_t attended = ctl.attendedUntilNs.load(std::memory_order_relaxed);
  if (attended != 0 && attended > nowNs) {
    if (ctl.consumerSleeping.load(std::memory_order_relaxed) != kConsumerAttended) {
      ctl.consumerSleeping.store(kConsumerAttended, std::memory_order_seq_cst);
    }
    return false;
  }
  const int64_t maxSpin = spin ? maxSpinNs() : 0;
  if (maxSpin > 0) {
    int64_t budget = spinNs_ > 0 ? spinNs_ : 0;
    if (budget == 0 && ++idleSleeps_ >= 64) {
      budget = 1000;  // now and then, see whether spinning pays again
      idleSleeps_ = 0;
    }
    if (budget > 0) {
      int64_t start = steadyNs();
      for (int i = 0;; ++i) {
        if (readable()) {
          spinNs_ = std::min(maxSpin, std::max<int64_t>(budget * 2, 2000));
          return true;
        }
        cpuRelax();
        if ((i & 15) == 15 && steadyNs() - start >= budget) break;
      }
      spinNs_ = budget / 2 < 500 ? 0 : budget / 2;
    }
  }
  ctl.consumerSleeping.store(kConsumerAsleep, std::memory_order_seq_cst);
  if (ctl.head.load(std::memory_order_seq_cst) != inTail_) {
    ctl.consumerSleeping.store(kConsumerAwake, std::memory_order_relaxed);
    return true;
  }
  return false;
}

}  // namespace ferry::soft
