// Feeds arbitrary bytes to the connector's decoders of peer input: RdmaMetadata (the text a peer
// hands over) and the messages of the "connect" channel (BEGIN, DONE, CANCEL). Accepted input must
// re-encode to something that decodes to the same value, and the tag text must be computable, so
// nothing a peer sends is half-understood.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "connect/protocol.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "connect_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  using namespace ferry::connect;

  auto md = decodeMetadata(text);
  if (md.isOk()) {
    auto again = decodeMetadata(encodeMetadata(*md));
    check(again.isOk(), "accepted metadata does not decode after encode");
    check(*again == *md, "encode -> decode changed metadata");
    check(!canonicalText(*md).empty(), "no canonical text");
  } else {
    check(md.status().code() == ferry::StatusCode::kInvalidArgument,
          "a metadata refusal is not InvalidArgument");
  }

  auto m = decodeMessage(text);
  if (m.isOk()) {
    auto again = decodeMessage(encodeMessage(*m));
    check(again.isOk(), "an accepted message does not decode after encode");
    check(again->type == m->type && again->id == m->id && again->metadata == m->metadata &&
              again->buffers == m->buffers && again->operation == m->operation && again->code == m->code &&
              again->reason == m->reason,
          "encode -> decode changed a message");
  } else {
    check(m.status().code() == ferry::StatusCode::kProtocolError, "a message refusal is not ProtocolError");
  }
  return 0;
}
