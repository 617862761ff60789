// ferry: the command-line tool. `ferry help` lists the subcommands.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "cli_args.h"
#include "commands.h"
#include "ferry/common/version.h"

namespace {

std::string help() {
  ferry::cli::CommandHelp h{
      .usage = {"ferry COMMAND [options]", "ferry COMMAND --help"},
      .commands = {{"info",
                    "providers, devices, ports, limits and GIDs; --config: every FERRY_* variable; "
                    "--peer ALIAS --store URL: the lanes to that agent and why"},
                   {"demo",
                    "two processes move data with RDMA WRITE and READ, verify it byte for byte and "
                    "print the throughput"},
                   {"bench",
                    "perftest-style bandwidth and latency of WRITE, READ, SEND, WRITE_WITH_IMM and "
                    "atomics between two processes"},
                   {"store", "serve the discovery store ferry://ADDRESS:N until SIGINT or SIGTERM"},
                   {"objects",
                    "the object store (S3-style HTTP, payloads by RDMA) and its client: serve, put, "
                    "get, ls, mb, rb, rm"},
                   {"help [COMMAND]", "this help, or the command's"},
                   {"--version", "ferry's version"}},
      .done = "the command did what it was asked",
      .failed = "it could not (each command's --help says when)"};
  return ferry::cli::renderHelp("ferry",
                                "ferry moves data with RDMA semantics between processes and hosts. `ferry "
                                "COMMAND --help` describes each command; `ferry info --config` lists every "
                                "FERRY_* variable (docs/configuration.md).",
                                h);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return ferry::cli::usageError("ferry", "no command given (ferry help lists them)");
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "help" && !args.empty()) {  // `ferry help COMMAND` is `ferry COMMAND --help`
    command = args.front();
    args = {"--help"};
  }
  if (command == "info") return ferry::cli::runInfo(args);
  if (command == "store") return ferry::cli::runStore(args);
  if (command == "objects") return ferry::cli::runObjects(args);
  if (command == "demo" || command == "bench") {
    // The target (demo) or --local server (bench) runs this same binary; name it by its absolute path.
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    std::string path = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
    if (command == "bench") return ferry::cli::runBench(args, path);
    return ferry::cli::runDemo(args, path);
  }
  if (command == "--version" || command == "version") {
    std::printf("ferry %s\n", ferry::version());
    return 0;
  }
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(help().c_str(), stdout);
    return 0;
  }
  return ferry::cli::usageError("ferry", "unknown command '" + command + "' (ferry help lists them)");
}
