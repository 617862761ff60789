#include "objects/store_request.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace ferry::objects {

std::optional<uint64_t> parseDecimal(std::string_view text) {
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

namespace {

std::optional<uint64_t> decimal(std::string_view text) { return parseDecimal(text); }

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
  return {501, "NotImplemented",
          what +
              " is not implemented by this store (it implements buckets; PUT, GET, HEAD, "
              "DELETE and copies of whole objects; multipart uploads; DeleteObjects)"};
}

RequestRefusal malformed(const std::string& what) {
  return {400, "MalformedXML", "the XML document is not well formed or does not validate: " + what};
}

// The query parameters one operation takes. x-id is the operation name botocore adds to some
// calls' URLs; it must name the operation the method, path and subresource make.
struct OperationRule {
  std::string_view method;
  StoreCall call;
  std::string_view subresource;  // the query parameter that selects the operation ("": none)
  StoreOperation operation;
  std::initializer_list<std::string_view> names;   // accepted x-id values
  std::initializer_list<std::string_view> params;  // the other parameters it takes
};

const std::initializer_list<std::string_view> kListParams = {
    "list-type",   "prefix", "delimiter",     "max-keys",   "continuation-token",
    "start-after", "marker", "encoding-type", "fetch-owner"};

using Op = StoreOperation;
const OperationRule kRules[] = {
    {"GET", StoreCall::kListBuckets, "", Op::kListBuckets, {"ListBuckets"}, {}},
    {"HEAD", StoreCall::kListBuckets, "", Op::kListBuckets, {}, {}},
    {"GET", StoreCall::kBucket, "", Op::kListObjects, {"ListObjects", "ListObjectsV2"}, kListParams},
    {"GET",
     StoreCall::kBucket,
     "uploads",
     Op::kListUploads,
     {"ListMultipartUploads"},
     {"prefix", "max-uploads", "key-marker", "upload-id-marker", "encoding-type"}},
    {"HEAD", StoreCall::kBucket, "", Op::kHeadBucket, {"HeadBucket"}, {}},
    {"PUT", StoreCall::kBucket, "", Op::kCreateBucket, {"CreateBucket"}, {}},
    {"DELETE", StoreCall::kBucket, "", Op::kDeleteBucket, {"DeleteBucket"}, {}},
    {"POST", StoreCall::kBucket, "delete", Op::kDeleteObjects, {"DeleteObjects"}, {}},
    {"GET", StoreCall::kObject, "", Op::kGetObject, {"GetObject"}, {}},
    {"GET",
     StoreCall::kObject,
     "uploadId",
     Op::kListParts,
     {"ListParts"},
     {"max-parts", "part-number-marker"}},
    {"HEAD", StoreCall::kObject, "", Op::kHeadObject, {"HeadObject"}, {}},
    {"PUT", StoreCall::kObject, "", Op::kPutObject, {"PutObject"}, {}},
    {"PUT", StoreCall::kObject, "uploadId", Op::kUploadPart, {"UploadPart"}, {"partNumber"}},
    {"POST", StoreCall::kObject, "uploads", Op::kCreateUpload, {"CreateMultipartUpload"}, {}},
    {"POST", StoreCall::kObject, "uploadId", Op::kCompleteUpload, {"CompleteMultipartUpload"}, {}},
    {"DELETE", StoreCall::kObject, "", Op::kDeleteObject, {"DeleteObject"}, {}},
    {"DELETE", StoreCall::kObject, "uploadId", Op::kAbortUpload, {"AbortMultipartUpload"}, {}},
};

bool hasParam(const std::vector<std::pair<std::string, std::string>>& params, std::string_view name) {
  return std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
}

bool hasHeader(const std::vector<std::string>& headerNames, std::string_view name) {
  return std::any_of(headerNames.begin(), headerNames.end(),
                     [&](const std::string& h) { return equalsNoCase(h, name); });
}

// A strict reader of the small XML documents S3 clients send: elements, attributes (skipped),
// text with the five predefined entities and character references. No DOCTYPE, comments, CDATA
// or processing instructions (past the declaration), no text beside child elements. Bounded in
// depth and element count, so any input is decided in time linear in its length.
struct XmlNode {
  std::string name;
  std::string text;
  std::vector<XmlNode> children;
};

class XmlReader {
 public:
  static constexpr int kMaxDepth = 4;
  static constexpr size_t kMaxElements = 100000;

  explicit XmlReader(std::string_view in) : in_(in) {}

  std::optional<XmlNode> document() {
    skipSpace();
    if (in_.substr(pos_, 5) == "<?xml") {
      size_t end = in_.find("?>", pos_);
      if (end == std::string_view::npos) return std::nullopt;
      pos_ = end + 2;
      skipSpace();
    }
    XmlNode root;
    if (!element(root, 1)) return std::nullopt;
    skipSpace();
    if (pos_ != in_.size()) return std::nullopt;
    return root;
  }

  // The rest of a start tag after its name: attributes (xmlns; at most 8, read and ignored), then
  // '>' or '/>' (empty set). false when malformed.
  bool startTagRest(bool& empty) {
    for (int attributes = 0;; ++attributes) {
      skipSpace();
      if (at('/')) {
        ++pos_;
        if (!at('>')) return false;
        ++pos_;
        empty = true;
        return true;
      }
      if (at('>')) {
        ++pos_;
        return true;
      }
      if (attributes >= 8 || !attribute()) return false;
    }
  }

  // One attribute: a name, '=', and a quoted value without '<'.
  bool attribute() {
    std::string attribute;
    if (!name(attribute)) return false;
    skipSpace();
    if (!at('=')) return false;
    ++pos_;
    skipSpace();
    if (!at('"') && !at('\'')) return false;
    const char quote = in_[pos_++];
    size_t end = in_.find(quote, pos_);
    if (end == std::string_view::npos || in_.substr(pos_, end - pos_).find('<') != std::string_view::npos)
      return false;
    pos_ = end + 1;
    return true;
  }

 private:
  static bool space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
  static bool nameChar(char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'));
  }
  void skipSpace() {
    while (pos_ < in_.size() && space(in_[pos_])) ++pos_;
  }
  bool at(char c) const { return pos_ < in_.size() && in_[pos_] == c; }
  bool name(std::string& out) {
    size_t start = pos_;
    while (pos_ < in_.size() && pos_ - start < 128 && nameChar(in_[pos_], pos_ == start)) ++pos_;
    if (pos_ == start) return false;
    out.assign(in_.substr(start, pos_ - start));
    return true;
  }
  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  // An entity at pos_ ('&'), appended decoded.
  bool entity(std::string& out) {
    size_t semi = in_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 10) return false;
    std::string_view e = in_.substr(pos_ + 1, semi - pos_ - 1);
    pos_ = semi + 1;
    if (e == "amp") return out.push_back('&'), true;
    if (e == "lt") return out.push_back('<'), true;
    if (e == "gt") return out.push_back('>'), true;
    if (e == "quot") return out.push_back('"'), true;
    if (e == "apos") return out.push_back('\''), true;
    if (e.size() < 2 || e[0] != '#') return false;
    const bool hex = e[1] == 'x';
    std::string_view digits = e.substr(hex ? 2 : 1);
    if (digits.empty()) return false;
    uint32_t cp = 0;
    for (char c : digits) {
      int d = std::isdigit(static_cast<unsigned char>(c))           ? c - '0'
              : hex && std::isxdigit(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                                    : -1;
      if (d < 0) return false;
      cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);
      if (cp > 0x10FFFF) return false;
    }
    if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    appendUtf8(out, cp);
    return true;
  }
  bool element(XmlNode& node, int depth) {
    if (depth > kMaxDepth || ++elements_ > kMaxElements || !at('<')) return false;
    ++pos_;
    if (!name(node.name)) return false;
    bool empty = false;  // <name/>
    if (!startTagRest(empty)) return false;
    if (empty) return true;
    bool textSeen = false;
    while (pos_ < in_.size()) {
      if (at('<')) {
        if (pos_ + 1 < in_.size() && in_[pos_ + 1] == '/') {
          pos_ += 2;
          std::string closing;
          if (!name(closing) || closing != node.name) return false;
          skipSpace();
          if (!at('>')) return false;
          ++pos_;
          return node.children.empty() || !textSeen;  // no text beside child elements
        }
        node.children.emplace_back();
        if (!element(node.children.back(), depth + 1)) return false;
        continue;
      }
      if (at('&')) {
        if (!entity(node.text)) return false;
        textSeen = true;
        continue;
      }
      if (!space(in_[pos_])) textSeen = true;
      node.text.push_back(in_[pos_++]);
    }
    return false;  // the input ended inside the element
  }

  std::string_view in_;
  size_t pos_ = 0;
  size_t elements_ = 0;
};

