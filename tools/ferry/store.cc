// `ferry store [--host ADDRESS] [--port N]`: serves ferry's discovery store (ferry://HOST:PORT) in
// the foreground until SIGINT or SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "agent/store/ferry_store_server.h"
#include "cli_args.h"
#include "commands.h"

namespace ferry::cli {
namespace {

constexpr uint16_t kDefaultStorePort = 4479;

}  // namespace

int runStore(const std::vector<std::string>& args) {
  std::string host = "127.0.0.1";
  std::string portText = std::to_string(kDefaultStorePort);
  bool allowRemote = false;
  CLI::App app(
      "Serves the discovery store ferry://ADDRESS:PORT in the foreground until SIGINT or SIGTERM; prints "
      "\"ferry store: listening on ADDRESS:PORT\" when ready. Nothing is kept across restarts.",
      "ferry store");
  app.add_option("--host", host, "the address to listen on")->option_text("ADDRESS")->capture_default_str();
  app.add_option("--port", portText, "the port (0 picks a free one)")
      ->option_text("N")
      ->capture_default_str();
  app.add_flag("--allow-remote", allowRemote,
               "serve clients of other hosts too (the store has no authentication: docs/security.md); "
               "without it, clients of other hosts are refused");
  const CommandHelp help{
      .usage = {},
      .commands = {},
      .done = "stopped by SIGINT or SIGTERM",
      .failed = "the store could not start (the port is taken, the address is not this host's)"};
  if (auto code = parseCommand(app, help, args)) return *code;
  if (host.empty()) return usageError("ferry store", "--host needs an address");
  unsigned n = 0;
  auto [end, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), n);
  if (portText.empty() || ec != std::errc() || end != portText.data() + portText.size() || n > 65535) {
    return usageError("ferry store", "--port '" + portText + "' is not a port number in [0, 65535]");
  }
  const auto port = static_cast<uint16_t>(n);

  // The signals are taken synchronously with sigwait, so no handler runs inside the server's code;
  // blocked before start() so the server's thread inherits the mask and never takes them.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  agent::StoreServer server;
  Status st = server.start(host, port, {.allowRemote = allowRemote});
  if (!st.isOk()) {
    std::fprintf(stderr, "ferry store: %s\n", st.toString().c_str());
    return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  bool v6 = host.find(':') != std::string::npos;
  std::printf("ferry store: listening on %s%s%s:%u\n", v6 ? "[" : "", host.c_str(), v6 ? "]" : "",
              static_cast<unsigned>(server.port()));
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stopSignals, &signal);
  server.stop();
  return 0;
}

}  // namespace ferry::cli
