// Subcommands of the `ferry` command-line tool. Each takes the words after its name and returns the
// exit code: 0 when done, 1 when it failed, 2 for a bad command line (cli_args.h).
#pragma once

#include <string>
#include <vector>

namespace ferry::cli {

// `ferry info [--device NAME] [--json]`: providers, devices, ports, limits and GIDs (like
// ibv_devinfo -v); `--config`: every FERRY_* variable; `--peer ALIAS --store URL`: the lanes to that
// agent first, then this host's agent (the devices after them only with --devices or --device).
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
