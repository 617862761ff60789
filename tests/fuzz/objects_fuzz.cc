// Feeds arbitrary bytes to the object server's decoder of client descriptors (the text any client,
// or anyone on the control path, hands the server). Accepted input must re-encode to the same
// text (one encoding per descriptor) and decode to the same value.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "objects/descriptor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = ferry::objects::decodeDescriptor(text);
  if (d.isOk()) {
    std::string again = ferry::objects::encodeDescriptor(*d);
    auto back = ferry::objects::decodeDescriptor(again);
    if (again != text || !back.isOk() || !(*back == *d)) {
      std::fprintf(stderr, "objects_fuzz: an accepted descriptor does not round-trip\n");
      std::abort();
    }
    if (d->length == 0 || d->addr + d->length < d->addr || d->keys.empty() || d->op > 1) {
      std::fprintf(stderr, "objects_fuzz: an accepted descriptor breaks its invariants\n");
      std::abort();
    }
  }
  return 0;
}
