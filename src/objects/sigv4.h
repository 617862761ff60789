// AWS Signature Version 4 (the "AWS4-HMAC-SHA256" Authorization header of S3 requests): signing
// for ferry's object client and checking for its object store, with the S3 rules (the path is
// encoded once, '/' kept). OpenSSL's SHA-256 and HMAC underneath.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::objects {

// Lower-case hex SHA-256 of bytes.
std::string sha256Hex(std::string_view bytes);

// SHA-256 of a stream of pieces (a body as it arrives).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  std::string hex();  // once, at the end

 private:
  void* ctx_;
};
// RFC 3986 percent-encoding of everything but A-Z a-z 0-9 - _ . ~ (and '/' when keepSlash).
std::string uriEncode(std::string_view text, bool keepSlash);

struct SignedRequest {
  std::string method;                                        // "GET"
  std::string path;                                          // decoded: "/bucket/my key"
  std::vector<std::pair<std::string, std::string>> query;    // decoded names and values
  std::vector<std::pair<std::string, std::string>> headers;  // as sent (any case)
  std::string payloadHash;                                   // the x-amz-content-sha256 value
};

// The Authorization header value for `r` (whose headers must already hold host, x-amz-date and
// x-amz-content-sha256: every header given is signed).
std::string signV4(const SignedRequest& r, std::string_view accessKey, std::string_view secretKey,
                   std::string_view region, std::string_view amzDate);

// Checks r's Authorization header against the credentials: OK, or kPermissionDenied naming what is
// wrong (missing, malformed, another access key, a signature that does not match).
Status verifyV4(const SignedRequest& r, std::string_view authorization, std::string_view accessKey,
                std::string_view secretKey);

// How far a signed request's x-amz-date may lie from the server's clock, either way (S3's window).
constexpr int64_t kRequestTimeWindowSeconds = 15 * 60;

// Whether r's x-amz-date lies within kRequestTimeWindowSeconds of `nowSeconds` (since the epoch),
// so that a captured request cannot be replayed later: OK, or kPermissionDenied naming the
// request's time and the server's (S3's RequestTimeTooSkewed) or a missing or malformed date.
Status checkRequestTime(const SignedRequest& r, int64_t nowSeconds);

// Seconds since the epoch of an x-amz-date value ("20261125T031500Z"), or nullopt for anything
// else (strictly that form: the signature is computed over it).
std::optional<int64_t> parseAmzDate(std::string_view text);

// "20261125T031500Z" for now.
std::string amzDateNow();

}  // namespace ferry::objects
