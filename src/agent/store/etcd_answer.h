// The etcd store's reading of what etcd's JSON gateway answers (etcd_store.h), apart from the HTTP
// that carries it, so that it is built and tested where libcurl is not.
//
// The answers follow proto3's JSON mapping, not ferry's own messages, and are read by its rules:
//   - a member that holds its type's default (0, "", false, an empty list, a message with nothing
//     set, an enum's first value) is omitted: an absent member reads as that default;
//   - 64-bit integers are decimal strings ("7587869"), read with json::Fields::decimal, which also
//     takes a number as proto3 readers do;
//   - bytes (keys and values) are base64, read strictly (common/base64.h);
//   - members this client does not read are ignored, not refused: a newer etcd adds some.
// Everything else a member can be is refused, in json::Fields's words:
//   Status(kProtocolError, "<url>: etcd's <answer>: [<where>: ]<member> <problem>")
// e.g. `etcd://10.0.0.7:2379: etcd's range answer: kvs[2]: "key" is not base64 (...)`. Keys that
// are valid base64 but no store key (written by another etcd client: binary, too long) are skipped,
// not refused: they are not ours to show.
//
// Each function reads the value it is given and keeps nothing: any thread, any number at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "ferry/agent/store.h"

namespace ferry::agent {

// The entries under a prefix and the store's revision, from a range answer.
struct EtcdSnapshot {
  std::vector<StoreEntry> entries;
  int64_t revision = 0;
};

// What one line of a watch stream says: the changes of keys under the watched prefix, in the
// order etcd made them, or that etcd cancelled the watch (then there are none).
struct EtcdWatchUpdate {
  bool canceled = false;
  std::vector<StoreEvent> events;
};

// The key-value pairs ("kvs") of a range answer, in etcd's order and without skipping any; none
// when absent.
Result<std::vector<StoreEntry>> decodeEtcdKvs(const json::Value& answer, const std::string& url);

// A range answer over prefix: the store's revision ("header"."revision") and the entries whose
// keys are store keys under prefix, sorted by key.
Result<EtcdSnapshot> decodeEtcdRange(const json::Value& answer, std::string_view prefix,
                                     const std::string& url);

// The lease a lease grant made ("ID"; absent, or under 1, is refused).
Result<int64_t> decodeEtcdLeaseGrant(const json::Value& answer, const std::string& url);

// The seconds a keepalive renewed its lease for ("result"."TTL"); 0 (absent) or less when the
// lease has expired or was never granted.
Result<int64_t> decodeEtcdKeepAlive(const json::Value& answer, const std::string& url);

// One line of a watch stream over prefix, a JSON object: {"result": {...}}, or {"error": {...}}
// when etcd ends the stream with an error (that error's status, as decodeEtcdError gives it).
// A line that is not JSON is refused.
Result<EtcdWatchUpdate> decodeEtcdWatchLine(std::string_view line, std::string_view prefix,
                                            const std::string& url);

// The status an error answer stands for: a call's {"error": "...", "code": N, "message": "..."}
// or a stream's {"error": {"grpc_code": N, "message": "..."}}. gRPC's InvalidArgument, NotFound
// and ResourceExhausted give those codes with etcd's message after the URL; DeadlineExceeded and
// Unavailable kUnavailable (storeUnavailable); any other code, or none, kInternal. The message is
// "HTTP <httpCode>" when etcd sent none. Never OK.
Status decodeEtcdError(const json::Value& answer, long httpCode, const std::string& url);

}  // namespace ferry::agent
