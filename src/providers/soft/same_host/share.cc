#include "providers/soft/same_host/share.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/device_access.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "ferry/common/shared_memory.h"
#include "providers/soft/same_host/share_layout.h"

namespace ferry::soft {

namespace {

using namespace share_layout;
using verbs::QpState;

// CLOCK_MONOTONIC_COARSE in nanoseconds: the clock of the checks made at most every so often
// (a read of the vDSO's page, no system call).
int64_t coarseNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

// /proc/<pid>/fd/<fd>: how this process reaches a descriptor another process holds.
std::string procFdPath(uint32_t pid, uint32_t fd) {
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
}

// The start time of a process (field 22 of /proc/<pid>/stat, in clock ticks); 0 if unknown.
uint64_t processStartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return 0;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Whether the accessor that claimed a slot still runs. A process that exited is dead even while it
// is a zombie (not yet waited for by its parent), which kill(pid, 0) would still find: its pidfd is
// readable from the moment it exits. A reused pid is told apart by its start time.
bool accessorAlive(const AccessorSlot& slot) {
  pid_t pid = static_cast<pid_t>(slot.pid.load());
  if (pid == 0) return false;
  if (pid == getpid()) return true;
  if (int fd = pidfdOpen(pid); fd >= 0) {
    pollfd exited{fd, POLLIN, 0};
    const int ready = ::poll(&exited, 1, 0);
    ::close(fd);
    if (ready > 0 && (exited.revents & POLLIN)) return false;
  } else if (errno == ESRCH) {
    return false;
  } else if (::kill(pid, 0) != 0 && errno == ESRCH) {  // no pidfd here (an old kernel)
    return false;
  }
  uint64_t start = processStartTime(pid);
  return start == 0 || start == slot.startTime.load();
}

uint64_t selfStartTime() {
  static const uint64_t start = processStartTime(getpid());
  return start;
}

}  // namespace

namespace {

// FERRY_SOFT_SAME_HOST: "0" TCP only; "ring" shared-memory rings but no cross-memory attach (the
// path taken where the kernel refuses it); anything else (or unset): both, where allowed.
enum class SameHostMode { kOff, kRingOnly, kAuto };
SameHostMode sameHostMode() {
  switch (config::softSameHost()) {
    case config::SameHost::kOff: return SameHostMode::kOff;
    case config::SameHost::kRingOnly: return SameHostMode::kRingOnly;
    case config::SameHost::kAuto: break;
  }
  return SameHostMode::kAuto;
}

// What the kernel allows for cross-memory attach, probed once per process.
const std::pair<bool, std::string>& cmaProbe() {
  static const std::pair<bool, std::string> kernel = [] {
    // Cross-memory attach may be refused altogether (seccomp in containers, old kernels).
    uint64_t probe = 0x5a5a, got = 0;
    iovec local{&got, sizeof got}, remote{&probe, sizeof probe};
    if (::process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof got) ||
        got != probe) {
      return std::make_pair(false,
                            std::string("process_vm_readv refused here (") + std::strerror(errno) + ")");
    }
    int pidfd = pidfdOpen(getpid());
    if (pidfd < 0)
      return std::make_pair(false, std::string("pidfd_open unavailable (") + std::strerror(errno) + ")");
    ::close(pidfd);
    return std::make_pair(true, std::string());
  }();
  return kernel;
}

constexpr const char* kRingWords = "SEND, immediates, atomics and acknowledgements over shared-memory rings";

}  // namespace

bool sameHostAllowed(std::string* reason) {
  const auto& kernel = cmaProbe();
  static std::once_flag logged;
  std::call_once(logged, [&] {
    if (kernel.first) {
      FERRY_LOG(kInfo, "soft: same-host path: one-copy WRITE and READ by cross-memory attach; %s",
                kRingWords);
    } else {
      FERRY_LOG(kWarn,
                "soft: same-host path: cross-memory attach unavailable (%s): WRITE and READ data is staged "
                "through shared-memory rings (two copies); %s",
                kernel.second.c_str(), kRingWords);
    }
  });
  switch (sameHostMode()) {
    case SameHostMode::kOff:
      if (reason) *reason = "off (FERRY_SOFT_SAME_HOST=0): same-host traffic uses TCP";
      return false;
    case SameHostMode::kRingOnly:
      if (reason) {
        *reason = std::string(
                      "rings only (FERRY_SOFT_SAME_HOST=ring): WRITE and READ data staged through "
                      "shared-memory rings (two copies); ") +
                  kRingWords;
      }
      return false;
    case SameHostMode::kAuto: break;
  }
  if (reason) {
    if (kernel.first) {
      *reason = std::string(
                    "on: one-copy WRITE and READ by process_vm_writev/readv between processes that may "
                    "read each other's memory; ") +
                kRingWords;
    } else {
      *reason = "on, without cross-memory attach (" + kernel.second +
                "): WRITE and READ data staged through shared-memory rings (two copies); " + kRingWords;
    }
  }
  return kernel.first;
}

