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
// `ferry store [--host ADDRESS] [--port N]`: serves the discovery store ferry://ADDRESS:N in the
// foreground until SIGINT or SIGTERM; prints "ferry store: listening on HOST:PORT" when ready.
// Returns 0 after a signal, 2 for bad options, 1 when the port cannot be bound.
int runStore(const std::vector<std::string>& args);
// `ferry objects serve|put|get|ls|mb|rb|rm ...`: the object store and its client (tools/ferry/objects.cc).
int runObjects(const std::vector<std::string>& args);

}  // namespace ferry::cli
