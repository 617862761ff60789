#include "verbs/mapped.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace ferry::verbs {
namespace {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

std::string describe(const void* addr, size_t length) {
  char text[96];
  std::snprintf(text, sizeof text, "[0x%" PRIxPTR ", +%zu)", reinterpret_cast<uintptr_t>(addr), length);
  return text;
}

// Whether this kernel takes MADV_POPULATE_WRITE (5.14 and later): asked once, on a page of our own.
bool populateWorks() {
  static const bool works = [] {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) return false;
    const bool ok = ::madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(probe, page);
    return ok;
  }();
  return works;
}

}  // namespace

Status checkMapped(const void* addr, size_t length, bool write) {
  if (length == 0) return Status::ok();
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;  // the caller refused wrapping
  const size_t span = end - start;
  if (populateWorks()) {
    if (::madvise(reinterpret_cast<void*>(start), span, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) ==
        0) {
      return Status::ok();
    }
    if (errno == ENOMEM) {
      return invalidArgument("register memory: " + describe(addr, length) + " is not mapped in this process");
    }
    // EFAULT, or EINVAL (how some kernels answer a mapping without that access).
    return invalidArgument("register memory: " + describe(addr, length) + " is not mapped " +
                           (write ? "writable (an access flag asks to write it)" : "readable"));
  }
  // No MADV_POPULATE_* here: mincore at least finds unmapped pages.
  std::vector<unsigned char> resident((span + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(start), span, resident.data()) != 0 && errno == ENOMEM) {
    return invalidArgument("register memory: " + describe(addr, length) + " is not mapped in this process");
  }
  return Status::ok();
}

}  // namespace ferry::verbs
