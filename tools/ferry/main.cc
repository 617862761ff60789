// ferry: the command-line tool. `ferry help` lists the subcommands.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "commands.h"
#include "ferry/common/version.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: ferry <command> [options]\n"
               "\n"
               "commands:\n"
               "  info [--device NAME] [--json]        providers, devices, ports, limits, GIDs\n"
               "  info --config [--json]               every FERRY_* variable and the value in effect\n"
               "  demo [--device NAME] [--size BYTES]  two processes move data with RDMA WRITE and READ,\n"
               "       [--target-device NAME]          verify it byte for byte and print throughput; the\n"
               "       [--target-via 'LAUNCHER ...']   target may use another device and start through a\n"
               "                                       launcher such as 'ip netns exec NS'\n"
               "  bench --local|--server|HOST[:PORT]   perftest-style bandwidth and latency of WRITE, READ,\n"
               "        [--op OP] [--mode bw|lat]      SEND, WRITE_WITH_IMM and atomics between two\n"
               "        [--size N | --sweep] [--json]  processes; `ferry bench --help` lists every option\n"
               "  store [--host ADDRESS] [--port N]    serve the discovery store ferry://ADDRESS:N (default\n"
               "                                       127.0.0.1:4479) until SIGINT or SIGTERM\n"
               "  objects serve|put|get|ls|mb|rb|rm    the object store (S3-style HTTP, payloads by RDMA) and\n"
               "                                       its client; `ferry objects help` lists the forms\n"
               "  help                                 this text\n"
               "  --version                            ferry's version\n"
               "\n"
               "environment: `ferry info --config` lists every FERRY_* variable (docs/configuration.md)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
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
    usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "ferry: unknown command '%s' (ferry help lists them)\n", command.c_str());
  return 2;
}
