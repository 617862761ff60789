// Option parsing and help for every `ferry` command, with CLI11 (a maintained library): each command
// declares its options on a CLI::App (a value's name with ->option_text("NAME")) and calls
// parseCommand(). Errors are one line, "ferry COMMAND: MESSAGE", and exit code 2; --help prints the
// command's help in the one shape every command shares (renderHelp) and exits 0.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ferry::cli {

// Exit code 2 of every command: the command line (or a FERRY_* variable) is bad, nothing was done.
inline constexpr int kBadUsage = 2;

// A row of a help section: a name and what it means.
struct HelpRow {
  std::string name;
  std::string meaning;
};

// What a command's help says beyond its options. Every help reads:
//
//   usage: FORM                    (one line per form)
//
//   SUMMARY
//
//   arguments: / commands: / options:    (the sections the command has)
//     NAME          meaning
//
//   exit codes:
//     0  DONE
//     1  FAILED                    (when the command can fail after a good command line)
//     2  a bad command line ...    (the same words for every command)
struct CommandHelp {
  std::vector<std::string> usage;  // the forms; none: the command's name, arguments and "[options]"
  std::vector<HelpRow> commands;   // the subcommands of a command that has them
  std::string done;                // what exit code 0 means
  std::string failed;              // what exit code 1 means ("" when it never gives 1)
};

// The help of `name` (e.g. "ferry objects put"): summary and options from `app` when given.
std::string renderHelp(const std::string& name, const std::string& summary, const CommandHelp& help,
                       const CLI::App* app = nullptr);

// Parses `args` (the words after the command's name). Returns nullopt when the command should go
// on, else the exit code to return: 0 after --help (printed on stdout), 2 after an error (printed
// on stderr as "ferry COMMAND: MESSAGE (ferry COMMAND --help lists the options)").
std::optional<int> parseCommand(CLI::App& app, const CommandHelp& help, const std::vector<std::string>& args);

// Prints "COMMAND: MESSAGE" (COMMAND as in "ferry info") on stderr; returns kBadUsage.
int usageError(const std::string& command, const std::string& message);

}  // namespace ferry::cli
