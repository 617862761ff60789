// The reading of etcd's answers (etcd_answer.h).
#include "agent/store/etcd_answer.h"

#include <algorithm>
#include <limits>

#include "agent/store/store_backend.h"
#include "common/base64.h"
#include "common/json_fields.h"

namespace ferry::agent {
namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMinInt64 = std::numeric_limits<int64_t>::min();
// Strings and lists are not bounded member by member: the answer is, as a whole (etcd_store.cc).
constexpr size_t kAnyLength = std::numeric_limits<size_t>::max();

json::FieldErrors answerErrors(const std::string& url, const std::string& answer) {
  return {.code = StatusCode::kProtocolError, .prefix = url + ": etcd's " + answer + ": "};
}

// The words for the members of a value inside the one `outer` reads ("kvs[2]: ...").
json::FieldErrors inside(const json::FieldErrors& outer, const std::string& where) {
  json::FieldErrors errors = outer;
  errors.prefix += where + ": ";
  return errors;
}

// A message member; absent, it reads as the message with nothing set.
Result<const json::Value*> messageOr(const json::Fields& f, std::string_view key) {
  static const json::Value kNothingSet = json::Value::emptyObject();
  if (!f.has(key)) return &kNothingSet;
  return f.object(key);
}

// A repeated member; absent, it reads as an empty list.
Result<const json::Array*> listOr(const json::Fields& f, std::string_view key) {
  static const json::Array kEmpty;
  if (!f.has(key)) return &kEmpty;
  return f.array(key, kAnyLength);
}

// A bytes member; absent, it reads as no bytes.
Result<std::string> bytesOr(const json::Fields& f, std::string_view key) {
  FERRY_ASSIGN_OR_RETURN(std::string text, f.textOr(key, kAnyLength, ""));
  auto bytes = decodeBase64(text);
  if (!bytes.isOk()) return f.refuse(key, "is not base64 (" + bytes.status().message() + ")");
  return std::move(*bytes);
}

// A mvccpb.KeyValue: its key and value (the revisions, version and lease are not needed here).
Result<StoreEntry> decodeKeyValue(const json::Value& kv, json::FieldErrors errors) {
  json::Fields f(kv, std::move(errors));
  if (!kv.isObject()) return f.refuse("not an object");
  StoreEntry entry;
  FERRY_ASSIGN_OR_RETURN(entry.key, bytesOr(f, "key"));
  FERRY_ASSIGN_OR_RETURN(entry.value, bytesOr(f, "value"));
  return entry;
}

Result<std::vector<StoreEntry>> kvsOf(const json::Fields& f) {
  FERRY_ASSIGN_OR_RETURN(const json::Array* kvs, listOr(f, "kvs"));
  std::vector<StoreEntry> entries;
  entries.reserve(kvs->size());
  for (size_t i = 0; i < kvs->size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(StoreEntry entry,
                           decodeKeyValue((*kvs)[i], inside(f.errors(), "kvs[" + std::to_string(i) + "]")));
    entries.push_back(std::move(entry));
  }
  return entries;
}

bool isOurs(std::string_view key, std::string_view prefix) {
  return checkStoreKey(key).isOk() && keyHasPrefix(key, prefix);
}

// Whether a watch event is a delete: its type is the enum's name ("PUT", the default, is omitted),
// or its number, which proto3 readers take too.
Result<bool> isDelete(const json::Fields& event) {
  const json::Value* type = event.value().find("type");
  if (type != nullptr && type->isNumber()) {
    FERRY_ASSIGN_OR_RETURN(int64_t number, event.integer("type", 0, 1));
    return number == 1;
  }
  FERRY_ASSIGN_OR_RETURN(std::string name, event.textOr("type", 64, "PUT"));
  if (name != "PUT" && name != "DELETE") return event.refuse("type", "is neither \"PUT\" nor \"DELETE\"");
  return name == "DELETE";
}

// The events of a watch answer's "result" that concern keys under prefix.
Status readWatchEvents(const json::Fields& result, std::string_view prefix, std::vector<StoreEvent>* out) {
  FERRY_ASSIGN_OR_RETURN(const json::Array* events, listOr(result, "events"));
  for (size_t i = 0; i < events->size(); ++i) {
    const json::Value& e = (*events)[i];
    json::Fields event(e, inside(result.errors(), "events[" + std::to_string(i) + "]"));
    if (!e.isObject()) return event.refuse("not an object");
    FERRY_ASSIGN_OR_RETURN(bool deleted, isDelete(event));
    FERRY_ASSIGN_OR_RETURN(const json::Value* kv, event.object("kv"));
    FERRY_ASSIGN_OR_RETURN(StoreEntry entry, decodeKeyValue(*kv, inside(event.errors(), "kv")));
    if (!isOurs(entry.key, prefix)) continue;
    if (deleted) {
      out->push_back({StoreEvent::Kind::kDelete, std::move(entry.key), {}});
    } else {
      out->push_back({StoreEvent::Kind::kPut, std::move(entry.key), std::move(entry.value)});
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<StoreEntry>> decodeEtcdKvs(const json::Value& answer, const std::string& url) {
  return kvsOf(json::Fields(answer, answerErrors(url, "range answer")));
}

Result<EtcdSnapshot> decodeEtcdRange(const json::Value& answer, std::string_view prefix,
                                     const std::string& url) {
  json::Fields f(answer, answerErrors(url, "range answer"));
  FERRY_ASSIGN_OR_RETURN(const json::Value* header, messageOr(f, "header"));
  EtcdSnapshot snapshot;
  json::Fields h(*header, inside(f.errors(), "header"));
  FERRY_ASSIGN_OR_RETURN(snapshot.revision, h.decimalOr("revision", 0, kMaxInt64, 0));
  FERRY_ASSIGN_OR_RETURN(std::vector<StoreEntry> kvs, kvsOf(f));
  for (StoreEntry& kv : kvs) {
    if (isOurs(kv.key, prefix)) snapshot.entries.push_back(std::move(kv));
  }
  std::sort(snapshot.entries.begin(), snapshot.entries.end(),
            [](const StoreEntry& a, const StoreEntry& b) { return a.key < b.key; });
  return snapshot;
}

Result<int64_t> decodeEtcdLeaseGrant(const json::Value& answer, const std::string& url) {
  return json::Fields(answer, answerErrors(url, "lease grant")).decimal("ID", 1, kMaxInt64);
}

Result<int64_t> decodeEtcdKeepAlive(const json::Value& answer, const std::string& url) {
  // A stream of one answer, {"result": {"ID", "TTL"}}. etcd renews an expired lease as TTL 0,
  // which JSON leaves out.
  json::Fields f(answer, answerErrors(url, "keepalive answer"));
  FERRY_ASSIGN_OR_RETURN(const json::Value* result, messageOr(f, "result"));
  return json::Fields(*result, inside(f.errors(), "result")).decimalOr("TTL", kMinInt64, kMaxInt64, 0);
}

Result<EtcdWatchUpdate> decodeEtcdWatchLine(std::string_view line, std::string_view prefix,
                                            const std::string& url) {
  json::FieldErrors errors = answerErrors(url, "watch stream");
  auto parsed = json::parse(line);
  if (!parsed.isOk()) return errors.refuse(parsed.status().message());
  json::Fields f(*parsed, errors);
  if (!parsed->isObject()) return f.refuse("a line that is not a JSON object");
  if (f.has("error")) return decodeEtcdError(*parsed, 200, url);
  // "result" is the gateway's envelope of each answer of the stream, not a proto3 member: it is
  // always there.
  FERRY_ASSIGN_OR_RETURN(const json::Value* result, f.object("result"));
  json::Fields r(*result, inside(errors, "result"));
  EtcdWatchUpdate update;
  FERRY_ASSIGN_OR_RETURN(update.canceled, r.booleanOr("canceled", false));
  if (update.canceled) return update;
  FERRY_RETURN_IF_ERROR(readWatchEvents(r, prefix, &update.events));
  return update;
}

Status decodeEtcdError(const json::Value& answer, long httpCode, const std::string& url) {
  const json::Value* error = answer.find("error");
  bool fromStream = error != nullptr && error->isObject();
  json::Fields f(fromStream ? *error : answer, answerErrors(url, "error answer"));
  FERRY_ASSIGN_OR_RETURN(int64_t code, f.decimalOr(fromStream ? "grpc_code" : "code", 0,
                                                   std::numeric_limits<int32_t>::max(), 0));
  FERRY_ASSIGN_OR_RETURN(std::string message,
                         f.textOr("message", kAnyLength, "HTTP " + std::to_string(httpCode)));
  switch (code) {
    case 3: return invalidArgument(url + ": " + message);
    case 5: return notFound(url + ": " + message);
    case 8: return resourceExhausted(url + ": " + message);
    case 4:
    case 14: return storeUnavailable(url, message);
    default: return Status(StatusCode::kInternal, url + ": etcd: " + message);
  }
}

}  // namespace ferry::agent
