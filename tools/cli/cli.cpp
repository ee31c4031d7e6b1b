// The driver: top-level help, --version, `help <command>`, and dispatch by command words.
#include <algorithm>
#include <iostream>
#include <new>

#include "commands.h"

#ifndef MOE_ROUTING_VERSION
#error "MOE_ROUTING_VERSION must be defined by the build (the project version)"
#endif

namespace moe_routing::cli {
namespace {

const char* const kTopLevelHelp = R"(Usage: moe-routing <command> [flags]
       moe-routing help <command>         (or: moe-routing <command> --help)
       moe-routing --version

Commands:
%COMMANDS%
Flags:
  -h, --help    show this help and exit
  --version     print the version and exit

Files are NumPy .npy arrays: float32 '<f4', float16 '<f2', bfloat16 stored as its uint16 bit
patterns '<u2', int8 '|i1', indices and counts int32 '<i4' or int64 '<i8'. Save bf16 from torch
with t.view(torch.uint16).numpy().

Exit status: 0 success; 1 results did not verify (demo, bench --verify); 2 bad flag, bad file or
invalid input (the message on stderr says which; no output file is written).

Examples:
  moe-routing demo --tokens 1024 --dtype fp16
  moe-routing golden init-routing-v2 --x x.npy --expert-idx idx.npy --expert-num 8 --out-dir fwd
  moe-routing golden init-routing --x x.npy --expert-idx idx.npy --expert-num 8 --out-dir fwd
  moe-routing golden grad --grad-expanded-x g.npy --expanded-row-idx r.npy --top-k 8 --out gx.npy
  moe-routing help golden init-routing
)";

std::vector<std::string> split_words(const std::string& name) {
  std::vector<std::string> words;
  std::string word;
  for (char c : name) {
    if (c == ' ') {
      words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  words.push_back(word);
  return words;
}

/// Number of leading args that spell `name` ("golden grad" -> 2), or 0 if they do not.
size_t match_words(const std::vector<std::string>& args, size_t first, const std::string& name) {
  const std::vector<std::string> words = split_words(name);
  if (args.size() - first < words.size()) return 0;
  for (size_t w = 0; w < words.size(); ++w)
    if (args[first + w] != words[w]) return 0;
  return words.size();
}

std::string top_level_help(const std::vector<std::unique_ptr<Command>>& commands) {
  size_t width = 0;  // the summaries start two columns after the longest name
  for (const auto& command : commands) width = std::max(width, command->info().name.size());
  std::string list;
  for (const auto& command : commands) {
    const CommandInfo info = command->info();
    std::string row = "  " + info.name;
    row.append(width + 4 - row.size(), ' ');
    list += row + info.summary + '\n';
  }
  std::string text = std::string("moe-routing ") + version() +
                     " - CANN's MoE routing operators, bit-exact, on the command line\n\n" +
                     kTopLevelHelp;
  text.replace(text.find("%COMMANDS%"), 10, list);
  return text;
}

/// The names of the commands in `group` ("golden" -> "golden grad"), comma-separated.
std::string group_listing(const std::vector<std::unique_ptr<Command>>& commands,
                          const std::string& group) {
  std::string list;
  for (const auto& command : commands) {
    const std::string name = command->info().name;
    if (name.compare(0, group.size() + 1, group + " ") == 0)
      list += (list.empty() ? "" : ", ") + name;
  }
  return list;
}

int dispatch(const std::vector<std::string>& args) {
  std::vector<std::unique_ptr<Command>> commands = make_commands();
  if (args.empty()) {  // a usage error: the help goes to stderr
    std::cerr << top_level_help(commands);
    return kExitError;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::cout << top_level_help(commands);
    return kExitOk;
  }
  if (args[0] == "--version") {
    std::cout << "moe-routing " << version() << '\n';
    return kExitOk;
  }
  const bool help_form = args[0] == "help";
  const size_t first = help_form ? 1 : 0;
  if (help_form && args.size() == 1) {
    std::cout << top_level_help(commands);
    return kExitOk;
  }
  for (const auto& command : commands) {
    const size_t used = match_words(args, first, command->info().name);
    if (used == 0) continue;
    ArgParser parser(command->info());
    command->declare(parser);
    if (help_form) {
      if (first + used != args.size())
        return report_error(invalid_argument("moe-routing: help: takes one command, got extra '",
                                             args[first + used], "'"));
      std::cout << parser.help();
      return kExitOk;
    }
    Status parsed =
        parser.parse(std::vector<std::string>(args.begin() + std::ptrdiff_t(used), args.end()));
    if (!parsed.is_ok()) return report_error(parsed);
    if (parser.help_requested()) {
      std::cout << parser.help();
      return kExitOk;
    }
    return command->run(parser);
  }
  // A group word alone ("golden") or an unknown command.
  const std::string& word = args[first];
  const std::string members = group_listing(commands, word);
  if (!members.empty()) {
    const bool wants_help = help_form
                                ? args.size() == first + 1
                                : args.size() == 2 && (args[1] == "--help" || args[1] == "-h");
    if (wants_help) {
      std::cout << "moe-routing " << word << ": one of: " << members
                << "\nRun 'moe-routing help <command>' for a command's flags.\n";
      return kExitOk;
    }
    const std::string got = args.size() > first + 1 ? "'" + args[first + 1] + "'" : "none";
    return report_error(invalid_argument("moe-routing: ", word, ": subcommand must be one of ",
                                         members, ", got ", got));
  }
  std::string names;
  for (const auto& command : commands) names += (names.empty() ? "" : ", ") + command->info().name;
  return report_error(invalid_argument("moe-routing: command must be one of ", names, ", help, ",
                                       "--help, --version, got '", word,
                                       "' (run 'moe-routing --help')"));
}

}  // namespace

std::vector<std::unique_ptr<Command>> make_commands() {
  std::vector<std::unique_ptr<Command>> commands;
  commands.push_back(make_golden_init_routing_v2_command());
  commands.push_back(make_golden_init_routing_command());
  commands.push_back(make_golden_grad_command());
  commands.push_back(make_golden_finalize_routing_command());
  commands.push_back(make_golden_finalize_routing_grad_command());
  commands.push_back(make_demo_command());
  commands.push_back(make_bench_command());
  commands.push_back(make_info_command());
  return commands;
}

ArgParser::Flag& add_numerics_flag(ArgParser& parser, const std::string& effect,
                                   std::string* target) {
  return parser.add_choice("--numerics",
                           "the device whose arithmetic is reproduced: atlas_a2 (Atlas A2/A3 "
                           "kernels) or ascend_950 (Ascend 950 kernels); " +
                               effect,
                           {"atlas_a2", "ascend_950"}, target);
}

int report_error(const Status& status) {
  std::cerr << status.message() << std::endl;
  return kExitError;
}

const char* version() { return MOE_ROUTING_VERSION; }

int main(int argc, char** argv) {
  try {
    return dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::bad_alloc&) {
    return report_error(
        runtime_error("moe-routing: memory must suffice for the arrays, got an "
                      "allocation failure (try smaller sizes)"));
  } catch (const std::exception& e) {
    return report_error(internal_error("moe-routing: internal error: ", e.what()));
  }
}

}  // namespace moe_routing::cli
