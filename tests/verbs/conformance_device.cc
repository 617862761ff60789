// Devices: listing (and FERRY_DEVICES's filter), opening, and what a device reports of itself
// (device and port attributes, GIDs, its address).
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "verbs/conformance.h"

namespace ferry::test {
namespace {

TEST_P(VerbsConformance, DeviceIsListedAndOpens) {
  ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
  std::set<std::string> names;
  const v::DeviceInfo* found = nullptr;
  for (const v::DeviceInfo& device : devices) {
    EXPECT_TRUE(names.insert(device.name).second) << "device listed twice: " << device.name;
    if (device.name == providerPath().device) found = &device;
  }
  ASSERT_NE(found, nullptr);
  EXPECT_FALSE(found->provider.empty());
  EXPECT_FALSE(found->transport.empty());

  bool providerListed = false;
  for (const ProviderInfo& provider : listProviders()) {
    if (provider.name != found->provider) continue;
    providerListed = true;
    EXPECT_TRUE(provider.available) << provider.reason;
    EXPECT_TRUE(provider.reason.empty()) << provider.reason;
  }
  EXPECT_TRUE(providerListed) << "provider " << found->provider << " missing from listProviders()";

  ASSERT_OK_AND_ASSIGN(v::Context context, openDevice(providerPath().device));
  EXPECT_EQ(context.info().name, providerPath().device);
  EXPECT_EQ(context.info().provider, found->provider);
  EXPECT_EQ(context.info().transport, found->transport);
}

TEST_P(VerbsConformance, FerryDevicesFiltersTheList) {
  const std::string device = providerPath().device;
  ScopedEnv env;
  auto listed = [](std::vector<v::DeviceInfo> devices, const std::string& name) {
    return std::any_of(devices.begin(), devices.end(),
                       [&](const v::DeviceInfo& d) { return d.name == name; });
  };

  env.set("FERRY_DEVICES", device);
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0].name, device);
    EXPECT_OK(openDevice(device));
  }
  env.set("FERRY_DEVICES", "ferry_no_such_device," + device);
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_EQ(devices.size(), 1u);
    EXPECT_TRUE(listed(devices, device));
  }
  env.set("FERRY_DEVICES", "ferry_no_such_device");
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_TRUE(devices.empty()) << devices.size() << " devices visible, first " << devices[0].name;
    EXPECT_TRUE(hasCode(openDevice(device).status(), StatusCode::kNotFound))
        << "a hidden device must not open";
  }
  env.set("FERRY_DEVICES", "");
  {
    ASSERT_OK_AND_ASSIGN(auto devices, listDevices());
    EXPECT_TRUE(listed(devices, device)) << "an empty FERRY_DEVICES shows every device";
  }
}

TEST_P(VerbsConformance, OpenUnknownDeviceIsNotFound) {
  EXPECT_TRUE(hasCode(openDevice("ferry_no_such_device").status(), StatusCode::kNotFound));
  EXPECT_TRUE(hasCode(openDevice("").status(), StatusCode::kNotFound));
}

TEST_P(VerbsConformance, QueryDevicePortAndGid) {
  ASSERT_OK_AND_ASSIGN(v::Context context, openContext());
  ASSERT_OK_AND_ASSIGN(v::DeviceAttr device, context.queryDevice());
  EXPECT_GE(device.physPortCnt, 1);
  EXPECT_GT(device.maxQp, 0);
  EXPECT_GE(device.maxQpWr, 16);
  EXPECT_GE(device.maxSge, 1);
  EXPECT_GE(device.maxSgeRd, 1);
  EXPECT_GT(device.maxCq, 0);
  EXPECT_GE(device.maxCqe, 16);
  EXPECT_GT(device.maxMr, 0);
  EXPECT_GT(device.maxPd, 0);
  EXPECT_GE(device.maxMrSize, 64 * kMiB);
  EXPECT_GE(device.maxQpRdAtom, 1);
  EXPECT_GE(device.maxQpInitRdAtom, 1);

  ASSERT_OK_AND_ASSIGN(v::PortAttr port, context.queryPort(1));
  EXPECT_EQ(port.state, v::PortState::kActive);
  EXPECT_GE(port.gidTblLen, 1);
  EXPECT_LE(static_cast<int>(port.activeMtu), static_cast<int>(port.maxMtu));
  EXPECT_GE(port.maxMsgSz, 1 * kMiB);  // rxe: 8 MiB; the software devices: 2 GiB
  EXPECT_TRUE(hasCode(context.queryPort(0).status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(hasCode(context.queryPort(device.physPortCnt + 1).status(), StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(v::Gid gid0, context.queryGid(1, 0));
  EXPECT_FALSE(gid0.isZero());
  v::Gid parsed;
  ASSERT_TRUE(v::Gid::parse(gid0.toString(), &parsed)) << gid0.toString();
  EXPECT_EQ(parsed, gid0);
  EXPECT_TRUE(hasCode(context.queryGid(1, port.gidTblLen).status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(hasCode(context.queryGid(1, -1).status(), StatusCode::kInvalidArgument));

  // What the device says it is (DeviceInfo), which the layers above ask instead of its provider.
  const v::DeviceInfo& info = context.info();
  if (info.ports != 0) EXPECT_EQ(info.ports, device.physPortCnt);
  if (info.addressedByContext) {  // one GID per context: its address, IPv4-mapped
    EXPECT_EQ(port.gidTblLen, 1);
    in_addr mapped{};
    ASSERT_EQ(inet_pton(AF_INET, info.address.c_str(), &mapped), 1) << info.address;
    EXPECT_EQ(std::memcmp(gid0.raw.data() + 12, &mapped, 4), 0) << gid0.toString();
  }
  EXPECT_LE(device.localCaAckDelay, 31);  // an IBA timer code

  // A device bound to an IPv4 address carries it as an IPv4-mapped GID.
  in_addr address{};
  if (inet_pton(AF_INET, context.info().address.c_str(), &address) == 1) {
    bool mapped = false;
    for (int i = 0; i < std::min(port.gidTblLen, 16) && !mapped; ++i) {
      Result<v::Gid> gid = context.queryGid(1, i);
      if (!gid.isOk()) continue;
      const auto& raw = gid->raw;
      mapped = raw[10] == 0xff && raw[11] == 0xff && std::memcmp(&raw[12], &address, 4) == 0;
    }
    EXPECT_TRUE(mapped) << "no GID of port 1 holds " << context.info().address;
  }
}

}  // namespace
}  // namespace ferry::test
