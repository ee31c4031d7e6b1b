// A small flag parser shared by every moe-routing command.
//
// A command declares its flags once, each bound to a variable that holds the default until the
// flag is given; the same declarations produce the command's --help text. Syntax accepted:
// `--flag VALUE`, `--flag=VALUE`, `--switch`, `--help` / `-h` anywhere. Unknown flags, missing
// values, repeated flags, stray positional arguments, malformed or out-of-range integers, values
// outside a choice list and missing required flags are errors of the form
// `moe-routing: <command>: <flag> <constraint>, got <actual>`.
//
//   int64_t top_k = 0;
//   std::string order = "tree";
//   ArgParser parser({"golden grad", "one-line summary", "description...", "examples..."});
//   parser.add_int("--top-k", "K", "experts per token", &top_k).required();
//   parser.add_choice("--order", "accumulation order", {"tree", "sequential"}, &order);
//   Status s = parser.parse(args);      // args: everything after the command words
//   if (parser.help_requested()) std::cout << parser.help();
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moe_routing/status.h"

namespace moe_routing::cli {

/// What a command's help shows besides its flags.
struct CommandInfo {
  std::string name;         // the command words, e.g. "golden grad"
  std::string summary;      // one line, for the top-level command list
  std::string description;  // paragraphs shown under the usage line
  std::string examples;     // one example per line, shown under "Examples:"
};

/// Parses a whole decimal integer (optional sign, no spaces or suffix) within [min, max].
/// `what` names the value in the message, e.g. "--top-k".
Status parse_int(const std::string& text, int64_t min, int64_t max, const std::string& command,
                 const std::string& what, int64_t* out);

class ArgParser {
 public:
  /// One declared flag. The setters return *this so they chain after add_*.
  class Flag {
   public:
    /// Parsing fails when the flag is absent.
    Flag& required();
    /// Replaces the default shown in --help (by default the bound variable's initial value).
    Flag& default_text(std::string text);

   private:
    friend class ArgParser;
    enum class Kind { integer, text, choice, integer_list, on_off };
    std::string name_, value_name_, help_, default_text_;
    Kind kind_ = Kind::text;
    bool required_ = false;
    bool given_ = false;
    int64_t min_ = 0, max_ = 0;
    std::vector<std::string> choices_;
    int64_t* int_target_ = nullptr;
    std::string* text_target_ = nullptr;
    std::vector<int64_t>* list_target_ = nullptr;
    size_t list_size_ = 0;
    bool* switch_target_ = nullptr;
  };

  explicit ArgParser(CommandInfo info);

  /// `--name N`: an integer in [min, max] stored in *target.
  Flag& add_int(const std::string& name, const std::string& value_name, const std::string& help,
                int64_t* target, int64_t min = std::numeric_limits<int64_t>::min(),
                int64_t max = std::numeric_limits<int64_t>::max());
  /// `--name TEXT`: any non-empty text (a path, a name) stored in *target.
  Flag& add_string(const std::string& name, const std::string& value_name, const std::string& help,
                   std::string* target);
  /// `--name a|b|c`: one of `choices`, stored in *target.
  Flag& add_choice(const std::string& name, const std::string& help,
                   std::vector<std::string> choices, std::string* target);
  /// `--name A,B,...`: exactly `count` comma-separated integers, each in [min, max].
  Flag& add_int_list(const std::string& name, const std::string& value_name,
                     const std::string& help, size_t count, std::vector<int64_t>* target,
                     int64_t min = std::numeric_limits<int64_t>::min(),
                     int64_t max = std::numeric_limits<int64_t>::max());
  /// `--name` with no value: sets *target to true.
  Flag& add_switch(const std::string& name, const std::string& help, bool* target);

  /// Parses the arguments that follow the command words. On error the bound variables may be
  /// partly assigned; callers stop at the error.
  Status parse(const std::vector<std::string>& args);

  /// True when --help or -h was among the arguments (parse then returns ok at once).
  bool help_requested() const { return help_requested_; }
  /// Whether the flag appeared on the command line.
  bool given(const std::string& name) const;
  /// The full --help text: usage, description, flags with defaults, examples.
  std::string help() const;
  const CommandInfo& info() const { return info_; }

 private:
  Flag& add(const std::string& name, const std::string& value_name, const std::string& help);
  Flag* find(const std::string& name);
  Status assign(Flag& flag, const std::string& value);
  template <typename... Parts>
  Status error(const Parts&... parts) const {
    return invalid_argument("moe-routing: ", info_.name, ": ", parts...);
  }

  CommandInfo info_;
  std::vector<std::unique_ptr<Flag>> flags_;  // stable addresses: add_* returns references
  bool help_requested_ = false;
};

}  // namespace moe_routing::cli
