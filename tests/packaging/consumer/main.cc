// Built against an installed ferry: prints ferry's version, lists the devices and opens soft_lo.
#include <ferry/common/version.h>
#include <ferry/devices.h>
#include <ferry/verbs/verbs.h>

#include <cstdio>

int main() {
  std::printf("ferry %s\n", ferry::version());
  auto devices = ferry::listDevices();
  if (!devices.isOk()) {
    std::fprintf(stderr, "consumer: %s\n", devices.status().toString().c_str());
    return 1;
  }
  for (const auto& d : *devices) std::printf("device %s (%s)\n", d.name.c_str(), d.provider.c_str());
  auto context = ferry::openDevice("soft_lo");
  if (!context.isOk()) {
    std::fprintf(stderr, "consumer: soft_lo: %s\n", context.status().toString().c_str());
    return 1;
  }
  auto attr = context->queryDevice();
  if (!attr.isOk()) return 1;
  std::printf("soft_lo max_qp %d\n", attr->maxQp);
  return 0;
}
