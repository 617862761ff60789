// What the object store (store_server.cc) accepts of an HTTP request before it acts on it: the
// framing of the body, the subresources (query parameters) and headers it implements per call, and
// the byte range of a GET. Pure functions over the request's text, so that each rule is decided in
// one place and can be fed arbitrary input (tests/fuzz/store_request_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::objects {

// A refusal: the HTTP status, S3's error code and a message that says what to change.
struct RequestRefusal {
  int status = 400;
  std::string code;
  std::string message;
};

// The body a request declares: its Content-Length (nullopt: none given). Refuses values that are
// not decimal numbers, two Content-Length values that differ, and Content-Length together with
// Transfer-Encoding (400: the peers could disagree on where the body ends); Transfer-Encoding alone
// is S3's 501 (every call here has a known length).
struct BodyFraming {
  std::optional<uint64_t> contentLength;
};
std::pair<BodyFraming, std::optional<RequestRefusal>> decideFraming(
    const std::vector<std::string_view>& contentLengths, const std::vector<std::string_view>& transferEncodings);

// The call a request names, from its method and whether its path has a bucket and a key.
enum class StoreCall { kListBuckets, kBucket, kObject };

// The first query parameter or header of the request that names something the store does not
// implement (?tagging, ?acl, ?uploads, ?uploadId, ?versioning, x-amz-copy-source, ...), as a 501
// NotImplemented refusal; nullopt when the store implements all of it. `params` are decoded names
// and values; `headerNames` any case.
std::optional<RequestRefusal> refuseUnimplemented(std::string_view method, StoreCall call,
                                                  const std::vector<std::pair<std::string, std::string>>& params,
                                                  const std::vector<std::string>& headerNames);

// One Range header against an object of `size` bytes (RFC 9110 14.1.2: "bytes=FIRST-LAST",
// "bytes=FIRST-", "bytes=-SUFFIX"). kWhole: no range, or a form the store ignores as S3 does (other
// units, several ranges); kPartial: [first, first + length); kUnsatisfiable: 416 InvalidRange.
struct ByteRange {
  enum Kind { kWhole, kPartial, kUnsatisfiable } kind = kWhole;
  uint64_t first = 0;
  uint64_t length = 0;
};
ByteRange decideRange(std::string_view header, uint64_t size);

}  // namespace ferry::objects
