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

// A decimal number of at most 20 digits that fits 64 bits (no sign, no spaces), else nullopt.
std::optional<uint64_t> parseDecimal(std::string_view text);

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
    const std::vector<std::string_view>& contentLengths,
    const std::vector<std::string_view>& transferEncodings);

// The call a request names, from its method and whether its path has a bucket and a key.
enum class StoreCall { kListBuckets, kBucket, kObject };

// The operation a request asks for, from its method, its path and the subresource in its query
// (?uploads, ?uploadId, ?delete) or the x-amz-copy-source header.
enum class StoreOperation {
  kListBuckets,
  kListObjects,
  kListUploads,  // GET /bucket?uploads
  kHeadBucket,
  kCreateBucket,
  kDeleteBucket,
  kDeleteObjects,  // POST /bucket?delete
  kGetObject,
  kHeadObject,
  kPutObject,
  kCopyObject,  // PUT /bucket/key with x-amz-copy-source
  kDeleteObject,
  kCreateUpload,    // POST /bucket/key?uploads
  kUploadPart,      // PUT /bucket/key?partNumber=N&uploadId=X
  kCompleteUpload,  // POST /bucket/key?uploadId=X
  kAbortUpload,     // DELETE /bucket/key?uploadId=X
  kListParts,       // GET /bucket/key?uploadId=X
};

// The operation the request names, or the refusal of its first query parameter or header that
// names something the store does not implement (?tagging, ?acl, ?versioning, x-amz-copy-source-
// range, an x-id naming another operation, ...: 501 NotImplemented). `params` are decoded names
// and values; `headerNames` any case.
struct OperationDecision {
  StoreOperation operation = StoreOperation::kListBuckets;
  std::optional<RequestRefusal> refusal;
};
OperationDecision decideOperation(std::string_view method, StoreCall call,
                                  const std::vector<std::pair<std::string, std::string>>& params,
                                  const std::vector<std::string>& headerNames);

// The documents clients POST. Both decoders are strict and bounded: at most kMaxDocumentBytes of
// UTF-8 XML, one root element with the expected name, only the expected child elements, no
// DOCTYPE, comments, CDATA or processing instructions past the declaration; anything else is 400
// MalformedXML.
constexpr size_t kMaxPostDocumentBytes = size_t{2} << 20;
constexpr uint32_t kMaxParts = 10000;    // S3's part numbers: 1..10000
constexpr size_t kMaxDeleteKeys = 1000;  // S3's bound on one DeleteObjects

// CompleteMultipartUpload: the parts in the order listed, ETags without their quotes. Part
// numbers outside 1..kMaxParts are 400 InvalidArgument; numbers not in ascending order 400
// InvalidPartOrder (S3's answers).
struct CompletedPart {
  uint32_t number = 0;
  std::string etag;
};
std::pair<std::vector<CompletedPart>, std::optional<RequestRefusal>> decideCompleteUpload(
    std::string_view body);

// Delete: the keys (1..kMaxDeleteKeys, each 1..1024 bytes) and Quiet. A VersionId is 501
// NotImplemented (the store keeps no versions).
struct DeleteRequest {
  std::vector<std::string> keys;
  bool quiet = false;
};
std::pair<DeleteRequest, std::optional<RequestRefusal>> decideDeleteObjects(std::string_view body);

// x-amz-copy-source ("/bucket/key" or "bucket/key", percent-encoded) as bucket and key; nullopt
// when it is not of that form (a ?versionId is refused by the caller as not implemented).
struct CopySource {
  std::string bucket, key;
  bool versioned = false;  // it names a version (?versionId=)
};
std::optional<CopySource> decideCopySource(std::string_view header);

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
