// Feeds arbitrary bytes to the object store's decoders of request text (src/objects/
// store_request.h, parseAmzDate in sigv4.h): Content-Length and Transfer-Encoding values, Range
// headers, query parameters and x-amz-date. Any input must be decided without a crash, and an
// accepted range must lie inside the object.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "objects/sigv4.h"
#include "objects/store_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::objects;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const uint64_t objectSize = size > 0 ? data[0] * 997u : 0;
  ByteRange r = decideRange(text, objectSize);
  if (r.kind == ByteRange::kPartial && (r.length == 0 || r.first >= objectSize || r.length > objectSize - r.first)) {
    std::fprintf(stderr, "store_request_fuzz: a range outside the object was accepted\n");
    std::abort();
  }
  size_t cut = text.find('\n');
  std::string_view a = text.substr(0, cut), b = cut == std::string_view::npos ? "" : text.substr(cut + 1);
  auto [framing, refusal] = decideFraming({a, b}, {});
  if (!refusal && framing.contentLength && a != b && a.find_first_not_of("0123456789 \t") == std::string_view::npos &&
      b.find_first_not_of("0123456789 \t") == std::string_view::npos && std::strtoull(std::string(a).c_str(), nullptr, 10) !=
                                                                             std::strtoull(std::string(b).c_str(), nullptr, 10)) {
    std::fprintf(stderr, "store_request_fuzz: two different lengths were accepted\n");
    std::abort();
  }
  (void)decideFraming({a}, {b});
  (void)refuseUnimplemented("PUT", StoreCall::kObject, {{std::string(a), std::string(b)}}, {std::string(b)});
  (void)refuseUnimplemented("GET", StoreCall::kBucket, {{std::string(a), std::string(b)}}, {});
  (void)parseAmzDate(text);
  return 0;
}
