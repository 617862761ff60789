// Feeds arbitrary text to the JSON parser, the Path decoder and the endpoint metadata decoder that
// sit on it (all read what a remote peer sends during wire-up). Accepted input must serialize to
// text that parses back to the same value; an accepted path or metadata must survive a re-encoding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/json.h"
#include "endpoint/metadata.h"
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

  // Endpoint metadata (what a peer's connect() hands us): accepted metadata re-encodes to text
  // that decodes to the same paths and regions.
  auto meta = ferry::endpoint::decodeMetadata(text, "fuzz");
  if (meta.isOk()) {
    check(value.isOk(), "metadata was accepted from text the JSON parser refuses");
    std::string mrInfo = "{}";
    if (const auto* mrs = value->find("mr_info")) mrInfo = ferry::json::serialize(*mrs);
    auto again = ferry::endpoint::decodeMetadata(ferry::endpoint::encodeMetadata(*meta, mrInfo), "fuzz");
    check(again.isOk(), "decodeMetadata refused what encodeMetadata wrote");
    check(again->numQp == meta->numQp && again->paths == meta->paths &&
              again->regions.size() == meta->regions.size(),
          "encode -> decode changed the metadata");
  } else {
    check(meta.status().code() == ferry::StatusCode::kInvalidArgument,
          "a metadata refusal is not InvalidArgument");
  }
  return 0;
}