bool sameHostRingsAllowed() { return sameHostMode() != SameHostMode::kOff; }

namespace {
std::atomic<uint64_t> splitCopies{0};
}  // namespace

std::atomic<uint64_t> sameHostOpCounts[3] = {};

uint64_t sameHostSplitCopies() { return splitCopies.load(std::memory_order_relaxed); }

uint64_t sameHostOpsDone() {
  uint64_t total = 0;
  for (const auto& count : sameHostOpCounts) total += count.load(std::memory_order_relaxed);
  return total;
}
uint64_t sameHostMappedOpsDone() {
  return sameHostOpCounts[static_cast<int>(SameHostCopy::kMapped)].load(std::memory_order_relaxed);
}
uint64_t sameHostDeviceOpsDone() {
  return sameHostOpCounts[static_cast<int>(SameHostCopy::kDevice)].load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Owner.

Result<std::unique_ptr<ShareTable>> ShareTable::create() {
  std::unique_ptr<ShareTable> t(new ShareTable());
  t->fd_ = ::memfd_create("ferry-soft-share", MFD_CLOEXEC);
  if (t->fd_ < 0) return Status(StatusCode::kIoError, "same-host table: memfd_create", errno);
  if (::ftruncate(t->fd_, static_cast<off_t>(kTableSize)) != 0) {
    return Status(StatusCode::kIoError, "same-host table: ftruncate", errno);
  }
  void* p = ::mmap(nullptr, kTableSize, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd_, 0);
  if (p == MAP_FAILED) return Status(StatusCode::kIoError, "same-host table: mmap", errno);
  t->base_ = static_cast<uint8_t*>(p);
  t->size_ = kTableSize;
  while (t->cookie_ == 0) {
    if (getrandom(&t->cookie_, sizeof t->cookie_, 0) != sizeof t->cookie_) {
      return Status(StatusCode::kIoError, "same-host table: getrandom", errno);
    }
  }
  auto* h = reinterpret_cast<Header*>(t->base_);
  h->version.store(kVersion);
  h->ownerPid.store(static_cast<uint32_t>(getpid()));
  h->cookie.store(t->cookie_);
  h->cookieAddr.store(reinterpret_cast<uintptr_t>(&t->cookie_));
  h->mrSlots.store(kMrSlots);
  h->qpSlots.store(kQpSlots);
  h->accessorSlots.store(kAccessorSlots);
  h->magic.store(kMagic, std::memory_order_release);
  return t;
}

ShareTable::~ShareTable() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

ShareInfo ShareTable::info() const {
  return ShareInfo{static_cast<uint32_t>(getpid()), static_cast<uint32_t>(fd_), cookie_};
}

bool ShareTable::keyFits(uint32_t key) const { return mrs(base_)[mrSlotOf(key)].key.load() == 0; }

void ShareTable::publishMr(uint32_t key, const void* addr, uint64_t length, uint32_t access, const void* pd,
                           MemoryLocation where, const cuda::IpcHandle* ipc) {
  std::optional<SharedBacking> backing;
  if (!where.onDevice()) backing = findSharedBacking(addr, length);
  std::lock_guard<std::mutex> lock(writeMu_);
  MrRecord& r = mrs(base_)[mrSlotOf(key)];
  if (r.key.load() != 0) return;
  DeviceRecord& d = devices(base_)[mrSlotOf(key)];
  rewrite(r, [&](MrRecord& w) {
    writeDevice(w, d, where, ipc);
    w.key.store(key, std::memory_order_relaxed);
    w.access.store(access, std::memory_order_relaxed);
    w.pd.store(reinterpret_cast<uintptr_t>(pd), std::memory_order_relaxed);
    w.addr.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_relaxed);
    w.length.store(length, std::memory_order_relaxed);
    w.memFd.store(backing ? static_cast<uint32_t>(backing->fd) + 1 : 0, std::memory_order_relaxed);
    w.memInode.store(backing ? backing->inode : 0, std::memory_order_relaxed);
    w.memOffset.store(backing ? backing->offset : 0, std::memory_order_relaxed);
  });
}

