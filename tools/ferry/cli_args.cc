#include "cli_args.h"

#include <cstdio>
#include <sstream>

namespace ferry::cli {
namespace {

constexpr size_t kWidth = 100;      // help lines wrap before this column
constexpr size_t kNameColumn = 24;  // where a row's meaning starts

// `text` wrapped to kWidth, each line after the first indented by `indent`; `used` columns of the
// first line are taken already.
std::string wrap(const std::string& text, size_t indent, size_t used) {
  std::istringstream words(text);
  std::string out, word;
  size_t column = used;
  bool lineEmpty = true;
  while (words >> word) {
    if (!lineEmpty && column + 1 + word.size() > kWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      lineEmpty = true;
    }
    if (!lineEmpty) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    lineEmpty = false;
  }
  return out;
}

std::string row(const std::string& name, const std::string& meaning) {
  std::string line = "  " + name;
  if (line.size() + 2 > kNameColumn) {
    line += "\n" + std::string(kNameColumn, ' ');
  } else {
    line += std::string(kNameColumn - line.size(), ' ');
  }
  return line + wrap(meaning, kNameColumn, kNameColumn) + "\n";
}

std::string section(const std::string& heading, const std::vector<HelpRow>& rows) {
  if (rows.empty()) return "";
  std::string out = "\n" + heading + ":\n";
  for (const HelpRow& r : rows) out += row(r.name, r.meaning);
  return out;
}

// "--piece SIZE", "-h, --help", "    --http": short names first, long names aligned after them.
std::string optionName(const CLI::Option& opt) {
  std::string shorts, longs;
  for (const std::string& s : opt.get_snames()) shorts += "-" + s + ", ";
  for (const std::string& l : opt.get_lnames()) longs += (longs.empty() ? "--" : ", --") + l;
  std::string name = (shorts.empty() ? std::string(4, ' ') : shorts) + longs;
  if (opt.get_expected_max() != 0)
    name += " " + (opt.get_option_text().empty() ? "VALUE" : opt.get_option_text());
  return name;
}

std::string optionMeaning(const CLI::Option& opt) {
  std::string meaning = opt.get_description();
  const std::string& fallback = opt.get_default_str();
  if (opt.get_expected_max() != 0 && !fallback.empty() && meaning.find("default") == std::string::npos)
    meaning += " (default: " + fallback + ")";
  return meaning;
}

}  // namespace

std::string renderHelp(const std::string& name, const std::string& summary, const CommandHelp& help,
                       const CLI::App* app) {
  std::vector<HelpRow> arguments, options;
  std::string forms;
  if (app != nullptr) {
    for (const CLI::Option* opt : app->get_options()) {
      if (opt->get_group().empty()) continue;  // hidden: the command's own machinery
      if (opt->get_positional()) {
        arguments.push_back({opt->get_name(true, false), opt->get_description()});
        forms += " " + opt->get_name(true, false);
      } else if (opt != app->get_help_ptr()) {
        options.push_back({optionName(*opt), optionMeaning(*opt)});
      }
    }
    options.push_back({"-h, --help", "print this help and exit"});
  }
  std::string out;
  std::vector<std::string> usage = help.usage;
  if (usage.empty()) usage.push_back(name + forms + (options.empty() ? "" : " [options]"));
  for (size_t i = 0; i < usage.size(); ++i) out += (i == 0 ? "usage: " : "       ") + usage[i] + "\n";
  out += "\n" + wrap(summary, 0, 0) + "\n";
  out += section("arguments", arguments);
  out += section("commands", help.commands);
  out += section("options", options);
  std::vector<HelpRow> codes = {{"0", help.done}};
  if (!help.failed.empty()) codes.push_back({"1", help.failed});
  codes.push_back({"2",
                   "a bad command line or FERRY_* variable (an unknown option, a missing or malformed "
                   "value): nothing was done"});
  out += "\nexit codes:\n";
  for (const HelpRow& c : codes) out += "  " + c.name + "  " + wrap(c.meaning, 5, 5) + "\n";
  return out;
}

std::optional<int> parseCommand(CLI::App& app, const CommandHelp& help,
                                const std::vector<std::string>& args) {
  const std::string& name = app.get_name();
  app.set_help_flag("-h,--help", "print this help and exit");
  // CLI11's own messages name a value by its type name: make it the name the help shows.
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_option_text().empty()) opt->type_name(opt->get_option_text());
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(renderHelp(name, app.get_description(), help, &app).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    // An unknown word is reported first: CLI11 checks required arguments before it looks at extras.
    std::vector<std::string> extra = app.remaining();
    std::string what = e.what();
    if (!extra.empty()) {
      what = extra.front().rfind('-', 0) == 0 ? "unknown option '" + extra.front() + "'"
                                              : "unexpected argument '" + extra.front() + "'";
    }
    std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", name.c_str(), what.c_str(), name.c_str());
    return kBadUsage;
  }
  return std::nullopt;
}

int usageError(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", command.c_str(), message.c_str());
  return kBadUsage;
}

}  // namespace ferry::cli
