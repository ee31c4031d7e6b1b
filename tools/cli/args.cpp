#include "args.h"

#include <algorithm>
#include <sstream>

namespace moe_routing::cli {
namespace {

constexpr size_t kHelpWidth = 100;
constexpr size_t kFlagColumn = 30;

/// Appends `text` word-wrapped to kHelpWidth; continuation lines start at `indent`.
void append_wrapped(std::string* out, const std::string& text, size_t first_column, size_t indent) {
  size_t column = first_column;
  std::istringstream words(text);
  std::string word;
  bool first = true;
  while (words >> word) {
    if (!first && column + 1 + word.size() > kHelpWidth) {
      *out += '\n' + std::string(indent, ' ');
      column = indent;
    } else if (!first) {
      *out += ' ';
      ++column;
    }
    *out += word;
    column += word.size();
    first = false;
  }
}

/// Levenshtein distance, for "did you mean" hints.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string range_text(int64_t min, int64_t max) {
  std::ostringstream out;
  out << '[' << min << ", " << max << ']';
  return out.str();
}

}  // namespace

Status parse_int(const std::string& text, int64_t min, int64_t max, const std::string& command,
                 const std::string& what, int64_t* out) {
  auto fail = [&] {
    const bool full =
        min == std::numeric_limits<int64_t>::min() && max == std::numeric_limits<int64_t>::max();
    return invalid_argument("moe-routing: ", command, ": ", what, " must be ",
                            full ? "a 64-bit integer" : "an integer in ",
                            full ? "" : range_text(min, max), ", got '", text, "'");
  };
  size_t i = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) i = 1;
  if (i == text.size()) return fail();
  // Accumulate as a negative number so INT64_MIN parses without overflow.
  int64_t value = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return fail();
    const int digit = text[i] - '0';
    if (value < (std::numeric_limits<int64_t>::min() + digit) / 10) return fail();
    value = value * 10 - digit;
  }
  if (!negative) {
    if (value == std::numeric_limits<int64_t>::min()) return fail();
    value = -value;
  }
  if (value < min || value > max)
    return invalid_argument("moe-routing: ", command, ": ", what, " must be in ",
                            range_text(min, max), ", got ", value);
  *out = value;
  return Status::ok();
}

ArgParser::Flag& ArgParser::Flag::required() {
  required_ = true;
  return *this;
}

ArgParser::Flag& ArgParser::Flag::default_text(std::string text) {
  default_text_ = std::move(text);
  return *this;
}

ArgParser::ArgParser(CommandInfo info) : info_(std::move(info)) {}

ArgParser::Flag& ArgParser::add(const std::string& name, const std::string& value_name,
                                const std::string& help) {
  flags_.push_back(std::make_unique<Flag>());
  Flag& flag = *flags_.back();
  flag.name_ = name;
  flag.value_name_ = value_name;
  flag.help_ = help;
  return flag;
}

ArgParser::Flag& ArgParser::add_int(const std::string& name, const std::string& value_name,
                                    const std::string& help, int64_t* target, int64_t min,
                                    int64_t max) {
  Flag& flag = add(name, value_name, help);
  flag.kind_ = Flag::Kind::integer;
  flag.int_target_ = target;
  flag.min_ = min;
  flag.max_ = max;
  flag.default_text_ = std::to_string(*target);
  return flag;
}

ArgParser::Flag& ArgParser::add_string(const std::string& name, const std::string& value_name,
                                       const std::string& help, std::string* target) {
  Flag& flag = add(name, value_name, help);
  flag.kind_ = Flag::Kind::text;
  flag.text_target_ = target;
  flag.default_text_ = *target;
  return flag;
}

ArgParser::Flag& ArgParser::add_choice(const std::string& name, const std::string& help,
                                       std::vector<std::string> choices, std::string* target) {
  std::string value_name;
  for (const std::string& choice : choices) value_name += (value_name.empty() ? "" : "|") + choice;
  Flag& flag = add(name, value_name, help);
  flag.kind_ = Flag::Kind::choice;
  flag.choices_ = std::move(choices);
  flag.text_target_ = target;
  flag.default_text_ = *target;
  return flag;
}

ArgParser::Flag& ArgParser::add_int_list(const std::string& name, const std::string& value_name,
                                         const std::string& help, size_t count,
                                         std::vector<int64_t>* target, int64_t min, int64_t max) {
  Flag& flag = add(name, value_name, help);
  flag.kind_ = Flag::Kind::integer_list;
  flag.list_target_ = target;
  flag.list_size_ = count;
  flag.min_ = min;
  flag.max_ = max;
  std::string shown;
  for (int64_t v : *target) shown += (shown.empty() ? "" : ",") + std::to_string(v);
  flag.default_text_ = shown;
  return flag;
}

ArgParser::Flag& ArgParser::add_switch(const std::string& name, const std::string& help,
                                       bool* target) {
  Flag& flag = add(name, "", help);
  flag.kind_ = Flag::Kind::on_off;
  flag.switch_target_ = target;
  return flag;
}

ArgParser::Flag* ArgParser::find(const std::string& name) {
  for (auto& flag : flags_)
    if (flag->name_ == name) return flag.get();
  return nullptr;
}

bool ArgParser::given(const std::string& name) const {
  for (const auto& flag : flags_)
    if (flag->name_ == name) return flag->given_;
  return false;
}