void ShareTable::withdrawMr(uint32_t key) {
  std::lock_guard<std::mutex> lock(writeMu_);
  MrRecord& r = mrs(base_)[mrSlotOf(key)];
  if (r.key.load() != key) return;  // never published
  DeviceRecord& d = devices(base_)[mrSlotOf(key)];
  rewrite(r, [&](MrRecord& w) {
    w.key.store(0, std::memory_order_relaxed);
    w.length.store(0, std::memory_order_relaxed);
    w.memFd.store(0, std::memory_order_relaxed);
    writeDevice(w, d, MemoryLocation{}, nullptr);
  });
}

void ShareTable::waitForAccessors(uint32_t key) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto* h = reinterpret_cast<Header*>(base_);
  AccessorSlot* slots = accessors(base_);
  uint32_t used = std::min(h->accessorsUsed.load(), kAccessorSlots);
  for (uint32_t i = 0; i < used; ++i) {
    AccessorSlot& slot = slots[i];
    auto start = std::chrono::steady_clock::now();
    bool warned = false;
    for (int spins = 0; slot.busyKey.load(std::memory_order_seq_cst) == key; ++spins) {
      if (spins < 1000) continue;
      if (!accessorAlive(slot)) {
        uint32_t expected = key;
        slot.busyKey.compare_exchange_strong(expected, 0);
        break;
      }
      if (!warned && std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) {
        FERRY_LOG(kWarn, "deregistration waits for process %u, which is copying from or to the region",
                  slot.pid.load());
        warned = true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void ShareTable::publishQp(uint32_t qpn, QpState state, uint32_t access, const void* pd, uint32_t destQpn) {
  std::lock_guard<std::mutex> lock(writeMu_);
  QpRecord& r = qps(base_)[qpSlotOf(qpn)];
  uint32_t current = r.qpn.load();
  if (current != 0 && current != (qpn | kQpValid)) return;  // the slot holds another QP
  rewrite(r, [&](QpRecord& w) {
    w.qpn.store(qpn | kQpValid, std::memory_order_relaxed);
    w.state.store(static_cast<uint32_t>(state), std::memory_order_relaxed);
    w.access.store(access, std::memory_order_relaxed);
    w.destQpn.store(destQpn, std::memory_order_relaxed);
    w.pd.store(reinterpret_cast<uintptr_t>(pd), std::memory_order_relaxed);
  });
}

void ShareTable::retractQp(uint32_t qpn) {
  std::lock_guard<std::mutex> lock(writeMu_);
  QpRecord& r = qps(base_)[qpSlotOf(qpn)];
  if (r.qpn.load() != (qpn | kQpValid)) return;
  rewrite(r, [](QpRecord& w) {
    w.qpn.store(0, std::memory_order_relaxed);
    w.state.store(static_cast<uint32_t>(QpState::kReset), std::memory_order_relaxed);
  });
}

// ---------------------------------------------------------------------------------------------
// Accessor.

Result<std::shared_ptr<SharePeer>> SharePeer::open(const ShareInfo& info) {
  auto fail = [](const std::string& what, int err = 0) {
    return Status(StatusCode::kUnavailable, what, err);
  };
  if (info.pid == 0) return fail("the peer offers no same-host path");
  std::shared_ptr<SharePeer> peer(new SharePeer());
  peer->info_ = info;
  const auto pid = static_cast<pid_t>(info.pid);
  peer->pidfd_ = pidfdOpen(pid);
  if (peer->pidfd_ < 0) return fail("pidfd_open of the peer", errno);
  const std::string path = procFdPath(info.pid, info.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail("open " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kTableSize) {
    ::close(fd);
    return fail(path + " is not a same-host table");
  }
  void* p = ::mmap(nullptr, kTableSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (p == MAP_FAILED) return fail("mmap " + path, mapErr);
  peer->base_ = static_cast<uint8_t*>(p);
  peer->size_ = kTableSize;
  Header* h = peer->header();
  if (h->magic.load(std::memory_order_acquire) != kMagic || h->version.load() != kVersion ||
      h->ownerPid.load() != info.pid || h->cookie.load() != info.cookie || h->mrSlots.load() != kMrSlots ||
      h->qpSlots.load() != kQpSlots || h->accessorSlots.load() != kAccessorSlots) {
    return fail(path + " is not the table the peer described");
  }
  // The cookie must be in the owner's own memory where the table says: this proves the pid is
  // the owner (in our pid namespace) and that the kernel lets us reach its memory.
  uint64_t got = 0;
  iovec local{&got, sizeof got};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(h->cookieAddr.load())), sizeof got};
  if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof got)) {
    return fail("process_vm_readv of the peer", errno);
  }
  if (got != info.cookie) return fail("the peer's memory does not hold its cookie");
  if (!peer->alive()) return fail("the peer process has exited");
  return peer;
}

SharePeer::Mapping::~Mapping() {
  if (base != nullptr) ::munmap(base, length);
}

std::shared_ptr<SharePeer::Mapping> SharePeer::mapping(uint32_t fd, uint64_t inode) {
  std::lock_guard<std::mutex> lock(mapMu_);
  const auto key = std::make_pair(fd, inode);
  if (auto it = mappings_.find(key); it != mappings_.end()) return it->second;
  // Bounded: past kMaxMappings, the mappings no slot uses any more are dropped first (the owner
  // freed them, or they are cold); a slot keeps its own until it moves on.
  constexpr size_t kMaxMappings = 256;
  if (mappings_.size() >= kMaxMappings) {
    std::erase_if(mappings_, [](const auto& entry) { return entry.second.use_count() <= 1; });
    if (mappings_.size() >= kMaxMappings) return nullptr;
  }
  std::shared_ptr<Mapping> made;
  const std::string path = procFdPath(info_.pid, fd);
  if (int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC); f >= 0) {
    struct stat st {};
    // Only a size-sealed memfd is mapped: one that could shrink under the mapping would fault us.
    const int seals = ::fcntl(f, F_GET_SEALS);
    if (::fstat(f, &st) == 0 && static_cast<uint64_t>(st.st_ino) == inode && seals >= 0 &&
        (seals & F_SEAL_SHRINK) != 0 && st.st_size > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
      if (p != MAP_FAILED) {
        made = std::make_shared<Mapping>();
        made->base = static_cast<uint8_t*>(p);
        made->length = static_cast<uint64_t>(st.st_size);
      }
    }
    ::close(f);
  }
  if (!made)
    FERRY_LOG(kDebug, "soft: same-host: cannot map %s: copies with it use process_vm_writev/readv",
              path.c_str());
  mappings_[key] = made;
  return made;
}

