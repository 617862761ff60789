// Feeds arbitrary lines to decodeStoreRequest, the decoder the ferry:// store server runs on every
// line a client sends. It must refuse without crashing; what it accepts must be within the limits
// the server relies on, and must survive storeRequestBody -> serialize -> decode unchanged (the
// client's encoder and the server's decoder agree).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/store/ferry_store_server.h"
#include "common/json.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ferry::agent::StoreRequest;
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto request = ferry::agent::decodeStoreRequest(line);
  if (!request.isOk()) {
    check(request.status().code() == ferry::StatusCode::kProtocolError,
          "a refusal that is not kProtocolError");
    return 0;
  }
  check(request->id >= 1 && request->id <= (int64_t{1} << 53), "an id out of range");
  check(request->value.size() <= (size_t{1} << 20), "a value over 1 MiB");
  check(request->key.size() <= 1024, "a key over 1024 bytes");
  bool keyed = request->type == StoreRequest::Type::kSet || request->type == StoreRequest::Type::kGet ||
               request->type == StoreRequest::Type::kErase;
  if (keyed) check(ferry::agent::checkStoreKey(request->key).isOk(), "a key checkStoreKey refuses");
  if (request->type == StoreRequest::Type::kGrantLease) check(request->ttlSeconds >= 1, "a lease under 1 s");

  ferry::json::Value full = ferry::json::Value::emptyObject();
  full.set("ferry_store", ferry::agent::kStoreProtocolVersion);
  full.set("type", ferry::agent::storeRequestTypeName(request->type));
  ferry::json::Value body = ferry::agent::storeRequestBody(*request);
  for (const auto& [name, value] : *body.object()) full.set(name, value);
  auto again = ferry::agent::decodeStoreRequest(ferry::json::serialize(full));
  check(again.isOk(), "the decoder refused what the client's encoder wrote");
  check(*again == *request, "encode -> decode changed the request");
  return 0;
}
