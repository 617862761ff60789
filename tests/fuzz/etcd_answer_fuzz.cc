// Feeds arbitrary text to every decoder of etcd's answers (agent/store/etcd_answer.h): as a line of
// a watch stream, and, when it parses, as a range, key-value list, lease grant, keepalive and error
// answer. A refusal must be one kProtocolError line naming the URL; an error answer must give one
// of the statuses etcd_answer.h lists, never OK. What a decoder accepts must keep what the store
// relies on (entries and events are store keys under the prefix, sorted entries, a lease of at
// least 1) and must read the same once written back as etcd writes it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "agent/store/etcd_answer.h"
#include "agent/store/store_backend.h"
#include "common/base64.h"
#include "common/json.h"

namespace {

namespace agent = ferry::agent;
namespace json = ferry::json;
using ferry::StatusCode;

const std::string kUrl = "etcd://127.0.0.1:2379";
constexpr std::string_view kPrefix = "/ferry/";

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "etcd_answer_fuzz: %s\n", what);
    std::abort();
  }
}

void checkRefusal(const ferry::Status& st) {
  check(st.code() == StatusCode::kProtocolError, "a refusal that is not kProtocolError");
  check(st.message().rfind(kUrl + ": etcd's ", 0) == 0, "a refusal that does not name the URL and answer");
  check(st.message().find('\n') == std::string::npos, "a refusal of more than one line");
}

bool isOurs(std::string_view key) {
  return agent::checkStoreKey(key).isOk() && agent::keyHasPrefix(key, kPrefix);
}

// A mvccpb.KeyValue as etcd writes it: base64 bytes, the empty value left out.
json::Value keyValue(const std::string& key, const std::string& value) {
  json::Value kv = json::Value::emptyObject();
  kv.set("key", ferry::encodeBase64(key));
  if (!value.empty()) kv.set("value", ferry::encodeBase64(value));
  return kv;
}

std::vector<agent::StoreEntry> sorted(std::vector<agent::StoreEntry> entries) {
  std::sort(entries.begin(), entries.end(), [](const agent::StoreEntry& a, const agent::StoreEntry& b) {
    return a.key != b.key ? a.key < b.key : a.value < b.value;
  });
  return entries;
}

void checkRange(const json::Value& answer) {
  auto kvs = agent::decodeEtcdKvs(answer, kUrl);
  if (!kvs.isOk()) checkRefusal(kvs.status());
  auto snapshot = agent::decodeEtcdRange(answer, kPrefix, kUrl);
  if (!snapshot.isOk()) return checkRefusal(snapshot.status());
  check(kvs.isOk(), "a range accepted whose key-value list is refused");
  check(snapshot->revision >= 0, "a negative revision");
  std::vector<agent::StoreEntry> ours;
  for (const agent::StoreEntry& kv : *kvs) {
    if (isOurs(kv.key)) ours.push_back(kv);
  }
  check(sorted(ours) == sorted(snapshot->entries),
        "a range's entries are not the key-value list's under the prefix");
  json::Value header = json::Value::emptyObject();
  header.set("revision", std::to_string(snapshot->revision));
  json::Value list = json::Value::emptyArray();
  for (size_t i = 0; i < snapshot->entries.size(); ++i) {
    const agent::StoreEntry& e = snapshot->entries[i];
    check(i == 0 || snapshot->entries[i - 1].key <= e.key, "a range's entries are not sorted by key");
    list.push(keyValue(e.key, e.value));
  }
  json::Value again = json::Value::emptyObject();
  again.set("header", std::move(header));
  again.set("kvs", std::move(list));
  auto back = agent::decodeEtcdRange(again, kPrefix, kUrl);
  check(back.isOk() && back->revision == snapshot->revision &&
            sorted(back->entries) == sorted(snapshot->entries),
        "a range written back as etcd writes it reads differently");
}

