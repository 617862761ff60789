// Subcommands of the `ferry` command-line tool.
#pragma once

#include <string>
#include <vector>

namespace ferry::cli {

// `ferry info [--device NAME]`: providers, devices, ports, limits and GIDs (like ibv_devinfo -v).
int runInfo(const std::vector<std::string>& args);
// `ferry demo [--device NAME] [--size BYTES]`: two processes move data with RDMA WRITE and READ
// over one RC queue pair, verify it byte for byte and print the throughput.
int runDemo(const std::vector<std::string>& args, const std::string& self);

}  // namespace ferry::cli
