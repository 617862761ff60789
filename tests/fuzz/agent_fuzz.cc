// Feeds arbitrary bytes to the agent's decoders of peer input: the worker address (binary) and the
// wireup messages (JSON lines, with and without a shared secret). Accepted input must re-encode to
// something that decodes to the same message, so nothing a peer sends is half-understood.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/wireup.h"
#include "ferry/agent/address.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "agent_fuzz: %s\n", what);
    std::abort();
  }
}

bool sameMessage(const ferry::agent::WireupMessage& a, const ferry::agent::WireupMessage& b) {
  return a.type == b.type && a.from == b.from && a.to == b.to && a.conn == b.conn &&
         a.fromAddress == b.fromAddress && a.numQp == b.numQp && a.lanes == b.lanes &&
         a.endpoints == b.endpoints && a.nonce == b.nonce && a.echo == b.echo && a.time == b.time &&
         a.abandoned == b.abandoned && a.name == b.name && a.query == b.query && a.info == b.info &&
         a.reason == b.reason && a.channel == b.channel && a.body == b.body && a.cookie == b.cookie;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  using namespace ferry::agent;

  auto address = WorkerAddress::decode(bytes);
  if (address.isOk()) {
    auto again = WorkerAddress::decode(address->encode());
    check(again.isOk(), "an accepted address does not decode after encode()");
    check(*again == *address, "encode -> decode changed an address");
  } else {
    check(address.status().code() == ferry::StatusCode::kProtocolError,
          "an address refusal is not a protocol error");
  }

  for (const std::string secret : {"", "k"}) {
    auto m = decodeWireup(bytes, secret);
    if (!m.isOk()) {
      auto code = m.status().code();
      check(code == ferry::StatusCode::kProtocolError || code == ferry::StatusCode::kPermissionDenied,
            "a wireup refusal is neither a protocol error nor a permission error");
      continue;
    }
    std::string line = encodeWireup(*m, secret);
    auto back = decodeWireup(line, secret);
    check(back.isOk(), "an accepted wireup message does not decode after encodeWireup()");
    check(sameMessage(*back, *m), "encode -> decode changed a wireup message");
    // Signed with one secret, refused under another.
    if (!secret.empty()) check(!decodeWireup(line, "other").isOk(), "a message passed with the wrong secret");
  }
  return 0;
}
