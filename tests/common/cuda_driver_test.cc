// The CUDA driver loader (src/common/cuda_driver.h) on whatever this host has: host memory is
// host memory whether or not a driver is found, and a driver that is not usable says why.
#include "common/cuda_driver.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ferry::cuda {
namespace {

TEST(CudaDriver, HostMemoryIsHostMemory) {
  std::vector<char> heap(4096);
  static char global[64];
  char stack[64] = {};
  for (const void* p : {static_cast<const void*>(heap.data()), static_cast<const void*>(global),
                        static_cast<const void*>(stack)}) {
    EXPECT_EQ(locate(p).kind, MemoryKind::kHost);
  }
  EXPECT_EQ(locate(nullptr).kind, MemoryKind::kHost);
}

TEST(CudaDriver, SaysWhetherItIsUsableAndWhyNot) {
  const DriverInfo& d = driver();
  EXPECT_FALSE(d.library.empty());
  if (d.usable) {
    EXPECT_TRUE(d.reason.empty()) << d.reason;
    EXPECT_GE(d.devices, 1);
    EXPECT_EQ(describe().rfind("usable: driver ", 0), 0u) << describe();
  } else {
    EXPECT_FALSE(d.reason.empty());
    EXPECT_EQ(d.devices, 0);
    EXPECT_EQ(describe(), "not usable: " + d.reason);
  }
  EXPECT_EQ(&driver(), &d) << "loaded once";
}

TEST(CudaDriver, ExportsNoDmaBufWithoutAUsableDriver) {
  if (driver().usable) GTEST_SKIP() << "a driver is usable here: gpu_memory_test exports device memory";
  std::vector<char> memory(8192);
  auto exported = exportDmaBuf(memory.data(), memory.size(), MemoryLocation{MemoryKind::kCuda, 0});
  ASSERT_FALSE(exported.isOk());
  EXPECT_EQ(exported.status().code(), StatusCode::kNotSupported);
  const std::string why = exported.status().message();
  EXPECT_NE(why.find("8192 bytes of cuda:0 as a dma-buf"), std::string::npos) << why;
  EXPECT_NE(why.find(driver().reason), std::string::npos) << why;
}

TEST(CudaDriver, SharesNoMemoryBetweenProcessesWithoutAUsableDriver) {
  if (driver().usable)
    GTEST_SKIP() << "a driver is usable here: the GPU suite's two-process test opens handles";
  std::vector<char> memory(8192);
  auto exported = exportIpc(memory.data(), MemoryLocation{MemoryKind::kCuda, 0});
  ASSERT_FALSE(exported.isOk());
  EXPECT_EQ(exported.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(exported.status().message().find("CUDA IPC of cuda:0 memory: "), std::string::npos)
      << exported.status().toString();
  EXPECT_NE(exported.status().message().find(driver().reason), std::string::npos)
      << exported.status().toString();
  auto opened = openIpc(IpcHandle{});
  ASSERT_FALSE(opened.isOk());
  EXPECT_NE(opened.status().message().find(driver().reason), std::string::npos) << opened.status().toString();
  closeIpc(IpcMapping{});  // nothing opened: nothing happens
}

TEST(CudaDriver, ThePeerMemoryModuleIsFoundWhereSysfsShowsItLoaded) {
  char dir[] = "/tmp/ferry-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::filesystem::path root(dir);
  EXPECT_EQ(peerMemoryModule(root.string()), "") << "nothing loaded";
  std::filesystem::create_directories(root / "kernel/mm/memory_peers/nv_mem");
  std::ofstream(root / "kernel/mm/memory_peers/nv_mem/version") << "1.3\n";
  EXPECT_EQ(peerMemoryModule(root.string()), "nv_peer_mem") << "the older module, by its peer memory client";
  std::filesystem::create_directories(root / "module/nvidia_peermem");
  EXPECT_EQ(peerMemoryModule(root.string()), "nvidia_peermem") << "the driver's own module first";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ferry::cuda
