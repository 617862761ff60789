// The reading of etcd's answers (src/agent/store/etcd_answer.h), without a server: answers as
// etcd 3.4's gateway writes them decode to what the store reports, and every malformed answer is
// one kProtocolError naming the URL and the member, never a crash. The store suite
// (store_test.cc, backend etcd) runs the same decoders against a real etcd.
#include "agent/store/etcd_answer.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace ferry::agent {
namespace {

const std::string kUrl = "etcd://127.0.0.1:2379";
const std::string kHeader =
    R"("header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709",)"
    R"("revision":"4","raft_term":"2"})";

json::Value parsed(std::string_view text) {
  auto v = json::parse(text);
  EXPECT_TRUE(v.isOk()) << text << ": " << v.status().toString();
  return v.isOk() ? std::move(*v) : json::Value();
}

// The answer is refused as malformed, in one line that names the URL and says `why`.
template <typename T>
::testing::AssertionResult refused(const Result<T>& result, const std::string& why) {
  const Status& st = result.status();
  if (st.isOk()) return ::testing::AssertionFailure() << "accepted";
  std::string message = st.message();
  if (st.code() != StatusCode::kProtocolError || message.rfind(kUrl + ": etcd's ", 0) != 0 ||
      message.find(why) == std::string::npos || message.find('\n') != std::string::npos) {
    return ::testing::AssertionFailure()
           << st.toString() << " (expected kProtocolError with '" << why << "')";
  }
  return ::testing::AssertionSuccess();
}

Result<EtcdSnapshot> range(std::string_view text, std::string_view prefix = "/a/") {
  return decodeEtcdRange(parsed(text), prefix, kUrl);
}

Result<EtcdWatchUpdate> watchLine(std::string_view line) { return decodeEtcdWatchLine(line, "/a/", kUrl); }

TEST(EtcdAnswer, RangeReadsTheRevisionAndTheEntriesUnderThePrefixSortedByKey) {
  // "/a/c" (no value: proto3 leaves the empty one out), "/a/b"="1", "/b/x" (not under the prefix)
  // and a binary key another client wrote ("\xff\x00"), which is no store key.
  auto snapshot =
      range("{" + kHeader +
            R"(,"kvs":[{"key":"L2EvYw==","create_revision":"3","mod_revision":"3","version":"1"},)"
            R"({"key":"L2EvYg==","create_revision":"2","mod_revision":"2","version":"1",)"
            R"("value":"MQ==","lease":"4111120327208039175"},{"key":"L2IveA==","value":"Mg=="},)"
            R"({"key":"/wA=","value":"Mw=="}],"count":"4","more":false})");
  ASSERT_TRUE(snapshot.isOk()) << snapshot.status().toString();
  EXPECT_EQ(snapshot->revision, 4);
  EXPECT_EQ(snapshot->entries, (std::vector<StoreEntry>{{"/a/b", "1"}, {"/a/c", ""}}));

  // Nothing under the prefix: proto3 leaves out the empty list.
  snapshot = range("{" + kHeader + "}");
  ASSERT_TRUE(snapshot.isOk()) << snapshot.status().toString();
  EXPECT_EQ(snapshot->revision, 4);
  EXPECT_TRUE(snapshot->entries.empty());
  // An int64 as a number, as a proto3 reader also takes it; a header left out reads as revision 0.
  EXPECT_EQ(range(R"({"header":{"revision":17}})").value().revision, 17);
  EXPECT_EQ(range("{}").value().revision, 0);
}

TEST(EtcdAnswer, KvsAreReadInEtcdsOrderWithoutSkipping) {
  auto kvs = decodeEtcdKvs(parsed(R"({"kvs":[{"key":"L2EvYg==","value":"MQ=="},{"key":"/wA="}]})"), kUrl);
  ASSERT_TRUE(kvs.isOk()) << kvs.status().toString();
  EXPECT_EQ(*kvs, (std::vector<StoreEntry>{{"/a/b", "1"}, {std::string("\xff\x00", 2), ""}}));
  EXPECT_TRUE(decodeEtcdKvs(parsed("{" + kHeader + "}"), kUrl).value().empty());
}

TEST(EtcdAnswer, LeaseGrantAndKeepAliveReadTheirInt64Strings) {
  auto id = decodeEtcdLeaseGrant(parsed("{" + kHeader + R"(,"ID":"4111120327208039173","TTL":"5"})"), kUrl);
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  EXPECT_EQ(*id, 4111120327208039173);
  auto ttl = decodeEtcdKeepAlive(
      parsed(R"({"result":{)" + kHeader + R"(,"ID":"4111120327208039175","TTL":"5"}})"), kUrl);
  ASSERT_TRUE(ttl.isOk()) << ttl.status().toString();
  EXPECT_EQ(*ttl, 5);
  // An expired lease: TTL 0, which proto3 leaves out, and so may the whole result be.
  EXPECT_EQ(decodeEtcdKeepAlive(parsed(R"({"result":{)" + kHeader + R"(,"ID":"12345"}})"), kUrl).value(), 0);
  EXPECT_EQ(decodeEtcdKeepAlive(parsed("{}"), kUrl).value(), 0);
  EXPECT_EQ(decodeEtcdKeepAlive(parsed(R"({"result":{"TTL":"-1"}})"), kUrl).value(), -1);
}

TEST(EtcdAnswer, WatchLinesGivePutsAndDeletesUnderThePrefix) {
  auto created = watchLine(R"({"result":{)" + kHeader + R"(,"created":true}})");
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  EXPECT_FALSE(created->canceled);
  EXPECT_TRUE(created->events.empty());

  auto update = watchLine(R"({"result":{)" + kHeader +
                          R"(,"events":[{"kv":{"key":"L2EvYg==","mod_revision":"2","value":"MQ=="}},)"
                          R"({"type":"DELETE","kv":{"key":"L2EvYw==","mod_revision":"4"}},)"
                          R"({"type":"PUT","kv":{"key":"L2IveA==","value":"Mg=="}},)"
                          R"({"type":1,"kv":{"key":"L2EvZA=="}},{"type":0,"kv":{"key":"L2EvZQ=="}}]}})");
  ASSERT_TRUE(update.isOk()) << update.status().toString();
  EXPECT_FALSE(update->canceled);
  ASSERT_EQ(update->events.size(), 4u);
  EXPECT_EQ(update->events[0].kind, StoreEvent::Kind::kPut);
  EXPECT_EQ(update->events[0].key, "/a/b");
  EXPECT_EQ(update->events[0].value, "1");
  EXPECT_EQ(update->events[1].kind, StoreEvent::Kind::kDelete);
  EXPECT_EQ(update->events[1].key, "/a/c");
  EXPECT_EQ(update->events[2].kind, StoreEvent::Kind::kDelete);  // "/b/x" is not under "/a/"
  EXPECT_EQ(update->events[2].key, "/a/d");
  EXPECT_EQ(update->events[3].kind, StoreEvent::Kind::kPut);
  EXPECT_EQ(update->events[3].key, "/a/e");
  EXPECT_EQ(update->events[3].value, "");

  auto canceled = watchLine(R"({"result":{)" + kHeader + R"(,"canceled":true,"compact_revision":"3"}})");
  ASSERT_TRUE(canceled.isOk()) << canceled.status().toString();
  EXPECT_TRUE(canceled->canceled);
}

TEST(EtcdAnswer, ErrorAnswersGiveTheStatusOfTheirGrpcCode) {
  Status st = decodeEtcdError(parsed(R"({"error":"etcdserver: requested lease not found",)"
                                     R"("message":"etcdserver: requested lease not found","code":5})"),
                              404, kUrl);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.toString();
  EXPECT_EQ(st.message(), kUrl + ": etcdserver: requested lease not found");
  st = decodeEtcdError(parsed(R"({"error":"x","message":"etcdserver: too many requests","code":8})"), 429,
                       kUrl);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.toString();
  st = decodeEtcdError(parsed(R"({"error":"x","message":"bad range","code":3})"), 400, kUrl);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  // A stream's error, as a watch line.
  auto line = watchLine(R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader",)"
                        R"("http_status":"Service Unavailable"}})");
  EXPECT_EQ(line.status().code(), StatusCode::kUnavailable) << line.status().toString();
  EXPECT_NE(line.status().message().find("etcdserver: no leader"), std::string::npos);
  // Neither code nor message: the HTTP status says what happened.
  st = decodeEtcdError(parsed("{}"), 503, kUrl);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.toString();
  EXPECT_EQ(st.message(), kUrl + ": etcd: HTTP 503");
}

TEST(EtcdAnswer, MalformedRangesAreRefusedNamingTheMember) {
  EXPECT_TRUE(refused(range(R"({"header":"4"})"), R"(range answer: "header" must be an object)"));
  for (const char* revision : {R"("12x")", R"("")", R"(" 7")", R"("+7")", R"("1.5")", R"("0x10")",
                               R"("99999999999999999999")", R"("-1")", "-1", "1.5", "true", "null", "{}"}) {
    EXPECT_TRUE(
        refused(range(std::string(R"({"header":{"revision":)") + revision + "}}"),
                R"(range answer: header: "revision" must be an integer in [0, 9223372036854775807], not )"))
        << revision;
  }
  EXPECT_TRUE(refused(range(R"({"kvs":{"key":"L2EvYg=="}})"), R"("kvs" must be an array)"));
  EXPECT_TRUE(refused(range(R"({"kvs":["L2EvYg=="]})"), "kvs[0]: not an object"));
  EXPECT_TRUE(
      refused(range(R"({"kvs":[{"key":"L2EvYg=="},{"key":7}]})"), R"(kvs[1]: "key" must be a string)"));
  EXPECT_TRUE(refused(range(R"({"kvs":[{"key":"L2EvYg"}]})"), R"(kvs[0]: "key" is not base64)"));
  EXPECT_TRUE(
      refused(range(R"({"kvs":[{"key":"L2EvYg==","value":"M Q=="}]})"), R"(kvs[0]: "value" is not base64)"));
  EXPECT_TRUE(refused(decodeEtcdKvs(parsed(R"({"kvs":[{"key":"L2EvYg==","value":null}]})"), kUrl),
                      R"(kvs[0]: "value" must be a string)"));
}

TEST(EtcdAnswer, MalformedLeaseAnswersAreRefused) {
  auto grant = [](std::string_view text) { return decodeEtcdLeaseGrant(parsed(text), kUrl); };
  EXPECT_TRUE(refused(grant("{" + kHeader + R"(,"TTL":"5"})"), R"(lease grant: "ID" is missing)"));
  EXPECT_TRUE(
      refused(grant(R"({"ID":"0"})"), R"("ID" must be an integer in [1, 9223372036854775807], not "0")"));
  EXPECT_TRUE(refused(grant(R"({"ID":"abc"})"), R"("ID" must be an integer)"));
  EXPECT_TRUE(refused(grant(R"({"ID":{}})"), R"("ID" must be an integer)"));
  auto keepAlive = [](std::string_view text) { return decodeEtcdKeepAlive(parsed(text), kUrl); };
  EXPECT_TRUE(refused(keepAlive(R"({"result":[]})"), R"(keepalive answer: "result" must be an object)"));
  EXPECT_TRUE(refused(keepAlive(R"({"result":{"TTL":"5s"}})"),
                      R"(keepalive answer: result: "TTL" must be an integer)"));
}

TEST(EtcdAnswer, MalformedWatchLinesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"result":)", "watch stream: json: "},
      {"[]", "watch stream: a line that is not a JSON object"},
      {"{" + kHeader + "}", R"(watch stream: "result" is missing)"},
      {R"({"result":true})", R"("result" must be an object)"},
      {R"({"result":{"canceled":"yes"}})", R"(result: "canceled" must be true or false)"},
      {R"({"result":{"events":{}}})", R"(result: "events" must be an array)"},
      {R"({"result":{"events":[7]}})", "result: events[0]: not an object"},
      {R"({"result":{"events":[{"type":"DELETE"}]}})", R"(result: events[0]: "kv" is missing)"},
      {R"({"result":{"events":[{"kv":"L2EvYg=="}]}})", R"(result: events[0]: "kv" must be an object)"},
      {R"({"result":{"events":[{"type":"MODIFY","kv":{}}]}})",
       R"(events[0]: "type" is neither "PUT" nor "DELETE")"},
      {R"({"result":{"events":[{"type":2,"kv":{}}]}})",
       R"(events[0]: "type" must be an integer in [0, 1], not 2)"},
      {R"({"result":{"events":[{"kv":{"key":"L2EvYg=="}},{"kv":{"key":"!"}}]}})",
       R"(result: events[1]: kv: "key" is not base64)"},
      {R"({"error":{"grpc_code":"fourteen","message":"x"}})",
       R"(error answer: "grpc_code" must be an integer)"},
  };
  for (const auto& [line, why] : cases) EXPECT_TRUE(refused(watchLine(line), why)) << line;
}

TEST(EtcdAnswer, MalformedErrorAnswersAreRefused) {
  auto error = [](std::string_view text) { return Result<int>(decodeEtcdError(parsed(text), 404, kUrl)); };
  EXPECT_TRUE(refused(error(R"({"error":"x","code":"five"})"), R"(error answer: "code" must be an integer)"));
  EXPECT_TRUE(
      refused(error(R"({"error":"x","code":-5})"), R"("code" must be an integer in [0, 2147483647])"));
  EXPECT_TRUE(refused(error(R"({"error":"x","code":5,"message":5})"), R"("message" must be a string)"));
}

TEST(EtcdAnswer, EveryCutOfAnAnswerIsRefusedNotCrashedOn) {
  const std::string line = R"({"result":{)" + kHeader +
                           R"(,"events":[{"type":"DELETE","kv":{"key":"L2EvYw==","mod_revision":"4"}}]}})";
  ASSERT_TRUE(watchLine(line).isOk());
  for (size_t n = 0; n < line.size(); ++n) {
    auto update = watchLine(line.substr(0, n));
    EXPECT_EQ(update.status().code(), StatusCode::kProtocolError) << line.substr(0, n);
  }
}

}  // namespace
}  // namespace ferry::agent
