// The moe-routing commands and the driver that dispatches to them.
//
// Adding a command: subclass Command (info(), declare() binding flags to members, run()), add a
// factory line to make_commands() in cli.cpp, and list the new .cpp in CMakeLists.txt. Help,
// `help <command>`, `<command> --help`, unknown-flag and required-flag handling come for free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "moe_routing/status.h"

namespace moe_routing::cli {

/// Exit statuses of every command.
constexpr int kExitOk = 0;
constexpr int kExitVerificationFailed = 1;  // ran, but results did not verify (demo, bench)
constexpr int kExitError = 2;               // bad flag, bad file, library error: nothing written

class Command {
 public:
  virtual ~Command() = default;
  /// Name ("golden grad"), summary, description and examples for --help.
  virtual CommandInfo info() const = 0;
  /// Declares the flags on `parser`, bound to this object's members.
  virtual void declare(ArgParser& parser) = 0;
  /// Runs after a successful parse; returns the exit status. Errors go to stderr.
  virtual int run(const ArgParser& parser) = 0;
};

std::unique_ptr<Command> make_golden_grad_command();
std::unique_ptr<Command> make_golden_init_routing_v2_command();
std::unique_ptr<Command> make_golden_init_routing_command();
std::unique_ptr<Command> make_golden_finalize_routing_command();
std::unique_ptr<Command> make_golden_finalize_routing_grad_command();
std::unique_ptr<Command> make_demo_command();
std::unique_ptr<Command> make_info_command();
std::unique_ptr<Command> make_bench_command();

/// Every command, in the order the top-level help lists them.
std::vector<std::unique_ptr<Command>> make_commands();

/// `--numerics atlas_a2|ascend_950` (default atlas_a2), the library's one numerics switch
/// (moe_routing/numerics.h), as every golden command declares it; `effect` says what it selects
/// for the command. Bound to *target; moe_routing::parse_numerics reads it.
ArgParser::Flag& add_numerics_flag(ArgParser& parser, const std::string& effect,
                                   std::string* target);

/// Prints status.message() unchanged to stderr and returns kExitError.
int report_error(const Status& status);

/// The version string ("0.1.0").
const char* version();

/// The whole tool: dispatches argv to a command. Returns the exit status.
int main(int argc, char** argv);

}  // namespace moe_routing::cli
