// The FERRY_* table: every variable's valid and refused values, check() naming the variable, the
// typed readers, and the layers that open devices refusing to start on a bad value.
#include "ferry/common/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "ferry/devices.h"

namespace ferry::config {
namespace {

// Sets a variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const Setting& settingOf(const std::vector<Setting>& all, const std::string& name) {
  for (const Setting& s : all) {
    if (s.variable->name == name) return s;
  }
  ADD_FAILURE() << name << " is not in the table";
  static Setting none;
  return none;
}

TEST(ConfigTest, TableNamesEachVariableOnceWithEverythingFilledIn) {
  std::set<std::string> names;
  for (const Variable& v : variables()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_EQ(std::string(v.name).rfind("FERRY_", 0), 0u) << v.name;
    EXPECT_GT(std::string(v.meaning).size(), 10u) << v.name;
    EXPECT_FALSE(std::string(v.defaultText).empty()) << v.name;
    EXPECT_FALSE(std::string(v.validValues).empty()) << v.name;
    EXPECT_NE(v.parse, nullptr) << v.name;
  }
  for (const char* expected : {"FERRY_DEVICES", "FERRY_SOFT_SAME_HOST", "FERRY_SOFT_RING_BYTES",
                               "FERRY_SOFT_SPIN_US", "FERRY_IB_GID_INDEX", "FERRY_IBVERBS_LIBRARY",
                               "FERRY_LOG_LEVEL", "FERRY_STORE", "FERRY_AGENT_SECRET", "FERRY_AGENT_LANES"}) {
    EXPECT_TRUE(names.count(expected)) << expected;
  }
}

struct Case {
  const char* name;
  const char* value;
  bool valid;
};

TEST(ConfigTest, EachVariableTakesItsValuesAndRefusesOthersNamingItself) {
  const Case cases[] = {
      {"FERRY_DEVICES", "soft_lo", true},
      {"FERRY_DEVICES", "soft_lo, rxe0", true},
      {"FERRY_DEVICES", ",,", false},
      {"FERRY_DEVICES", "soft lo", false},
      {"FERRY_SOFT_SAME_HOST", "0", true},
      {"FERRY_SOFT_SAME_HOST", "ring", true},
      {"FERRY_SOFT_SAME_HOST", "auto", true},
      {"FERRY_SOFT_SAME_HOST", "yes", false},
      {"FERRY_SOFT_RING_BYTES", "1M", true},
      {"FERRY_SOFT_RING_BYTES", "65536", true},
      {"FERRY_SOFT_RING_BYTES", "1K", false},
      {"FERRY_SOFT_RING_BYTES", "1G", false},
      {"FERRY_SOFT_RING_BYTES", "lots", false},
      {"FERRY_SOFT_SPIN_US", "0", true},
      {"FERRY_SOFT_SPIN_US", "10000", true},
      {"FERRY_SOFT_SPIN_US", "10001", false},
      {"FERRY_SOFT_SPIN_US", "-1", false},
      {"FERRY_SOFT_SPIN_US", "2.5", false},
      {"FERRY_IB_GID_INDEX", "3", true},
      {"FERRY_IB_GID_INDEX", "256", false},
      {"FERRY_LOG_LEVEL", "debug", true},
      {"FERRY_LOG_LEVEL", "verbose", false},
      {"FERRY_LOG_LEVEL", "WARN", false},
      {"FERRY_STORE", "redis://127.0.0.1:6379", true},
      {"FERRY_STORE", "127.0.0.1:6379", false},
      {"FERRY_STORE", "http://x", false},
      {"FERRY_AGENT_LANES", "rma=tcp", true},
      {"FERRY_AGENT_LANES", "messages=same_host,rma=rdma", true},
      {"FERRY_AGENT_LANES", "rma", false},
      {"FERRY_AGENT_LANES", "bulk=tcp", false},
      {"FERRY_AGENT_LANES", "rma=carrier", false},
      {"FERRY_AGENT_SECRET", "s3cret", true},
      {"FERRY_IBVERBS_LIBRARY", "/opt/lib/libibverbs.so", true},
  };
  for (const Case& c : cases) {
    ScopedEnv env(c.name, c.value);
    Status st = check();
    const std::vector<Setting> all = settings();
    const Setting& s = settingOf(all, c.name);
    EXPECT_TRUE(s.set);
    EXPECT_EQ(s.raw, c.value);
    if (c.valid) {
      EXPECT_TRUE(st.isOk()) << c.name << "=" << c.value << ": " << st.toString();
      EXPECT_TRUE(s.error.empty()) << s.error;
    } else {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.name << "=" << c.value;
      EXPECT_NE(st.message().find(c.name), std::string::npos) << st.message();
      EXPECT_FALSE(s.error.empty());
      EXPECT_EQ(s.effective, s.variable->defaultText);
    }
  }
  EXPECT_TRUE(check().isOk()) << "every variable restored";
}

TEST(ConfigTest, EmptyIsUnset) {
  ScopedEnv env("FERRY_SOFT_SPIN_US", "");
  EXPECT_TRUE(check().isOk());
  EXPECT_FALSE(softSpinUs().has_value());
  const std::vector<Setting> all = settings();
  EXPECT_FALSE(settingOf(all, "FERRY_SOFT_SPIN_US").set);
}

TEST(ConfigTest, TypedReadersGiveTheEffectiveValue) {
  {
    ScopedEnv env("FERRY_DEVICES", " soft_lo ,rxe0");
    ASSERT_TRUE(devices().has_value());
    EXPECT_EQ(*devices(), (std::vector<std::string>{"soft_lo", "rxe0"}));
  }
  EXPECT_FALSE(devices().has_value());
  {
    ScopedEnv env("FERRY_SOFT_SAME_HOST", "ring");
    EXPECT_EQ(softSameHost(), SameHost::kRingOnly);
  }
  {
    ScopedEnv env("FERRY_SOFT_SAME_HOST", "0");
    EXPECT_EQ(softSameHost(), SameHost::kOff);
  }
  {
    ScopedEnv env("FERRY_SOFT_SAME_HOST", "nonsense");
    EXPECT_EQ(softSameHost(), SameHost::kAuto) << "an invalid value reads as unset";
  }
  {
    ScopedEnv env("FERRY_SOFT_RING_BYTES", "2M");
    EXPECT_EQ(softRingBytes(), uint64_t{2} << 20);
  }
  {
    ScopedEnv env("FERRY_IB_GID_INDEX", "7");
    EXPECT_EQ(ibGidIndex(), 7);
  }
  {
    ScopedEnv env("FERRY_LOG_LEVEL", "debug");
    EXPECT_EQ(logLevel(), 3);
  }
  {
    ScopedEnv env("FERRY_AGENT_SECRET", "k1");
    EXPECT_EQ(agentSecret(), "k1");
    const std::vector<Setting> all = settings();
    EXPECT_EQ(settingOf(all, "FERRY_AGENT_SECRET").effective.find("k1"), std::string::npos)
        << "the secret is never shown";
  }
  EXPECT_EQ(ibverbsLibrary(), "libibverbs.so.1");
}

TEST(ConfigTest, OpeningDevicesRefusesABadValue) {
  ScopedEnv env("FERRY_SOFT_RING_BYTES", "huge");
  auto listed = listDevices();
  ASSERT_FALSE(listed.isOk());
  EXPECT_EQ(listed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(listed.status().message().find("FERRY_SOFT_RING_BYTES=huge"), std::string::npos);
  auto opened = openDevice("soft_lo");
  ASSERT_FALSE(opened.isOk());
  EXPECT_NE(opened.status().message().find("FERRY_SOFT_RING_BYTES"), std::string::npos);
}

TEST(ConfigTest, ByteSizes) {
  EXPECT_EQ(*parseByteSize("4096"), 4096u);
  EXPECT_EQ(*parseByteSize("4K"), 4096u);
  EXPECT_EQ(*parseByteSize("16M"), uint64_t{16} << 20);
  EXPECT_EQ(*parseByteSize("1GiB"), uint64_t{1} << 30);
  EXPECT_EQ(*parseByteSize("2mb"), uint64_t{2} << 20);
  EXPECT_EQ(*parseByteSize("8B"), 8u);
  for (const char* bad : {"", "K", "0", "-1", "1.5M", "1T", "4 K", "99999999999999999999", "17179869184G"}) {
    EXPECT_FALSE(parseByteSize(bad).isOk()) << bad;
  }
}

const UnknownVariable* unknownNamed(const std::vector<UnknownVariable>& all, const std::string& name) {
  for (const UnknownVariable& u : all) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

TEST(ConfigTest, AMisspeltVariableIsReportedWithTheNearestName) {
  ScopedEnv typo("FERRY_DEVICE", "soft_lo");
  ScopedEnv swapped("FERRY_LOG_LEVLE", "debug");
  ScopedEnv far("FERRY_NOTHING_LIKE_IT", "1");
  ScopedEnv empty("FERRY_SOFT_SPINUS", "");  // present though empty: still a misspelling
  ScopedEnv known("FERRY_DEVICES", "soft_lo");
  const std::vector<UnknownVariable> unknown = unknownVariables();

  const UnknownVariable* device = unknownNamed(unknown, "FERRY_DEVICE");
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->suggestion, "FERRY_DEVICES");
  EXPECT_EQ(device->warning(),
            "FERRY_DEVICE is not a ferry variable (did you mean FERRY_DEVICES?); "
            "ferry info --config lists them");
  ASSERT_NE(unknownNamed(unknown, "FERRY_LOG_LEVLE"), nullptr);
  EXPECT_EQ(unknownNamed(unknown, "FERRY_LOG_LEVLE")->suggestion, "FERRY_LOG_LEVEL");
  ASSERT_NE(unknownNamed(unknown, "FERRY_SOFT_SPINUS"), nullptr);
  EXPECT_EQ(unknownNamed(unknown, "FERRY_SOFT_SPINUS")->suggestion, "FERRY_SOFT_SPIN_US");
  const UnknownVariable* nothing = unknownNamed(unknown, "FERRY_NOTHING_LIKE_IT");
  ASSERT_NE(nothing, nullptr);
  EXPECT_EQ(nothing->suggestion, "");
  EXPECT_EQ(nothing->warning(),
            "FERRY_NOTHING_LIKE_IT is not a ferry variable; ferry info --config lists them");
  EXPECT_EQ(unknownNamed(unknown, "FERRY_DEVICES"), nullptr) << "a variable of the table is known";
  for (size_t i = 1; i < unknown.size(); ++i) EXPECT_LT(unknown[i - 1].name, unknown[i].name);
}

TEST(ConfigTest, ARenamedVariableIsReadUnderItsFormerNameAndReported) {
  {
    ScopedEnv former("FERRY_SOFT_TCP_LANE", "64K");
    EXPECT_EQ(softTcpStripeMinBytes(), 64u * 1024)
        << "the former name is read while the current one is unset";
    const std::vector<UnknownVariable> unknown = unknownVariables();
    const UnknownVariable* u = unknownNamed(unknown, "FERRY_SOFT_TCP_LANE");
    ASSERT_NE(u, nullptr);
    EXPECT_TRUE(u->renamed);
    EXPECT_EQ(u->suggestion, "FERRY_SOFT_TCP_STRIPE");
    EXPECT_EQ(u->warning(),
              "FERRY_SOFT_TCP_LANE is the former name of FERRY_SOFT_TCP_STRIPE, read while that is unset; "
              "set FERRY_SOFT_TCP_STRIPE instead");
    ScopedEnv current("FERRY_SOFT_TCP_STRIPE", "0");
    EXPECT_EQ(softTcpStripeMinBytes(), 0u) << "the current name wins";
  }
  ScopedEnv bad("FERRY_SOFT_TCP_LANE", "sideways");
  EXPECT_FALSE(check().isOk()) << "a bad value under the former name is refused as under the current one";
}

TEST(ConfigTest, TheHarnessVariablesAreReservedNotUnknown) {
  std::set<std::string> table;
  for (const Variable& v : variables()) table.insert(v.name);
  std::vector<std::unique_ptr<ScopedEnv>> set;
  for (const ReservedVariable& r : reservedVariables()) {
    EXPECT_EQ(std::string(r.name).rfind("FERRY_", 0), 0u) << r.name;
    EXPECT_FALSE(table.count(r.name)) << r.name << " is both configuration and reserved";
    EXPECT_FALSE(std::string(r.readBy).empty()) << r.name;
    set.push_back(std::make_unique<ScopedEnv>(r.name, "1"));
  }
  for (const char* harness :
       {"FERRY_TEST_BIN_DIR", "FERRY_REQUIRE_PROVIDERS", "FERRY_REQUIRE_STORES", "FERRY_REQUIRE_RDMA_VM",
        "FERRY_AGENT_TEST_DEVICE", "FERRY_TEST_SHARED_MEMORY", "FERRY_CAMPAIGN_TRIALS", "FERRY_VENV"}) {
    EXPECT_EQ(unknownNamed(unknownVariables(), harness), nullptr) << harness << " reported as unknown";
  }
  for (const UnknownVariable& u : unknownVariables()) {
    EXPECT_FALSE(table.count(u.name)) << u.name;
  }
}

}  // namespace
}  // namespace ferry::config
