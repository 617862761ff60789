#include "objects/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "agent/crypto.h"

namespace ferry::objects {
namespace {

std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Trims and folds runs of spaces into one, as the canonical headers want.
std::string foldSpaces(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

// The canonical request and the signed header list ("host;x-amz-date") over the named headers.
std::string canonical(const SignedRequest& r, const std::vector<std::string>& signedNames) {
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : r.query) q.emplace_back(uriEncode(k, false), uriEncode(v, false));
  std::sort(q.begin(), q.end());
  std::string query;
  for (const auto& [k, v] : q) query += (query.empty() ? "" : "&") + k + "=" + v;
  std::string headers, names;
  for (const auto& name : signedNames) {
    std::string values;
    for (const auto& [k, v] : r.headers) {
      if (lower(k) == name) values += (values.empty() ? "" : ",") + foldSpaces(v);
    }
    headers += name + ":" + values + "\n";
    names += (names.empty() ? "" : ";") + name;
  }
  return r.method + "\n" + uriEncode(r.path.empty() ? "/" : r.path, true) + "\n" + query + "\n" + headers +
         "\n" + names + "\n" + r.payloadHash;
}

std::string signature(const std::string& canonicalRequest, std::string_view secretKey,
                      std::string_view amzDate, std::string_view scope, std::string_view date,
                      std::string_view region) {
  std::string toSign = "AWS4-HMAC-SHA256\n" + std::string(amzDate) + "\n" + std::string(scope) + "\n" +
                       sha256Hex(canonicalRequest);
  std::string k = hmac("AWS4" + std::string(secretKey), date);
  k = hmac(k, region);
  k = hmac(k, "s3");
  k = hmac(k, "aws4_request");
  return agent::hexOf(hmac(k, toSign));
}

std::optional<uint64_t> digits(std::string_view text) {
  if (text.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

std::string sha256Hex(std::string_view bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), out, &len, EVP_sha256(), nullptr);
  return agent::hexOf(std::string_view(reinterpret_cast<char*>(out), len));
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(const void* data, size_t n) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n); }
std::string Sha256::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out, &len);
  return agent::hexOf(std::string_view(reinterpret_cast<char*>(out), len));
}

std::string uriEncode(std::string_view text, bool keepSlash) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keepSlash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::optional<int64_t> parseAmzDate(std::string_view text) {
  if (text.size() != 16 || text[8] != 'T' || text[15] != 'Z') return std::nullopt;
  auto field = [&](size_t at, size_t n) { return digits(text.substr(at, n)); };
  auto year = field(0, 4), month = field(4, 2), day = field(6, 2);
  auto hour = field(9, 2), minute = field(11, 2), second = field(13, 2);
  if (!year || !month || !day || !hour || !minute || !second) return std::nullopt;
  if (*month < 1 || *month > 12 || *day < 1 || *day > 31 || *hour > 23 || *minute > 59 || *second > 60)
    return std::nullopt;
  tm utc{};
  utc.tm_year = static_cast<int>(*year) - 1900;
  utc.tm_mon = static_cast<int>(*month) - 1;
  utc.tm_mday = static_cast<int>(*day);
  utc.tm_hour = static_cast<int>(*hour);
  utc.tm_min = static_cast<int>(*minute);
  utc.tm_sec = static_cast<int>(*second);
  return static_cast<int64_t>(timegm(&utc));
}

Status checkRequestTime(const SignedRequest& r, int64_t nowSeconds) {
  std::string amzDate;
  for (const auto& [k, v] : r.headers) {
    if (lower(k) == "x-amz-date") amzDate = v;
  }
  auto when = parseAmzDate(amzDate);
  if (!when) {
    return Status(StatusCode::kPermissionDenied,
                  "x-amz-date is missing or not of the form YYYYMMDDTHHMMSSZ (AccessDenied)");
  }
  if (*when < nowSeconds - kRequestTimeWindowSeconds || *when > nowSeconds + kRequestTimeWindowSeconds) {
    time_t now = static_cast<time_t>(nowSeconds);
    tm utc{};
    gmtime_r(&now, &utc);
    char serverTime[32];
    strftime(serverTime, sizeof serverTime, "%Y%m%dT%H%M%SZ", &utc);
    return Status(StatusCode::kPermissionDenied, "the difference between the request time " + amzDate +
                                                     " and the server's time " + serverTime +
                                                     " is more than 15 minutes (RequestTimeTooSkewed)");
  }
  return Status::ok();
}