Status ArgParser::assign(Flag& flag, const std::string& value) {
  switch (flag.kind_) {
    case Flag::Kind::integer:
      return parse_int(value, flag.min_, flag.max_, info_.name, flag.name_, flag.int_target_);
    case Flag::Kind::text:
      if (value.empty()) return error(flag.name_, " must not be empty, got ''");
      *flag.text_target_ = value;
      return Status::ok();
    case Flag::Kind::choice: {
      if (std::find(flag.choices_.begin(), flag.choices_.end(), value) == flag.choices_.end()) {
        std::string list;
        for (const std::string& choice : flag.choices_) list += (list.empty() ? "" : ", ") + choice;
        return error(flag.name_, " must be one of ", list, ", got '", value, "'");
      }
      *flag.text_target_ = value;
      return Status::ok();
    }
    case Flag::Kind::integer_list: {
      std::vector<std::string> parts(1);
      for (char c : value) {
        if (c == ',')
          parts.emplace_back();
        else
          parts.back() += c;
      }
      if (parts.size() != flag.list_size_)
        return error(flag.name_, " must be ", flag.list_size_, " comma-separated integers ",
                     flag.value_name_, ", got '", value, "'");
      std::vector<int64_t> numbers(parts.size());
      for (size_t i = 0; i < parts.size(); ++i)
        MOE_ROUTING_RETURN_IF_ERROR(
            parse_int(parts[i], flag.min_, flag.max_, info_.name, flag.name_, &numbers[i]));
      *flag.list_target_ = numbers;
      return Status::ok();
    }
    case Flag::Kind::on_off: *flag.switch_target_ = true; return Status::ok();
  }
  return error(flag.name_, " has an unknown kind, got ", int(flag.kind_));  // unreachable
}

Status ArgParser::parse(const std::vector<std::string>& args) {
  for (const std::string& arg : args)
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return Status::ok();
    }
  const std::string see_help = "run 'moe-routing " + info_.name + " --help' to see the flags";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0)
      return error("unexpected argument '", arg, "' (flags start with --; ", see_help, ")");
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    Flag* flag = find(name);
    if (flag == nullptr) {
      std::string hint;
      size_t best = 3;  // suggest only near misses
      for (const auto& candidate : flags_) {
        const size_t distance = edit_distance(name, candidate->name_);
        if (distance < best) {
          best = distance;
          hint = "did you mean " + candidate->name_ + "? ";
        }
      }
      return error("unknown flag '", name, "' (", hint, see_help, ")");
    }
    if (flag->given_) return error(flag->name_, " must be given at most once, got it twice");
    flag->given_ = true;
    if (flag->kind_ == Flag::Kind::on_off) {
      if (equals != std::string::npos)
        return error(flag->name_, " takes no value, got '", arg.substr(equals + 1), "'");
      MOE_ROUTING_RETURN_IF_ERROR(assign(*flag, ""));
      continue;
    }
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else {
      if (i + 1 >= args.size())
        return error(flag->name_, " needs a value (", flag->value_name_, "), got none");
      value = args[++i];
      if (value.size() > 2 && value.compare(0, 2, "--") == 0)
        return error(flag->name_, " needs a value (", flag->value_name_, "), got the flag ", value);
    }
    MOE_ROUTING_RETURN_IF_ERROR(assign(*flag, value));
  }
  std::string missing;
  for (const auto& flag : flags_)
    if (flag->required_ && !flag->given_)
      missing += (missing.empty() ? "" : ", ") + flag->name_ + ' ' + flag->value_name_;
  if (!missing.empty()) return error("missing required flags: ", missing, " (", see_help, ")");
  return Status::ok();
}

std::string ArgParser::help() const {
  std::string out =
      "moe-routing " + info_.name + " - " + info_.summary + "\n\nUsage: moe-routing " + info_.name;
  for (const auto& flag : flags_)
    if (flag->required_) out += ' ' + flag->name_ + ' ' + flag->value_name_;
  out += " [flags]\n";
  if (!info_.description.empty()) {
    // Paragraphs are separated by blank lines; each is re-wrapped.
    std::istringstream lines(info_.description);
    std::string line, paragraph;
    auto flush = [&] {
      if (paragraph.empty()) return;
      out += '\n';
      append_wrapped(&out, paragraph, 0, 0);
      out += '\n';
      paragraph.clear();
    };
    while (std::getline(lines, line)) {
      if (line.empty())
        flush();
      else
        paragraph += (paragraph.empty() ? "" : " ") + line;
    }
    flush();
  }
  out += "\nFlags:\n";
  auto add_row = [&](const std::string& left, const std::string& text) {
    std::string row = "  " + left;
    if (row.size() + 2 > kFlagColumn) {
      out += row + '\n';
      row = std::string(kFlagColumn, ' ');
    } else {
      row.append(kFlagColumn - row.size(), ' ');
    }
    out += row;
    append_wrapped(&out, text, kFlagColumn, kFlagColumn);
    out += '\n';
  };
  for (const auto& flag : flags_) {
    std::string text = flag->help_;
    if (flag->required_)
      text += " (required)";
    else if (!flag->default_text_.empty() && flag->kind_ != Flag::Kind::on_off)
      text += " (default: " + flag->default_text_ + ")";
    add_row(flag->name_ + (flag->value_name_.empty() ? "" : " " + flag->value_name_), text);
  }
  add_row("-h, --help", "show this help and exit");
  if (!info_.examples.empty()) {
    out += "\nExamples:\n";
    std::istringstream lines(info_.examples);
    std::string line;
    while (std::getline(lines, line)) out += "  " + line + '\n';
  }
  return out;
}

}  // namespace moe_routing::cli