void SharePeer::sweepMappings(bool now) {
  const int64_t at = coarseNowNs();
  if (!now && at - sweptAt_.load(std::memory_order_relaxed) < 1000000000) return;
  std::unique_lock<std::mutex> lock(mapMu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  sweptAt_.store(at, std::memory_order_relaxed);
  std::erase_if(mappings_, [&](const auto& entry) {
    if (entry.second && entry.second.use_count() > 1) return false;  // a slot is using it
    struct stat st {};
    const std::string path = procFdPath(info_.pid, entry.first.first);
    return ::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_ino) != entry.first.second;
  });
  sweepDeviceMappingsLocked();
}

SharePeer::~SharePeer() {
  if (base_) ::munmap(base_, size_);
  if (pidfd_ >= 0) ::close(pidfd_);
}

Header* SharePeer::header() const { return reinterpret_cast<Header*>(base_); }

bool SharePeer::alive() const {
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

bool SharePeer::aliveRecently() {
  const int64_t now = coarseNowNs();
  if (now - aliveAt_.load(std::memory_order_relaxed) < 1000000) return true;
  if (!alive()) return false;
  aliveAt_.store(now, std::memory_order_relaxed);
  sweepMappings();  // the mappings are looked at as seldom as the owner is
  return true;
}

Result<std::unique_ptr<SharePeer::Slot>> SharePeer::claim(const std::shared_ptr<SharePeer>& peer) {
  Header* h = peer->header();
  AccessorSlot* slots = accessors(peer->base_);
  const auto self = static_cast<uint32_t>(getpid());
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t i = 0; i < kAccessorSlots; ++i) {
      AccessorSlot& slot = slots[i];
      uint32_t pid = slot.pid.load();
      // The second pass takes back slots of processes that died without releasing them.
      if (pid != 0 && (pass == 0 || accessorAlive(slot))) continue;
      if (!slot.pid.compare_exchange_strong(pid, self)) continue;
      slot.startTime.store(selfStartTime());
      slot.busyKey.store(0);
      uint32_t used = h->accessorsUsed.load();
      while (used < i + 1 && !h->accessorsUsed.compare_exchange_weak(used, i + 1)) {
      }
      return std::unique_ptr<Slot>(new Slot(peer, i));
    }
  }
  return Status(StatusCode::kResourceExhausted, "the peer's same-host table has no free accessor slot");
}

