#include "ferry/common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

namespace ferry {
namespace {

// Live allocations by start address: [start, end) -> backing.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, std::pair<uintptr_t, SharedBacking>> byStart;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: allocations may outlive static destruction
  return *r;
}

constexpr size_t kMaxLength = size_t{1} << 46;

}  // namespace

Result<std::shared_ptr<SharedMemory>> SharedMemory::allocate(size_t length) {
  if (length == 0) return Status(StatusCode::kInvalidArgument, "shared memory: length 0");
  if (length > kMaxLength)
    return Status(StatusCode::kInvalidArgument, "shared memory: more than 64 TiB asked for");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (length + page - 1) / page * page;
  std::shared_ptr<SharedMemory> m(new SharedMemory());
  m->fd_ = ::memfd_create("ferry-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m->fd_ < 0) return Status(StatusCode::kResourceExhausted, "shared memory: memfd_create", errno);
  if (::ftruncate(m->fd_, static_cast<off_t>(mapped)) != 0) {
    return Status(StatusCode::kResourceExhausted, "shared memory: ftruncate", errno);
  }
  // A peer that maps the memfd relies on its size: sealed, it never shrinks under the peer's
  // mapping (which would fault the peer) and never grows.
  if (::fcntl(m->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status(StatusCode::kResourceExhausted, "shared memory: sealing the memfd", errno);
  }
  struct stat st {};
  if (::fstat(m->fd_, &st) != 0) return Status(StatusCode::kResourceExhausted, "shared memory: fstat", errno);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd_, 0);
  if (p == MAP_FAILED) return Status(StatusCode::kResourceExhausted, "shared memory: mmap", errno);
  m->data_ = p;
  m->length_ = length;
  m->mapped_ = mapped;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto start = reinterpret_cast<uintptr_t>(p);
  r.byStart[start] = {start + mapped, SharedBacking{m->fd_, static_cast<uint64_t>(st.st_ino), 0}};
  return m;
}

SharedMemory::~SharedMemory() {
  if (data_ != nullptr) {
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      r.byStart.erase(reinterpret_cast<uintptr_t>(data_));
    }
    ::munmap(data_, mapped_);
  }
  if (fd_ >= 0) ::close(fd_);
}

std::optional<SharedBacking> findSharedBacking(const void* addr, size_t length) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (a + length < a) return std::nullopt;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.byStart.upper_bound(a);
  if (it == r.byStart.begin()) return std::nullopt;
  --it;
  const auto& [end, backing] = it->second;
  if (a + length > end) return std::nullopt;
  SharedBacking b = backing;
  b.offset = a - it->first;
  return b;
}

}  // namespace ferry
