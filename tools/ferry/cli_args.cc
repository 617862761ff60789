#include "cli_args.h"

#include <cstdio>


namespace ferry::cli {

std::optional<int> parseCommand(CLI::App& app, const std::string& command, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ExtrasError& e) {
    std::fprintf(stderr, "ferry %s: %s (ferry %s --help lists the options)\n", command.c_str(), e.what(),
                 command.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ferry %s: %s\n", command.c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace ferry::cli
