// Option parsing for every `ferry` command, with CLI11 (a maintained library): each command
// declares its options on a CLI::App and calls parseCommand(). Errors are one line naming the
// command and exit code 2; --help prints the command's help and exit code 0.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ferry::cli {

// Parses `args` (the words after the command's name). Returns nullopt when the command should go
// on, else the exit code to return (0 after --help, 2 after an error, with its message printed as
// "ferry COMMAND: MESSAGE").
std::optional<int> parseCommand(CLI::App& app, const std::string& command, const std::vector<std::string>& args);

}  // namespace ferry::cli