void checkLeases(const json::Value& answer) {
  auto id = agent::decodeEtcdLeaseGrant(answer, kUrl);
  if (id.isOk()) {
    check(*id >= 1, "a lease under 1");
    json::Value again = json::Value::emptyObject();
    again.set("ID", std::to_string(*id));
    auto back = agent::decodeEtcdLeaseGrant(again, kUrl);
    check(back.isOk() && *back == *id, "a lease grant written back reads differently");
  } else {
    checkRefusal(id.status());
  }
  auto ttl = agent::decodeEtcdKeepAlive(answer, kUrl);
  if (!ttl.isOk()) return checkRefusal(ttl.status());
  json::Value result = json::Value::emptyObject();
  result.set("TTL", std::to_string(*ttl));
  json::Value again = json::Value::emptyObject();
  again.set("result", std::move(result));
  auto back = agent::decodeEtcdKeepAlive(again, kUrl);
  check(back.isOk() && *back == *ttl, "a keepalive written back reads differently");
}

void checkError(const ferry::Status& st) {
  check(!st.isOk(), "an error answer read as OK");
  if (st.code() == StatusCode::kProtocolError) return checkRefusal(st);
  check(st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ||
            st.code() == StatusCode::kResourceExhausted || st.code() == StatusCode::kUnavailable ||
            st.code() == StatusCode::kInternal,
        "an error answer with a status etcd_answer.h does not list");
  check(st.message().find(kUrl) != std::string::npos, "an error answer's status does not name the URL");
}

// An accepted watch line, written back as etcd writes it, reads the same.
void checkWatchWrittenBack(const agent::EtcdWatchUpdate& update) {
  json::Value events = json::Value::emptyArray();
  for (const agent::StoreEvent& e : update.events) {
    json::Value event = json::Value::emptyObject();
    if (e.kind == agent::StoreEvent::Kind::kDelete) event.set("type", "DELETE");
    event.set("kv", keyValue(e.key, e.value));
    events.push(std::move(event));
  }
  json::Value result = json::Value::emptyObject();
  if (update.canceled) result.set("canceled", true);
  result.set("events", std::move(events));
  json::Value again = json::Value::emptyObject();
  again.set("result", std::move(result));
  auto back = agent::decodeEtcdWatchLine(json::serialize(again), kPrefix, kUrl);
  check(back.isOk() && back->canceled == update.canceled && back->events.size() == update.events.size(),
        "a watch line written back reads differently");
  for (size_t i = 0; i < back->events.size(); ++i) {
    const agent::StoreEvent& a = back->events[i];
    const agent::StoreEvent& b = update.events[i];
    check(a.kind == b.kind && a.key == b.key && a.value == b.value,
          "a watch event written back reads differently");
  }
}

void checkWatchLine(std::string_view line, const json::Value* parsed) {
  auto update = agent::decodeEtcdWatchLine(line, kPrefix, kUrl);
  if (parsed != nullptr && parsed->isObject() && parsed->find("error") != nullptr) {
    ferry::Status expected = agent::decodeEtcdError(*parsed, 200, kUrl);
    check(update.status().code() == expected.code() && update.status().message() == expected.message(),
          "a watch line's error is not the error answer's status");
    return;
  }
  if (!update.isOk()) return checkRefusal(update.status());
  check(parsed != nullptr, "a watch line accepted that does not parse as JSON");
  check(!update->canceled || update->events.empty(), "a cancelled watch with events");
  for (const agent::StoreEvent& e : update->events) {
    check(isOurs(e.key), "an event whose key is no store key under the prefix");
    check(e.kind == agent::StoreEvent::Kind::kPut || e.value.empty(), "a delete event with a value");
  }
  checkWatchWrittenBack(*update);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = json::parse(text);
  checkWatchLine(text, parsed.isOk() ? &*parsed : nullptr);
  if (!parsed.isOk()) return 0;
  checkRange(*parsed);
  checkLeases(*parsed);
  checkError(agent::decodeEtcdError(*parsed, 404, kUrl));
  return 0;
}