std::string amzDateNow() {
  time_t now = time(nullptr);
  tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  return buf;
}

std::string signV4(const SignedRequest& r, std::string_view accessKey, std::string_view secretKey,
                   std::string_view region, std::string_view amzDate) {
  std::vector<std::string> names;
  for (const auto& [k, v] : r.headers) names.push_back(lower(k));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::string date(amzDate.substr(0, 8));
  std::string scope = date + "/" + std::string(region) + "/s3/aws4_request";
  std::string sig = signature(canonical(r, names), secretKey, amzDate, scope, date, region);
  std::string signedHeaders;
  for (const auto& n : names) signedHeaders += (signedHeaders.empty() ? "" : ";") + n;
  return "AWS4-HMAC-SHA256 Credential=" + std::string(accessKey) + "/" + scope +
         ", SignedHeaders=" + signedHeaders + ", Signature=" + sig;
}

namespace {

// The Credential, SignedHeaders and Signature fields of an Authorization header's value after the
// algorithm (comma-separated key=value pairs; others are ignored).
void authorizationFields(std::string_view rest, std::string& credential, std::string& signedHeaders,
                         std::string& sig) {
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view part = rest.substr(0, comma);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    size_t eq = part.find('=');
    if (eq != std::string_view::npos) {
      std::string_view k = part.substr(0, eq), v = part.substr(eq + 1);
      if (k == "Credential")
        credential = v;
      else if (k == "SignedHeaders")
        signedHeaders = v;
      else if (k == "Signature")
        sig = v;
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
}

// The pieces of `text` between `sep`s (an empty text is one empty piece).
std::vector<std::string> splitAt(const std::string& text, char sep) {
  std::vector<std::string> pieces;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == sep) {
      pieces.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return pieces;
}

}  // namespace

Status verifyV4(const SignedRequest& r, std::string_view authorization, std::string_view accessKey,
                std::string_view secretKey) {
  auto denied = [](const std::string& why) { return Status(StatusCode::kPermissionDenied, why); };
  constexpr std::string_view kAlgo = "AWS4-HMAC-SHA256 ";
  if (authorization.empty()) return denied("the request is not signed (no Authorization header)");
  if (authorization.substr(0, kAlgo.size()) != kAlgo)
    return denied("only AWS4-HMAC-SHA256 signatures are accepted");
  std::string credential, signedHeaders, sig;
  authorizationFields(authorization.substr(kAlgo.size()), credential, signedHeaders, sig);
  // Credential = AK/date/region/s3/aws4_request
  const std::vector<std::string> parts = splitAt(credential, '/');
  if (parts.size() != 5 || parts[3] != "s3" || parts[4] != "aws4_request" || signedHeaders.empty() ||
      sig.empty()) {
    return denied("a malformed Authorization header");
  }
  if (!agent::constantTimeEqual(parts[0], accessKey)) return denied("unknown access key '" + parts[0] + "'");
  std::string amzDate;
  for (const auto& [k, v] : r.headers) {
    if (lower(k) == "x-amz-date") amzDate = v;
  }
  if (amzDate.size() < 8 || amzDate.substr(0, 8) != parts[1])
    return denied("x-amz-date does not match the scope");
  std::vector<std::string> names;
  for (const std::string& name : splitAt(signedHeaders, ';')) names.push_back(lower(name));
  if (std::find(names.begin(), names.end(), "host") == names.end())
    return denied("the host header is not signed");
  std::string scope = parts[1] + "/" + parts[2] + "/s3/aws4_request";
  std::string expected = signature(canonical(r, names), secretKey, amzDate, scope, parts[1], parts[2]);
  if (!agent::constantTimeEqual(expected, sig))
    return denied("the signature does not match (SignatureDoesNotMatch)");
  return Status::ok();
}

}  // namespace ferry::objects
