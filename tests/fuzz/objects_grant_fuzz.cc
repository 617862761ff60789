// Feeds arbitrary bytes to the decoders of the object server's grant messages (objects/descriptor.h,
// "The grant"): the claim a client agent receives from any peer that connected to it, and the
// answer the server receives. Accepted input must re-encode to the same text and decode to the
// same value; a granted answer holds a descriptor that keeps the descriptor's invariants.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "objects/descriptor.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "objects_grant_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace obj = ferry::objects;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto c = obj::decodeClaim(text); c.isOk()) {
    std::string again = obj::encodeClaim(*c);
    auto back = obj::decodeClaim(again);
    if (again != text || !back.isOk() || !(*back == *c)) fail("an accepted claim does not round-trip");
    if (c->digest.size() != obj::kDescriptorDigestSize) fail("an accepted claim's digest is not 32 bytes");
  }
  if (auto a = obj::decodeAnswer(text); a.isOk()) {
    std::string again = obj::encodeAnswer(*a);
    auto back = obj::decodeAnswer(again);
    if (again != text || !back.isOk() || !(*back == *a)) fail("an accepted answer does not round-trip");
    const obj::Descriptor& d = a->descriptor;
    if (a->granted &&
        (d.length == 0 || d.addr + d.length < d.addr || d.keys.empty() || d.op > 1 || !a->reason.empty())) {
      fail("an accepted granted answer breaks the descriptor's invariants");
    }
    if (!a->granted && (a->reason.size() > obj::kMaxGrantReason || !(d == obj::Descriptor{}))) {
      fail("an accepted refusal carries a descriptor or an over-long reason");
    }
  }
  return 0;
}
