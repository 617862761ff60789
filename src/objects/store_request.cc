#include "objects/store_request.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace ferry::objects {
namespace {

std::optional<uint64_t> decimal(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t next = v * 10 + static_cast<uint64_t>(c - '0');
    if (next / 10 != v) return std::nullopt;
    v = next;
  }
  return v;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool equalsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

RequestRefusal notImplemented(const std::string& what) {
  return {501, "NotImplemented", what + " is not implemented by this store (it implements buckets, and PUT, "
                                        "GET, HEAD and DELETE of whole objects)"};
}

// The query parameters one call takes. x-id is the operation name botocore adds to some calls'
// URLs; it must name the call the method and path make.
struct CallRule {
  std::string_view method;
  StoreCall call;
  std::initializer_list<std::string_view> operations;  // accepted x-id values
  std::initializer_list<std::string_view> params;
};

constexpr std::string_view kListParams[] = {"list-type",  "prefix",      "delimiter",   "max-keys", "continuation-token",
                                            "start-after", "marker",     "encoding-type", "fetch-owner"};

const CallRule kRules[] = {
    {"GET", StoreCall::kListBuckets, {"ListBuckets"}, {}},
    {"HEAD", StoreCall::kListBuckets, {}, {}},
    {"GET", StoreCall::kBucket, {"ListObjects", "ListObjectsV2"}, {}},
    {"HEAD", StoreCall::kBucket, {"HeadBucket"}, {}},
    {"PUT", StoreCall::kBucket, {"CreateBucket"}, {}},
    {"DELETE", StoreCall::kBucket, {"DeleteBucket"}, {}},
    {"GET", StoreCall::kObject, {"GetObject"}, {}},
    {"HEAD", StoreCall::kObject, {"HeadObject"}, {}},
    {"PUT", StoreCall::kObject, {"PutObject"}, {}},
    {"DELETE", StoreCall::kObject, {"DeleteObject"}, {}},
};

}  // namespace

std::pair<BodyFraming, std::optional<RequestRefusal>> decideFraming(
    const std::vector<std::string_view>& contentLengths, const std::vector<std::string_view>& transferEncodings) {
  BodyFraming framing;
  if (!transferEncodings.empty()) {
    if (!contentLengths.empty()) {
      return {framing,
              RequestRefusal{400, "InvalidRequest",
                             "the request has both Content-Length and Transfer-Encoding: send one of them"}};
    }
    return {framing, RequestRefusal{501, "NotImplemented",
                                    "Transfer-Encoding is not implemented: send the body with a Content-Length"}};
  }
  for (std::string_view text : contentLengths) {
    auto n = decimal(trimmed(text));
    if (!n) {
      return {framing, RequestRefusal{400, "InvalidRequest",
                                      "Content-Length '" + std::string(text.substr(0, 32)) + "' is not a number"}};
    }
    if (framing.contentLength && *framing.contentLength != *n) {
      return {framing, RequestRefusal{400, "InvalidRequest", "the request has two different Content-Length values"}};
    }
    framing.contentLength = n;
  }
  return {framing, std::nullopt};
}

std::optional<RequestRefusal> refuseUnimplemented(std::string_view method, StoreCall call,
                                                  const std::vector<std::pair<std::string, std::string>>& params,
                                                  const std::vector<std::string>& headerNames) {
  const CallRule* rule = nullptr;
  for (const CallRule& r : kRules) {
    if (r.method == method && r.call == call) rule = &r;
  }
  if (rule == nullptr) {
    return notImplemented(std::string(method) + " of " +
                          (call == StoreCall::kListBuckets ? "/" : call == StoreCall::kBucket ? "a bucket" : "an object"));
  }
  const bool listing = (method == "GET" || method == "HEAD") && call == StoreCall::kBucket;
  for (const auto& [name, value] : params) {
    if (name == "x-id") {
      if (std::find(rule->operations.begin(), rule->operations.end(), value) == rule->operations.end())
        return notImplemented("the operation '" + value.substr(0, 64) + "'");
      continue;
    }
    if (listing && std::find(std::begin(kListParams), std::end(kListParams), name) != std::end(kListParams)) {
      if (name == "list-type" && value != "2")
        return RequestRefusal{400, "InvalidArgument", "list-type must be 2 (or absent for version 1)"};
      if (name == "encoding-type" && value != "url")
        return RequestRefusal{400, "InvalidArgument", "encoding-type must be url"};
      continue;
    }
    return notImplemented("the subresource or parameter '" + name.substr(0, 64) + "' of " + std::string(method));
  }
  if (method == "PUT") {
    for (const std::string& h : headerNames) {
      if (equalsNoCase(h, "x-amz-copy-source") || equalsNoCase(h, "x-amz-copy-source-range"))
        return notImplemented("copying an object (" + h + ")");
    }
  }
  return std::nullopt;
}

ByteRange decideRange(std::string_view header, uint64_t size) {
  ByteRange whole;
  std::string_view h = trimmed(header);
  constexpr std::string_view kUnit = "bytes=";
  if (h.size() < kUnit.size() || !equalsNoCase(h.substr(0, kUnit.size()), kUnit)) return whole;
  h.remove_prefix(kUnit.size());
  if (h.find(',') != std::string_view::npos) return whole;  // several ranges: S3 sends the whole object
  h = trimmed(h);
  size_t dash = h.find('-');
  if (dash == std::string_view::npos) return {ByteRange::kUnsatisfiable};
  std::string_view firstText = trimmed(h.substr(0, dash)), lastText = trimmed(h.substr(dash + 1));
  if (firstText.empty()) {  // the last N bytes
    auto suffix = decimal(lastText);
    if (!suffix || *suffix == 0 || size == 0) return {ByteRange::kUnsatisfiable};
    uint64_t n = std::min(*suffix, size);
    return {ByteRange::kPartial, size - n, n};
  }
  auto first = decimal(firstText);
  if (!first || *first >= size) return {ByteRange::kUnsatisfiable};
  uint64_t last = size - 1;
  if (!lastText.empty()) {
    auto l = decimal(lastText);
    if (!l || *l < *first) return {ByteRange::kUnsatisfiable};
    last = std::min(*l, size - 1);
  }
  return {ByteRange::kPartial, *first, last - *first + 1};
}

}  // namespace ferry::objects
