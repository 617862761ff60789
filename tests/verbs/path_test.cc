#include "ferry/verbs/path.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/json.h"
#include "ferry/verbs/verbs.h"

namespace ferry::verbs {
namespace {

Gid gidOf(const char* text) {
  Gid g;
  EXPECT_TRUE(Gid::parse(text, &g)) << text;
  return g;
}

// Every field set, and no field equal to its default or to its counterpart.
Path fullPath() {
  Path p;
  p.sgid = gidOf("::ffff:10.0.0.1");
  p.dgid = gidOf("fe80::202:c9ff:fe00:1");
  p.sgidIndex = 3;
  p.slid = 0x11;
  p.dlid = 0x22;
  p.sqpn = 0xabcdef;
  p.dqpn = 0x123456;
  p.sqpsn = 0xfffffe;
  p.dqpsn = 42;
  p.qkey = 0x80010000;
  p.pkeyIndex = 2;
  p.mtu = Mtu::k4096;
  p.retries = 6;
  p.rnrRetries = 5;
  p.minRnrTimer = 31;
  p.packetLifeTime = 18;
  p.srdatomic = 16;
  p.drdatomic = 8;
  p.portNum = 2;
  p.sl = 3;
  p.hasGrh = false;
  p.hopLimit = 255;
  p.trafficClass = 106;
  p.flowLabel = 0xfffff;
  p.rate = 7;
  return p;
}

TEST(PathTest, ReverseSwapsEverySourceWithItsDestination) {
  Path p = fullPath();
  Path r = p;
  r.reverse();
  EXPECT_EQ(r.sgid, p.dgid);
  EXPECT_EQ(r.dgid, p.sgid);
  EXPECT_EQ(r.slid, p.dlid);
  EXPECT_EQ(r.dlid, p.slid);
  EXPECT_EQ(r.sqpn, p.dqpn);
  EXPECT_EQ(r.dqpn, p.sqpn);
  EXPECT_EQ(r.sqpsn, p.dqpsn);
  EXPECT_EQ(r.dqpsn, p.sqpsn);
  EXPECT_EQ(r.srdatomic, p.drdatomic);
  EXPECT_EQ(r.drdatomic, p.srdatomic);
  // Fields that describe the connection as a whole stay.
  EXPECT_EQ(r.mtu, p.mtu);
  EXPECT_EQ(r.qkey, p.qkey);
  EXPECT_EQ(r.portNum, p.portNum);
  EXPECT_EQ(r.flowLabel, p.flowLabel);
  EXPECT_EQ(r.sgidIndex, p.sgidIndex);
}

TEST(PathTest, ReverseTwiceIsIdentity) {
  Path p = fullPath();
  Path r = p;
  r.reverse();
  EXPECT_NE(r, p);
  r.reverse();
  EXPECT_EQ(r, p);
}

TEST(PathTest, AhAttrDescribesThePeer) {
  Path p = fullPath();
  p.hasGrh = true;
  AhAttr ah = p.ahAttr();
  EXPECT_EQ(ah.dgid, p.dgid);
  EXPECT_EQ(ah.dlid, p.dlid);
  EXPECT_EQ(ah.flowLabel, p.flowLabel);
  EXPECT_EQ(ah.sgidIndex, p.sgidIndex);
  EXPECT_EQ(ah.hopLimit, p.hopLimit);
  EXPECT_EQ(ah.trafficClass, p.trafficClass);
  EXPECT_TRUE(ah.isGlobal);
  EXPECT_EQ(ah.sl, p.sl);
  EXPECT_EQ(ah.staticRate, p.rate);
  EXPECT_EQ(ah.portNum, p.portNum);
  p.hasGrh = false;
  EXPECT_FALSE(p.ahAttr().isGlobal);
}

TEST(PathTest, JsonRoundTripOfAFullyPopulatedPath) {
  Path p = fullPath();
  std::string text = p.toJson();
  EXPECT_EQ(text.rfind("{\"ferry_path\":1,", 0), 0u) << text;
  for (const char* name : {"sgid",      "dgid",        "sgid_index",    "slid",
                           "dlid",      "sqpn",        "dqpn",          "sqpsn",
                           "dqpsn",     "qkey",        "pkey_index",    "mtu",
                           "retries",   "rnr_retries", "min_rnr_timer", "packet_life_time",
                           "srdatomic", "drdatomic",   "port_num",      "sl",
                           "has_grh",   "hop_limit",   "traffic_class", "flow_label",
                           "rate"}) {
    EXPECT_NE(text.find(std::string("\"") + name + "\":"), std::string::npos)
        << name << " missing in " << text;
  }
  EXPECT_NE(text.find("\"sgid\":\"0000:0000:0000:0000:0000:ffff:0a00:0001\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"mtu\":5"), std::string::npos) << text;
  EXPECT_NE(text.find("\"has_grh\":false"), std::string::npos) << text;

  Result<Path> back = Path::fromJson(text);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(Path::fromJson(Path().toJson()).value(), Path());
}

TEST(PathTest, MissingOptionalFieldsKeepTheirDefaults) {
  Result<Path> p = Path::fromJson(R"({"ferry_path":1,"dqpn":77,"dgid":"::ffff:192.168.1.9"})");
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  Path expected;
  expected.dqpn = 77;
  expected.dgid = gidOf("::ffff:192.168.1.9");
  EXPECT_EQ(*p, expected);
}

TEST(PathTest, UnknownFieldsAreIgnored) {
  Path p = fullPath();
  std::string text = p.toJson();
  text.insert(text.size() - 1, R"(,"ecn":true,"future":{"list":[1,2,{"x":null}]},"note":"v1.1")");
  Result<Path> back = Path::fromJson(text);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(*back, p);
}

TEST(PathTest, VersionIsRequiredAndMustBeOne) {
  for (const char* text :
       {R"({"sqpn":1})", R"({"ferry_path":2,"sqpn":1})", R"({"ferry_path":0})", R"({"ferry_path":"1"})",
        R"({"ferry_path":1.5})", R"({"ferry_path":null})", R"({"ferry_path":true})"}) {
    Result<Path> p = Path::fromJson(text);
    ASSERT_FALSE(p.isOk()) << text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(p.status().message().find("ferry_path"), std::string::npos) << p.status().message();
  }
  EXPECT_TRUE(Path::fromJson(R"({"ferry_path":1,"sqpn":1,"sgid":"::1"})").isOk());
}

TEST(PathTest, APathMustNameAQpAndAnAddress) {
  for (const char* text : {R"({"ferry_path":1})", R"({"ferry_path":1,"dgid":"::1","mtu":3})",
                           R"({"ferry_path":1,"sqpn":5,"dqpn":6})"}) {
    Result<Path> p = Path::fromJson(text);
    ASSERT_FALSE(p.isOk()) << text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(p.status().message().find("names no"), std::string::npos) << p.status().message();
  }
  EXPECT_TRUE(Path::fromJson(R"({"ferry_path":1,"dqpn":5,"dlid":3})").isOk());
}

TEST(PathTest, MalformedDocumentsAreRefused) {
  for (const char* text : {"", "[]", "1", "\"path\"", "null", R"({"ferry_path":1)", R"({"ferry_path":1} x)",
                           R"({"ferry_path":1,"sqpn":1,"sqpn":2})"}) {
    Result<Path> p = Path::fromJson(text);
    ASSERT_FALSE(p.isOk()) << text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

// fullPath()'s JSON with one member replaced by raw JSON text.
std::string withField(const std::string& name, const std::string& rawValue) {
  json::Value doc = json::parse(fullPath().toJson()).value();
  doc.set(name, json::parse(rawValue).value());
  return json::serialize(doc);
}

TEST(PathTest, EveryOutOfRangeOrMistypedFieldIsRefusedByName) {
  struct Case {
    const char* field;
    const char* bad;
  };
  const Case cases[] = {
      {"sqpn", "16777216"},
      {"dqpn", "16777216"},
      {"sqpsn", "16777216"},
      {"dqpsn", "4294967295"},
      {"sqpn", "-1"},
      {"sqpn", "1.5"},
      {"sqpn", "\"1\""},
      {"sqpn", "null"},
      {"dqpn", "1e30"},
      {"mtu", "0"},
      {"mtu", "6"},
      {"mtu", "\"4096\""},
      {"retries", "8"},
      {"rnr_retries", "8"},
      {"min_rnr_timer", "32"},
      {"packet_life_time", "32"},
      {"qkey", "4294967296"},
      {"qkey", "-1"},
      {"flow_label", "1048576"},
      {"sgid_index", "256"},
      {"slid", "65536"},
      {"dlid", "65536"},
      {"pkey_index", "65536"},
      {"srdatomic", "256"},
      {"drdatomic", "256"},
      {"port_num", "256"},
      {"sl", "256"},
      {"hop_limit", "256"},
      {"traffic_class", "256"},
      {"rate", "256"},
      {"has_grh", "1"},
      {"has_grh", "\"true\""},
      {"sgid", "5"},
      {"sgid", "\"not-a-gid\""},
      {"dgid", "\"10.0.0.1\""},
      {"dgid", "[]"},
      {"retries", "{}"},
      {"rate", "9223372036854775807"},
  };
  for (const Case& c : cases) {
    std::string text = withField(c.field, c.bad);
    Result<Path> p = Path::fromJson(text);
    ASSERT_FALSE(p.isOk()) << c.field << " = " << c.bad << " was accepted";
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(std::string("\"") + c.field + "\""), std::string::npos)
        << c.field << " = " << c.bad << ": " << p.status().message();
  }
}

TEST(PathTest, LargestValidValuesAreAccepted) {
  const std::pair<const char*, const char*> cases[] = {
      {"sqpn", "16777215"},    {"dqpsn", "16777215"},      {"mtu", "1"},           {"retries", "7"},
      {"min_rnr_timer", "31"}, {"packet_life_time", "31"}, {"qkey", "4294967295"}, {"flow_label", "1048575"},
      {"slid", "65535"},       {"port_num", "255"},        {"sqpn", "0"},          {"sqpn", "7.0"},
  };
  for (const auto& [field, value] : cases) {
    Result<Path> p = Path::fromJson(withField(field, value));
    EXPECT_TRUE(p.isOk()) << field << " = " << value << ": " << p.status().toString();
  }
  EXPECT_EQ(Path::fromJson(withField("qkey", "4294967295"))->qkey, 0xffffffffu);
  EXPECT_EQ(Path::fromJson(withField("mtu", "1"))->mtu, Mtu::k256);
}

// ---- GIDs as paths carry them: text that the other side parses back ----

TEST(GidTextTest, ToStringIsEightGroupsOfFourLowercaseHexDigits) {
  Gid g;
  g.raw = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0x00, 0x00, 0x01};
  EXPECT_EQ(g.toString(), "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
  EXPECT_EQ(Gid{}.toString(), "0000:0000:0000:0000:0000:0000:0000:0000");
  EXPECT_TRUE(Gid{}.isZero());
  EXPECT_FALSE(g.isZero());
  Gid back;
  ASSERT_TRUE(Gid::parse(g.toString(), &back));
  EXPECT_EQ(back, g);
}

TEST(GidTextTest, ParsesCompressedAndIpv4MappedForms) {
  Gid full = gidOf("fe80:0000:0000:0000:0202:c9ff:fe00:0001");
  EXPECT_EQ(gidOf("fe80::202:c9ff:fe00:1"), full);
  EXPECT_EQ(gidOf("FE80::202:C9FF:FE00:1"), full);
  Gid mapped = gidOf("::ffff:127.0.0.1");
  EXPECT_EQ(mapped.toString(), "0000:0000:0000:0000:0000:ffff:7f00:0001");
  EXPECT_EQ(gidOf("::ffff:7f00:1"), mapped);
  EXPECT_TRUE(gidOf("::").isZero());
}

TEST(GidTextTest, RefusesOtherText) {
  Gid out = gidOf("fe80::1");
  const Gid before = out;
  for (const std::string& text : {std::string(""), std::string("127.0.0.1"), std::string("fe80::1::2"),
                                  std::string("1:2:3:4:5:6:7:8:9"), std::string("fe80::1%eth0"),
                                  std::string("[fe80::1]"), std::string(" fe80::1"), std::string("fe80::g"),
                                  std::string("fe80::1\0junk", 12), std::string("12345::")}) {
    EXPECT_FALSE(Gid::parse(text, &out)) << text;
  }
  EXPECT_EQ(out, before) << "a refused parse must leave the output alone";
  EXPECT_FALSE(Gid::parse("fe80::1", nullptr));
}

// ---- fillPath, over a device model that answers the three queries it makes ----

struct DeviceModel {
  int maxQpRdAtom = 16;
  int maxQpInitRdAtom = 16;
  Mtu activeMtu = Mtu::k4096;
  std::vector<Gid> gids;
  bool deviceFails = false;
};

class ModelContext : public ContextImpl {
 public:
  explicit ModelContext(DeviceModel model) : model_(std::move(model)) {
    info_.name = "model0";
    info_.provider = "model";
  }
  const DeviceInfo& info() const override { return info_; }
  Result<DeviceAttr> queryDevice() override {
    if (model_.deviceFails) return Status(StatusCode::kUnavailable, "device gone");
    DeviceAttr attr;
    attr.maxQpRdAtom = model_.maxQpRdAtom;
    attr.maxQpInitRdAtom = model_.maxQpInitRdAtom;
    return attr;
  }
  Result<PortAttr> queryPort(uint8_t portNum) override {
    if (portNum != 1) return invalidArgument("no port " + std::to_string(portNum));
    PortAttr attr;
    attr.state = PortState::kActive;
    attr.activeMtu = model_.activeMtu;
    attr.gidTblLen = static_cast<int>(model_.gids.size());
    return attr;
  }
  Result<Gid> queryGid(uint8_t portNum, int index) override {
    if (portNum != 1) return invalidArgument("no port " + std::to_string(portNum));
    if (index < 0 || index >= static_cast<int>(model_.gids.size()))
      return invalidArgument("GID index past the table");
    return model_.gids[static_cast<size_t>(index)];
  }
  Result<std::shared_ptr<PdImpl>> allocPd() override { return notSupported("model device"); }
  Result<std::shared_ptr<CompChannelImpl>> createCompChannel() override {
    return notSupported("model device");
  }
  Result<std::shared_ptr<CqImpl>> createCq(int, std::shared_ptr<CompChannelImpl>, void*) override {
    return notSupported("model device");
  }
  Result<AsyncEvent> getAsyncEvent(int) override { return notSupported("model device"); }
  int asyncFd() const override { return -1; }
  void close() override {}

 private:
  DeviceModel model_;
  DeviceInfo info_;
};

class ModelQp : public QpImpl {
 public:
  explicit ModelQp(uint32_t qpn) : qpn_(qpn) {}
  uint32_t qpNum() const override { return qpn_; }
  QpType type() const override { return QpType::kRc; }
  Status modify(const QpAttr&, uint32_t) override { return notSupported("model QP"); }
  Result<QpAttr> query() override { return notSupported("model QP"); }
  QpCap cap() const override { return {}; }
  Status postSend(std::span<const SendWr>, size_t*) override { return notSupported("model QP"); }
  Status postRecv(std::span<const RecvWr>, size_t*) override { return notSupported("model QP"); }
  void close() override {}

 private:
  uint32_t qpn_;
};

Context modelContext(DeviceModel model) { return Context(std::make_shared<ModelContext>(std::move(model))); }
QueuePair modelQp(uint32_t qpn) { return QueuePair(std::make_shared<ModelQp>(qpn)); }

TEST(FillPathTest, FillsTheLocalHalfFromTheDevice) {
  Gid gid0 = gidOf("fe80::1");
  Gid gid1 = gidOf("::ffff:10.1.2.3");
  Context ctx =
      modelContext({.maxQpRdAtom = 8, .maxQpInitRdAtom = 4, .activeMtu = Mtu::k2048, .gids = {gid0, gid1}});
  QueuePair qp = modelQp(0x1234);
  Path p;
  p.sgidIndex = 1;
  p.qkey = 0x11111111;
  ASSERT_TRUE(fillPath(ctx, qp, p).isOk());
  EXPECT_EQ(p.sqpn, 0x1234u);
  EXPECT_EQ(p.sgid, gid1);
  EXPECT_EQ(p.mtu, Mtu::k2048);
  EXPECT_EQ(p.srdatomic, 4);  // what this side may issue
  EXPECT_EQ(p.drdatomic, 8);  // what this side accepts
  EXPECT_LT(p.sqpsn, 1u << 24);
  // Nothing describing the peer, nor the caller's own settings, changed.
  EXPECT_EQ(p.dqpn, 0u);
  EXPECT_TRUE(p.dgid.isZero());
  EXPECT_EQ(p.qkey, 0x11111111u);
}

TEST(FillPathTest, StartingPsnIsRandom) {
  Context ctx = modelContext({.gids = {gidOf("fe80::1")}});
  QueuePair qp = modelQp(7);
  std::set<uint32_t> psns;
  for (int i = 0; i < 8; ++i) {
    Path p;
    ASSERT_TRUE(fillPath(ctx, qp, p).isOk());
    EXPECT_LT(p.sqpsn, 1u << 24);
    psns.insert(p.sqpsn);
  }
  EXPECT_GT(psns.size(), 1u);
}

TEST(FillPathTest, ReadAtomicDepthsAreClampedToOneThrough255) {
  QueuePair qp = modelQp(7);
  Path p;
  ASSERT_TRUE(
      fillPath(modelContext({.maxQpRdAtom = 0, .maxQpInitRdAtom = -3, .gids = {Gid{}}}), qp, p).isOk());
  EXPECT_EQ(p.srdatomic, 1);
  EXPECT_EQ(p.drdatomic, 1);
  ASSERT_TRUE(
      fillPath(modelContext({.maxQpRdAtom = 100000, .maxQpInitRdAtom = 256, .gids = {Gid{}}}), qp, p).isOk());
  EXPECT_EQ(p.srdatomic, 255);
  EXPECT_EQ(p.drdatomic, 255);
}

TEST(FillPathTest, ReturnsTheFirstErrorAndLeavesThePathAlone) {
  QueuePair qp = modelQp(7);
  Path p = fullPath();
  p.portNum = 1;
  Path before = p;

  p.sgidIndex = 5;  // past a one-entry table
  before.sgidIndex = 5;
  Status s = fillPath(modelContext({.gids = {Gid{}}}), qp, p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_EQ(p, before);

  p.sgidIndex = 0;
  before.sgidIndex = 0;
  s = fillPath(modelContext({.gids = {Gid{}}, .deviceFails = true}), qp, p);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.toString();
  EXPECT_EQ(p, before);

  p.portNum = 2;  // no such port
  before.portNum = 2;
  s = fillPath(modelContext({.gids = {Gid{}}}), qp, p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_EQ(p, before);

  EXPECT_EQ(fillPath(Context(), qp, p).code(), StatusCode::kClosed);
  EXPECT_EQ(fillPath(modelContext({.gids = {Gid{}}}), QueuePair(), p).code(), StatusCode::kClosed);
  EXPECT_EQ(p, before);
}

// The exchange without a connection manager, done in one process. Each side sends paths in its own
// terms ("s" = the sender) and reverses what it receives: A fills its half and sends it; B reverses
// it (so "d" names A), fills its own half and sends the whole path back; A reverses that. Each side then
// holds a path whose "s" fields name itself and whose "d" fields name the peer, and the two agree on every
// number both must share.
TEST(FillPathTest, TwoSidedExchangeWithoutConnectionManager) {
  Gid gidA = gidOf("::ffff:10.0.0.1");
  Gid gidB = gidOf("::ffff:10.0.0.2");
  // Two different devices: A can issue 16 reads and accept 8; B can issue 4 and accept 2.
  Context ctxA =
      modelContext({.maxQpRdAtom = 8, .maxQpInitRdAtom = 16, .activeMtu = Mtu::k4096, .gids = {gidA}});
  Context ctxB =
      modelContext({.maxQpRdAtom = 2, .maxQpInitRdAtom = 4, .activeMtu = Mtu::k1024, .gids = {gidB}});
  QueuePair qpA = modelQp(0x000a01);
  QueuePair qpB = modelQp(0x000b02);

  Path a;
  ASSERT_TRUE(fillPath(ctxA, qpA, a).isOk());
  std::string toB = a.toJson();

  Result<Path> atB = Path::fromJson(toB);
  ASSERT_TRUE(atB.isOk()) << atB.status().toString();
  Path b = *atB;
  b.reverse();
  ASSERT_TRUE(fillPath(ctxB, qpB, b).isOk());
  std::string toA = b.toJson();

  Result<Path> atA = Path::fromJson(toA);
  ASSERT_TRUE(atA.isOk()) << atA.status().toString();
  Path finalA = *atA;
  finalA.reverse();

  // A's view.
  EXPECT_EQ(finalA.sqpn, 0x000a01u);
  EXPECT_EQ(finalA.dqpn, 0x000b02u);
  EXPECT_EQ(finalA.sgid, gidA);
  EXPECT_EQ(finalA.dgid, gidB);
  EXPECT_EQ(finalA.sqpsn, a.sqpsn);  // the PSN A announced is the one A keeps
  // B's view.
  EXPECT_EQ(b.sqpn, 0x000b02u);
  EXPECT_EQ(b.dqpn, 0x000a01u);
  EXPECT_EQ(b.sgid, gidB);
  EXPECT_EQ(b.dgid, gidA);
  // The two line up: what one sends is what the other expects.
  EXPECT_EQ(finalA.sqpsn, b.dqpsn);
  EXPECT_EQ(finalA.dqpsn, b.sqpsn);
  EXPECT_EQ(finalA.mtu, b.mtu);
  EXPECT_EQ(finalA.mtu, Mtu::k1024);  // the smaller of the two ports
  // Outstanding reads: each requester issues at most what the other responder accepts, and no
  // more than its own device allows.
  EXPECT_EQ(finalA.srdatomic, b.drdatomic);
  EXPECT_EQ(b.srdatomic, finalA.drdatomic);
  EXPECT_EQ(finalA.srdatomic, 2);  // min(A issues 16, B accepts 2)
  EXPECT_EQ(b.srdatomic, 4);       // min(B issues 4, A accepts 8)
  EXPECT_LE(finalA.drdatomic, 8);
  EXPECT_LE(b.drdatomic, 2);
  // The address vectors point at each other.
  EXPECT_EQ(finalA.ahAttr().dgid, gidB);
  EXPECT_EQ(b.ahAttr().dgid, gidA);
}

}  // namespace
}  // namespace ferry::verbs
