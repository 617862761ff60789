// Feeds arbitrary bytes to the object store's decoders of request text (src/objects/
// store_request.h, parseAmzDate in sigv4.h): Content-Length and Transfer-Encoding values, Range
// headers, query parameters, x-amz-copy-source, the CompleteMultipartUpload and Delete documents
// and x-amz-date. Any input must be decided without a crash, an accepted range must lie inside the
// object, and an accepted document must keep the bounds its decoder promises.
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
  if (r.kind == ByteRange::kPartial &&
      (r.length == 0 || r.first >= objectSize || r.length > objectSize - r.first)) {
    std::fprintf(stderr, "store_request_fuzz: a range outside the object was accepted\n");
    std::abort();
  }
  size_t cut = text.find('\n');
  std::string_view a = text.substr(0, cut), b = cut == std::string_view::npos ? "" : text.substr(cut + 1);
  auto [framing, refusal] = decideFraming({a, b}, {});
  if (!refusal && framing.contentLength && a != b &&
      a.find_first_not_of("0123456789 \t") == std::string_view::npos &&
      b.find_first_not_of("0123456789 \t") == std::string_view::npos &&
      std::strtoull(std::string(a).c_str(), nullptr, 10) !=
          std::strtoull(std::string(b).c_str(), nullptr, 10)) {
    std::fprintf(stderr, "store_request_fuzz: two different lengths were accepted\n");
    std::abort();
  }
  (void)decideFraming({a}, {b});
  for (std::string_view method : {"GET", "PUT", "POST", "DELETE", "HEAD"}) {
    (void)decideOperation(method, StoreCall::kObject, {{std::string(a), std::string(b)}}, {std::string(b)});
    (void)decideOperation(method, StoreCall::kBucket, {{std::string(a), std::string(b)}, {"uploads", ""}},
                          {});
  }
  auto [parts, partsRefused] = decideCompleteUpload(text);
  if (!partsRefused) {
    bool ok = !parts.empty() && parts.size() <= kMaxParts;
    for (size_t i = 0; ok && i < parts.size(); ++i) {
      ok = parts[i].number >= 1 && parts[i].number <= kMaxParts &&
           (i == 0 || parts[i - 1].number < parts[i].number) && !parts[i].etag.empty() &&
           parts[i].etag.size() <= 128;
    }
    if (!ok) {
      std::fprintf(stderr, "store_request_fuzz: a CompleteMultipartUpload outside its bounds was accepted\n");
      std::abort();
    }
  }
  auto [deletion, deleteRefused] = decideDeleteObjects(text);
  if (!deleteRefused) {
    bool ok = !deletion.keys.empty() && deletion.keys.size() <= kMaxDeleteKeys;
    for (const std::string& key : deletion.keys) ok = ok && !key.empty() && key.size() <= 1024;
    if (!ok) {
      std::fprintf(stderr, "store_request_fuzz: a Delete outside its bounds was accepted\n");
      std::abort();
    }
  }
  if (auto source = decideCopySource(text); source && (source->bucket.empty() || source->key.empty())) {
    std::fprintf(stderr, "store_request_fuzz: a copy source without a bucket or key was accepted\n");
    std::abort();
  }
  (void)parseAmzDate(text);
  return 0;
}