SharePeer::Slot::~Slot() {
  AccessorSlot& slot = accessors(peer_->base_)[index_];
  slot.busyKey.store(0);
  slot.pid.store(0, std::memory_order_release);
}

namespace {

// Whether the owner's record of QP qpn lets our QP srcQpn make a `need` access now; its PD in *pd.
bool qpAllows(const QpRecord& q, uint32_t qpn, uint32_t srcQpn, uint32_t need, uint64_t* pd) {
  uint32_t valid = 0, state = 0, access = 0, dest = 0;
  const bool stable = readStable(q, [&](const QpRecord& r) {
    valid = r.qpn.load(std::memory_order_relaxed);
    state = r.state.load(std::memory_order_relaxed);
    access = r.access.load(std::memory_order_relaxed);
    dest = r.destQpn.load(std::memory_order_relaxed);
    *pd = r.pd.load(std::memory_order_relaxed);
  });
  const auto rtr = static_cast<uint32_t>(QpState::kRtr), rts = static_cast<uint32_t>(QpState::kRts);
  return stable && valid == (qpn | kQpValid) && (state == rtr || state == rts) && dest == srcQpn &&
         (access & need) == need;
}

}  // namespace

bool SharePeer::Slot::begin(uint32_t qpn, uint32_t srcQpn, uint32_t rkey, uint64_t addr, uint64_t len,
                            uint32_t need) {
  if (rkey == 0) return false;
  AccessorSlot& slot = accessors(peer_->base_)[index_];
  // The mark, then the records: the fence pairs with waitForAccessors' (the records withdrawn, a
  // fence, the marks read), so either it sees this mark or this sees the withdrawn record. One
  // barrier: a sequentially consistent store before the fence would be a second.
  slot.busyKey.store(rkey, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t qPd = 0;
  RegionView m;
  bool ok = qpAllows(qps(peer_->base_)[qpSlotOf(qpn)], qpn, srcQpn, need, &qPd) &&
            readRegion(mrs(peer_->base_)[mrSlotOf(rkey)], &m);
  ok = ok && m.key == rkey && m.pd == qPd && (m.access & need) == need && addr >= m.addr &&
       addr + len >= addr && addr + len <= m.addr + m.length;
  viaDevice_ = false;
  viaMap_ = false;
  if (ok && m.device != 0) {
    ok = beginDevice(m, mrSlotOf(rkey));
  } else if (ok && m.memFd != 0) {
    // Memory both sides map: the copy is loads and stores into our mapping of the owner's memfd,
    // when the region lies inside it (the owner's record says where; a lie only fails the check).
    if (!mapped_ || mappedFd_ != m.memFd || mappedInode_ != m.memInode) remap(m.memFd, m.memInode);
    if (mapped_ && m.memOffset <= mapped_->length && m.length <= mapped_->length - m.memOffset) {
      bias_ = reinterpret_cast<uintptr_t>(mapped_->base) + m.memOffset - m.addr;
      viaMap_ = true;
    }
  } else if (ok && mapped_) {
    remap(0, 0);  // let a sweep drop what this slot used last
  }
  if (!ok) slot.busyKey.store(0, std::memory_order_release);
  return ok;
}

void SharePeer::Slot::remap(uint32_t memFd, uint64_t memInode) {
  mapped_ = memFd == 0 ? nullptr : peer_->mapping(memFd - 1, memInode);
  mappedFd_ = memFd;
  mappedInode_ = memInode;
}

void SharePeer::Slot::end() { accessors(peer_->base_)[index_].busyKey.store(0, std::memory_order_release); }

CopyHelper::~CopyHelper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool CopyHelper::tryStart(std::function<bool()> job) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || busy_ || stopping_) return false;
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      return false;
    }
  }
  job_ = std::move(job);
  busy_ = true;
  done_ = false;
  lock.unlock();
  cv_.notify_all();
  return true;
}

