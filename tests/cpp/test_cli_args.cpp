// The moe-routing flag parser (tools/cli/args.h): every flag kind, both spellings, and a table of
// command lines -> error message.
#include <gtest/gtest.h>

#include <limits>

#include "args.h"

namespace moe_routing::cli {
namespace {

/// A command with one flag of every kind, as later commands (init-routing, bench) will declare.
struct Flags {
  std::string in = "", order = "tree";
  int64_t top_k = 0, active_num = 0, threads = 0;
  std::vector<int64_t> range = {0, 0};
  bool flag = false;

  void declare(ArgParser& p) {
    p.add_string("--in", "FILE", "input file", &in).required();
    p.add_int("--top-k", "K", "experts per token", &top_k, 1, 1024).required();
    p.add_int("--active-num", "A", "active_num", &active_num);
    p.add_int("--threads", "T", "threads", &threads, 0, 64);
    p.add_choice("--order", "accumulation order", {"tree", "sequential"}, &order);
    p.add_int_list("--active-expert-range", "START,END", "experts routed", 2, &range, 0, 100)
        .default_text("0,E");
    p.add_switch("--expert-tokens-before-capacity-flag", "also count before capacity", &flag);
  }
};

CommandInfo test_info() {
  return {"golden test", "a test command", "First paragraph\nstill first.\n\nSecond paragraph.",
          "moe-routing golden test --in a.npy --top-k 2"};
}

/// Flags bound to a parser that has parsed `args`.
struct Parsed {
  Flags flags;
  ArgParser parser{test_info()};
  Status status;
  explicit Parsed(const std::vector<std::string>& args) {
    flags.declare(parser);
    status = parser.parse(args);
  }
};

TEST(CliArgs, ParsesEveryKindInBothSpellings) {
  Parsed parsed({"--in", "a.npy", "--top-k=8", "--active-num", "-5", "--order=sequential",
                 "--active-expert-range", "3,70", "--expert-tokens-before-capacity-flag"});
  ASSERT_TRUE(parsed.status.is_ok()) << parsed.status.message();
  const Flags& f = parsed.flags;
  const ArgParser* p = &parsed.parser;
  EXPECT_EQ(f.in, "a.npy");
  EXPECT_EQ(f.top_k, 8);
  EXPECT_EQ(f.active_num, -5);
  EXPECT_EQ(f.order, "sequential");
  EXPECT_EQ(f.range, (std::vector<int64_t>{3, 70}));
  EXPECT_TRUE(f.flag);
  EXPECT_EQ(f.threads, 0);  // default kept
  EXPECT_TRUE(p->given("--active-num"));
  EXPECT_FALSE(p->given("--threads"));
  EXPECT_FALSE(p->help_requested());
}

TEST(CliArgs, HelpWinsOverEverythingElse) {
  for (const char* help : {"--help", "-h"}) {
    Parsed parsed({"--bogus", help});
    EXPECT_TRUE(parsed.status.is_ok()) << parsed.status.message();
    EXPECT_TRUE(parsed.parser.help_requested());
  }
}

TEST(CliArgs, HelpListsEveryFlagWithDefaults) {
  Flags f;
  ArgParser p(test_info());
  f.declare(p);
  const std::string help = p.help();
  for (const char* text :
       {"moe-routing golden test - a test command",
        "Usage: moe-routing golden test --in FILE --top-k K [flags]",
        "First paragraph still first.", "Second paragraph.", "--in FILE", "input file (required)",
        "--top-k K", "--active-num A", "active_num (default: 0)", "--order tree|sequential",
        "accumulation order (default: tree)", "--active-expert-range START,END", "(default: 0,E)",
        "--expert-tokens-before-capacity-flag", "-h, --help",
        "Examples:", "  moe-routing golden test --in a.npy --top-k 2"})
    EXPECT_NE(help.find(text), std::string::npos) << "missing '" << text << "' in:\n" << help;
  for (size_t start = 0, end; (end = help.find('\n', start)) != std::string::npos; start = end + 1)
    EXPECT_LE(end - start, 100u) << help.substr(start, end - start);
}

TEST(CliArgs, ErrorTable) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::string base = "moe-routing: golden test: ";
  const std::vector<Case> cases = {
      {{"--in", "a", "--top-k", "2", "--tpo-k", "3"},
       "unknown flag '--tpo-k' (did you mean --top-k? run 'moe-routing golden test --help' to see "
       "the flags)"},
      {{"--in", "a", "--top-k", "2", "--zzzzzz"},
       "unknown flag '--zzzzzz' (run 'moe-routing golden test --help' to see the flags)"},
      {{"--in", "a"}, "missing required flags: --top-k K ("},
      {{}, "missing required flags: --in FILE, --top-k K ("},
      {{"--in", "a", "--top-k"}, "--top-k needs a value (K), got none"},
      {{"--in", "--top-k", "2"}, "--in needs a value (FILE), got the flag --top-k"},
      {{"--in", "a", "--top-k", "2", "--top-k", "3"},
       "--top-k must be given at most once, got it twice"},
      {{"--in", "a", "--top-k", "2", "extra"}, "unexpected argument 'extra' (flags start with --;"},
      {{"--in", "a", "--top-k", "two"}, "--top-k must be an integer in [1, 1024], got 'two'"},
      {{"--in", "a", "--top-k", "0"}, "--top-k must be in [1, 1024], got 0"},
      {{"--in", "a", "--top-k", "1025"}, "--top-k must be in [1, 1024], got 1025"},
      {{"--in", "a", "--top-k", "2 "}, "--top-k must be an integer in [1, 1024], got '2 '"},
      {{"--in", "a", "--top-k", "0x10"}, "--top-k must be an integer in [1, 1024], got '0x10'"},
      {{"--in", "a", "--top-k", ""}, "--top-k must be an integer in [1, 1024], got ''"},
      {{"--in", "a", "--top-k", "-"}, "--top-k must be an integer in [1, 1024], got '-'"},
      {{"--in", "a", "--top-k", "2", "--active-num", "9223372036854775808"},
       "--active-num must be a 64-bit integer, got '9223372036854775808'"},
      {{"--in", "a", "--top-k", "2", "--active-num=-9223372036854775809"},
       "--active-num must be a 64-bit integer, got '-9223372036854775809'"},
      {{"--in=", "--top-k", "2"}, "--in must not be empty, got ''"},
      {{"--in", "a", "--top-k", "2", "--order", "random"},
       "--order must be one of tree, sequential, got 'random'"},
      {{"--in", "a", "--top-k", "2", "--active-expert-range", "1"},
       "--active-expert-range must be 2 comma-separated integers START,END, got '1'"},
      {{"--in", "a", "--top-k", "2", "--active-expert-range", "1,2,3"},
       "--active-expert-range must be 2 comma-separated integers START,END, got '1,2,3'"},
      {{"--in", "a", "--top-k", "2", "--active-expert-range", "1,x"},
       "--active-expert-range must be an integer in [0, 100], got 'x'"},
      {{"--in", "a", "--top-k", "2", "--active-expert-range", "1,101"},
       "--active-expert-range must be in [0, 100], got 101"},
      {{"--in", "a", "--top-k", "2", "--expert-tokens-before-capacity-flag=1"},
       "--expert-tokens-before-capacity-flag takes no value, got '1'"},
      {{"-x"}, "unexpected argument '-x'"},
  };
  for (const Case& c : cases) {
    const Status s = Parsed(c.args).status;
    std::string line;
    for (const std::string& a : c.args) line += a + ' ';
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << line;
    EXPECT_EQ(s.message().rfind(base, 0), 0u) << line << ": " << s.message();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << line << ": " << s.message();
  }
}

TEST(CliArgs, ParseIntCoversTheInt64Range) {
  int64_t v = 0;
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(parse_int("-9223372036854775808", lo, hi, "c", "--x", &v).is_ok());
  EXPECT_EQ(v, lo);
  ASSERT_TRUE(parse_int("9223372036854775807", lo, hi, "c", "--x", &v).is_ok());
  EXPECT_EQ(v, hi);
  ASSERT_TRUE(parse_int("+17", lo, hi, "c", "--x", &v).is_ok());
  EXPECT_EQ(v, 17);
  ASSERT_TRUE(parse_int("-0", lo, hi, "c", "--x", &v).is_ok());
  EXPECT_EQ(v, 0);
  v = 5;
  Status s = parse_int("12", 0, 10, "demo", "--runs", &v);
  EXPECT_EQ(s.message(), "moe-routing: demo: --runs must be in [0, 10], got 12");
  EXPECT_EQ(v, 5);  // untouched on error
}

}  // namespace
}  // namespace moe_routing::cli