std::optional<XmlNode> readDocument(std::string_view body) {
  if (body.size() > kMaxPostDocumentBytes) return std::nullopt;
  return XmlReader(body).document();
}

bool isChecksumElement(std::string_view name) {
  return name == "ChecksumCRC32" || name == "ChecksumCRC32C" || name == "ChecksumSHA1" ||
         name == "ChecksumSHA256" || name == "ChecksumCRC64NVME";
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::pair<BodyFraming, std::optional<RequestRefusal>> decideFraming(
    const std::vector<std::string_view>& contentLengths,
    const std::vector<std::string_view>& transferEncodings) {
  BodyFraming framing;
  if (!transferEncodings.empty()) {
    if (!contentLengths.empty()) {
      return {framing,
              RequestRefusal{400, "InvalidRequest",
                             "the request has both Content-Length and Transfer-Encoding: send one of them"}};
    }
    return {framing,
            RequestRefusal{501, "NotImplemented",
                           "Transfer-Encoding is not implemented: send the body with a Content-Length"}};
  }
  for (std::string_view text : contentLengths) {
    auto n = decimal(trimmed(text));
    if (!n) {
      return {framing,
              RequestRefusal{400, "InvalidRequest",
                             "Content-Length '" + std::string(text.substr(0, 32)) + "' is not a number"}};
    }
    if (framing.contentLength && *framing.contentLength != *n) {
      return {framing,
              RequestRefusal{400, "InvalidRequest", "the request has two different Content-Length values"}};
    }
    framing.contentLength = n;
  }
  return {framing, std::nullopt};
}

namespace {

// The rule for a method on a call: the one whose subresource the request names, else the one
// without a subresource; nullptr when there is none.
const OperationRule* findRule(std::string_view method, StoreCall call,
                              const std::vector<std::pair<std::string, std::string>>& params) {
  const OperationRule* rule = nullptr;
  for (const OperationRule& r : kRules) {
    if (r.method != method || r.call != call) continue;
    if (!r.subresource.empty() && hasParam(params, r.subresource)) return &r;
    if (r.subresource.empty() && rule == nullptr) rule = &r;
  }
  return rule;
}

// An object's PUT: a copy (x-amz-copy-source) becomes CopyObject, with CopyObject's x-id names;
// conditional and ranged copies, UploadPartCopy and UploadPart without partNumber are refused.
std::optional<RequestRefusal> decideObjectPut(const std::vector<std::pair<std::string, std::string>>& params,
                                              const std::vector<std::string>& headerNames,
                                              OperationDecision& out,
                                              std::initializer_list<std::string_view>& names) {
  static const std::initializer_list<std::string_view> kCopyNames = {"CopyObject"};
  for (std::string_view h :
       {"x-amz-copy-source-range", "x-amz-copy-source-if-match", "x-amz-copy-source-if-none-match",
        "x-amz-copy-source-if-modified-since", "x-amz-copy-source-if-unmodified-since"}) {
    if (hasHeader(headerNames, h)) return notImplemented("copying with " + std::string(h));
  }
  if (hasHeader(headerNames, "x-amz-copy-source")) {
    if (out.operation == Op::kUploadPart) return notImplemented("copying into a part (UploadPartCopy)");
    out.operation = Op::kCopyObject;
    names = kCopyNames;
  }
  if (out.operation == Op::kUploadPart && !hasParam(params, "partNumber")) {
    return RequestRefusal{400, "InvalidArgument", "UploadPart needs partNumber"};
  }
  return std::nullopt;
}

// The query's parameters: an x-id among the operation's names, the rule's subresource, the
// parameters the rule takes (list-type 2, encoding-type url); anything else is refused.
std::optional<RequestRefusal> checkParams(std::string_view method, const OperationRule& rule,
                                          std::initializer_list<std::string_view> names,
                                          const std::vector<std::pair<std::string, std::string>>& params) {
  for (const auto& [name, value] : params) {
    if (name == "x-id") {
      if (std::find(names.begin(), names.end(), value) == names.end()) {
        return notImplemented("the operation '" + value.substr(0, 64) + "'");
      }
      continue;
    }
    if (!rule.subresource.empty() && name == rule.subresource) continue;
    if (std::find(rule.params.begin(), rule.params.end(), name) == rule.params.end()) {
      return notImplemented("the subresource or parameter '" + name.substr(0, 64) + "' of " +
                            std::string(method));
    }
    if (name == "list-type" && value != "2") {
      return RequestRefusal{400, "InvalidArgument", "list-type must be 2 (or absent for version 1)"};
    }
    if (name == "encoding-type" && value != "url") {
      return RequestRefusal{400, "InvalidArgument", "encoding-type must be url"};
    }
  }
  return std::nullopt;
}

// One <Part> of a CompleteMultipartUpload: its number and ETag (quotes taken off).
std::optional<RequestRefusal> completedPartOf(const XmlNode& part, CompletedPart& out) {
  if (part.name != "Part") return malformed("<" + part.name.substr(0, 64) + "> in CompleteMultipartUpload");
  const XmlNode* etag = nullptr;
  const XmlNode* number = nullptr;
  for (const XmlNode& field : part.children) {
    const XmlNode** slot = field.name == "ETag" ? &etag : field.name == "PartNumber" ? &number : nullptr;
    if (slot == nullptr && isChecksumElement(field.name) && field.children.empty()) continue;
    if (slot == nullptr || *slot != nullptr || !field.children.empty())
      return malformed("a Part holds one ETag and one PartNumber");
    *slot = &field;
  }
  if (etag == nullptr || number == nullptr) return malformed("a Part holds one ETag and one PartNumber");
  auto n = decimal(trimmed(number->text));
  if (!n || *n < 1 || *n > kMaxParts) {
    return RequestRefusal{400, "InvalidArgument", "part numbers must be 1.." + std::to_string(kMaxParts)};
  }
  std::string_view tag = trimmed(etag->text);
  if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
  if (tag.empty() || tag.size() > 128) return malformed("an ETag of 1..128 characters");
  out = {static_cast<uint32_t>(*n), std::string(tag)};
  return std::nullopt;
}

}  // namespace

OperationDecision decideOperation(std::string_view method, StoreCall call,
                                  const std::vector<std::pair<std::string, std::string>>& params,
                                  const std::vector<std::string>& headerNames) {
  const OperationRule* rule = findRule(method, call, params);
  OperationDecision out;
  if (rule == nullptr) {
    out.refusal = notImplemented(std::string(method) + " of " +
                                 (call == StoreCall::kListBuckets ? "/"
                                  : call == StoreCall::kBucket    ? "a bucket"
                                                                  : "an object") +
                                 (method == "POST" ? " without ?uploads, ?uploadId or ?delete" : ""));
    return out;
  }
  out.operation = rule->operation;
  std::initializer_list<std::string_view> names = rule->names;
  if (method == "PUT" && call == StoreCall::kObject) {
    out.refusal = decideObjectPut(params, headerNames, out, names);
    if (out.refusal) return out;
  }
  out.refusal = checkParams(method, *rule, names, params);
  return out;
}

std::pair<std::vector<CompletedPart>, std::optional<RequestRefusal>> decideCompleteUpload(
    std::string_view body) {
  std::vector<CompletedPart> parts;
  auto doc = readDocument(body);
  if (!doc) return {parts, malformed("not well-formed XML")};
  if (doc->name != "CompleteMultipartUpload")
    return {parts, malformed("the root is not CompleteMultipartUpload")};
  if (doc->children.empty() || doc->children.size() > kMaxParts)
    return {parts, malformed("CompleteMultipartUpload lists 1.." + std::to_string(kMaxParts) + " parts")};
  for (const XmlNode& node : doc->children) {
    CompletedPart part;
    if (auto refusal = completedPartOf(node, part)) return {{}, refusal};
    if (!parts.empty() && parts.back().number >= part.number) {
      return {{},
              RequestRefusal{400, "InvalidPartOrder",
                             "the list of parts was not in ascending order: list each part once, by number"}};
    }
    parts.push_back(std::move(part));
  }
  return {std::move(parts), std::nullopt};
}

std::pair<DeleteRequest, std::optional<RequestRefusal>> decideDeleteObjects(std::string_view body) {
  DeleteRequest out;
  auto doc = readDocument(body);
  if (!doc) return {out, malformed("not well-formed XML")};
  if (doc->name != "Delete") return {out, malformed("the root is not Delete")};
  bool quietSeen = false;
  for (const XmlNode& child : doc->children) {
    if (child.name == "Quiet" && !quietSeen && child.children.empty()) {
      std::string_view q = trimmed(child.text);
      if (q != "true" && q != "false") return {{}, malformed("Quiet is true or false")};
      out.quiet = q == "true";
      quietSeen = true;
      continue;
    }
    if (child.name != "Object") return {{}, malformed("<" + child.name.substr(0, 64) + "> in Delete")};
    if (out.keys.size() == kMaxDeleteKeys)
      return {{}, malformed("Delete names at most " + std::to_string(kMaxDeleteKeys) + " objects")};
    const XmlNode* key = nullptr;
    for (const XmlNode& field : child.children) {
      if (field.name == "VersionId") return {{}, notImplemented("deleting a version (VersionId)")};
      if (field.name != "Key" || key != nullptr || !field.children.empty())
        return {{}, malformed("an Object holds one Key")};
      key = &field;
    }
    if (key == nullptr || key->text.empty() || key->text.size() > 1024)
      return {{}, malformed("an Object holds one Key of 1..1024 bytes")};
    out.keys.push_back(key->text);
  }
  if (out.keys.empty()) return {{}, malformed("Delete names at least one Object")};
  return {std::move(out), std::nullopt};
}

std::optional<CopySource> decideCopySource(std::string_view header) {
  std::string_view h = trimmed(header);
  CopySource out;
  size_t question = h.find('?');
  if (question != std::string_view::npos) {
    std::string_view query = h.substr(question + 1);
    if (query.substr(0, 10) != "versionId=") return std::nullopt;
    out.versioned = true;
    h = h.substr(0, question);
  }
  std::string decoded;
  for (size_t i = 0; i < h.size(); ++i) {
    if (h[i] != '%') {
      decoded.push_back(h[i]);
      continue;
    }
    if (i + 2 >= h.size()) return std::nullopt;
    const int hi = hexValue(h[i + 1]), lo = hexValue(h[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    decoded.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  std::string_view path = decoded;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  size_t slash = path.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == path.size()) return std::nullopt;
  out.bucket.assign(path.substr(0, slash));
  out.key.assign(path.substr(slash + 1));
  return out;
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
