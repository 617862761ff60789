// cpuRelax(): the processor's spin-wait hint, for loops that poll shared memory or a lock.
#pragma once

namespace ferry {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace ferry