bool CopyHelper::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  busy_ = false;
  done_ = false;
  return result_;
}

void CopyHelper::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || (busy_ && !done_ && job_); });
    if (stopping_) return;
    auto job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    bool ok = job();
    splitCopies.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    result_ = ok;
    done_ = true;
    cv_.notify_all();
  }
}

bool SharePeer::Slot::copyMapped(bool toRemote, std::span<const iovec> local, uint64_t remote,
                                 size_t len) const {
  DeviceAccess device;
  auto* at = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(remote + bias_));
  size_t done = 0;
  for (const iovec& v : local) {
    const size_t n = std::min(v.iov_len, len - done);
    if (toRemote) {
      std::memcpy(at + done, v.iov_base, n);
    } else {
      std::memcpy(v.iov_base, at + done, n);
    }
    done += n;
    if (done == len) break;
  }
  return done == len;
}

uint64_t SharePeer::Slot::atomic(bool cmpSwap, uint64_t remote, uint64_t compareAdd, uint64_t swap) const {
  DeviceAccess device;
  auto* target = reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(remote + bias_));
  if (cmpSwap) {
    uint64_t expected = compareAdd;
    __atomic_compare_exchange_n(target, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
  }
  return __atomic_fetch_add(target, compareAdd, __ATOMIC_SEQ_CST);
}

bool SharePeer::Slot::copyv(bool toRemote, std::span<const iovec> local,
                            std::span<const iovec> remote) const {
  if (viaMap_) {
    // One local piece for each remote one, of its length (a batch of one-SGE WRITEs or READs, the
    // common case): straight copies.
    bool paired = local.size() == remote.size();
    for (size_t i = 0; paired && i < local.size(); ++i) paired = local[i].iov_len == remote[i].iov_len;
    if (paired) {
      DeviceAccess device;
      for (size_t i = 0; i < local.size(); ++i) {
        auto* at = reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(remote[i].iov_base) + bias_);
        if (toRemote) {
          std::memcpy(at, local[i].iov_base, local[i].iov_len);
        } else {
          std::memcpy(local[i].iov_base, at, local[i].iov_len);
        }
      }
      return true;
    }
    // Each remote piece takes the next bytes of the local pieces, in order.
    size_t li = 0, lo = 0;
    for (const iovec& r : remote) {
      iovec pieces[64];
      size_t n = 0, need = r.iov_len;
      while (need > 0) {
        if (li == local.size() || n == std::size(pieces)) return false;
        const size_t take = std::min(need, local[li].iov_len - lo);
        pieces[n++] = iovec{static_cast<uint8_t*>(local[li].iov_base) + lo, take};
        need -= take;
        lo += take;
        if (lo == local[li].iov_len) {
          ++li;
          lo = 0;
        }
      }
      if (!copyMapped(toRemote, std::span<const iovec>(pieces, n), reinterpret_cast<uintptr_t>(r.iov_base),
                      r.iov_len)) {
        return false;
      }
    }
    return true;
  }
  const auto pid = static_cast<pid_t>(peer_->info_.pid);
  size_t want = 0;
  for (const iovec& v : remote) want += v.iov_len;
  ssize_t r = toRemote ? ::process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0)
                       : ::process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
  // A short count means a fault part-way: the caller carries the requests out the ordinary way
  // (writing or reading the same bytes again is harmless).
  return r >= 0 && static_cast<size_t>(r) == want;
}

bool SharePeer::Slot::copy(bool toRemote, std::span<const iovec> local, uint64_t remote, size_t len) const {
  if (viaMap_) return copyMapped(toRemote, local, remote, len);
  const auto pid = static_cast<pid_t>(peer_->info_.pid);
  size_t done = 0;
  // A call moves at most what one iovec set allows; a short count continues where it stopped.
  while (done < len) {
    iovec rv{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), len - done};
    // Skip the local iovecs (and the part of one) that are already done.
    iovec lv[64];
    size_t n = 0, skip = done;
    for (const iovec& v : local) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      if (n == std::size(lv)) return false;
      lv[n++] = iovec{static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    ssize_t r =
        toRemote ? ::process_vm_writev(pid, lv, n, &rv, 1, 0) : ::process_vm_readv(pid, lv, n, &rv, 1, 0);
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace ferry::soft
