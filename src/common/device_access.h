// DeviceAccess: marks the accesses a software device makes to registered memory, for
// ThreadSanitizer.
//
// A NIC reads and writes registered memory by DMA, which no race detector sees: the application
// learns that a WRITE landed from a completion, an immediate or its own channel (often another
// process). The soft provider's progress thread plays the NIC, so its copies into and out of
// registered memory, and its atomics on it, are made inside a DeviceAccess scope, which tells
// ThreadSanitizer to ignore them, as it ignores DMA. Everything else the provider touches (its own
// state, queues, indices) stays checked: keep the scopes to the copy itself. Without
// ThreadSanitizer a scope compiles to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

#ifdef FERRY_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace ferry {

class DeviceAccess {
 public:
#ifdef FERRY_TSAN
  DeviceAccess() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~DeviceAccess() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#else
  // User-provided (though empty), so that a scope is not an "unused variable" without the sanitizer.
  DeviceAccess() {}
  ~DeviceAccess() {}
#endif
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

}  // namespace ferry
