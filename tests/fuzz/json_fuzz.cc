// Feeds arbitrary text to the JSON parser and to the Path decoder that sits on it (both read what
// a remote peer sends during wire-up). Accepted input must serialize to text that parses back to
// the same value; an accepted path must survive toJson -> fromJson unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/json.h"
#include "ferry/verbs/path.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "json_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  auto value = ferry::json::parse(text);
  if (value.isOk()) {
    std::string once = ferry::json::serialize(*value);
    auto back = ferry::json::parse(once);
    check(back.isOk(), "serialize produced text that does not parse");
    check(*back == *value, "serialize -> parse changed the value");
    check(ferry::json::serialize(*back) == once, "serialize is not stable");
  }

  auto path = ferry::verbs::Path::fromJson(text);
  if (path.isOk()) {
    check(value.isOk(), "a path was accepted from text the JSON parser refuses");
    auto again = ferry::verbs::Path::fromJson(path->toJson());
    check(again.isOk(), "fromJson refused what toJson wrote");
    check(*again == *path, "toJson -> fromJson changed the path");
    ferry::verbs::Path twice = *path;
    twice.reverse();
    twice.reverse();
    check(twice == *path, "reverse twice is not the identity");
  }
  return 0;
}
