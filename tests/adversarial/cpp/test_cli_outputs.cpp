// How the moe-routing tool writes its outputs, tried as an adversary would (issue 17, items 5, 6,
// 12 and 13): an --out that is a FIFO, a device or a symbolic link is written through, never
// replaced; a failed --out-dir run (of the dispatch and of the combine's backward) leaves the
// previous run's files as they were, even when it
// fails between two renames; an --out-dir through a symbolic link to nothing is refused without
// creating the link's target; temporaries are unique (concurrent runs all succeed, a user's own
// `<out>.tmp` is never touched); messages name the flag. docs/reliability.md cites these tests.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>

#include "cli_test_util.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

/// Time and memory limits for every run of this suite: a regression fails its test, it does not
/// hang or exhaust the machine.
CliOptions limited() {
  CliOptions options;
  options.timeout_s = 120;
  options.memory_limit_mib = 2048;
  return options;
}

/// Writes inputs of `golden grad` whose output is known without running anything (top_k 1 and
/// the identity permutation make grad_x equal grad_expanded_x); returns the expected file.
std::vector<uint8_t> write_identity_grad(const TempDir& dir, int64_t rows, int64_t hidden,
                                         float scale = 0.5f) {
  npy::Array g(DType::float32, {rows, hidden});
  for (int64_t i = 0; i < rows * hidden; ++i) {
    const float value = float(i % 1000) * scale;
    std::memcpy(g.bytes.data() + 4 * i, &value, 4);
  }
  std::vector<int32_t> identity(size_t(rows), 0);
  for (int64_t i = 0; i < rows; ++i) identity[size_t(i)] = int32_t(i);
  write_or_fail(dir.file("g.npy"), g);
  write_or_fail(dir.file("r.npy"), i32({rows}, identity));
  std::vector<uint8_t> file;
  EXPECT_TRUE(npy::encode(g, "expected", &file).is_ok());
  return file;
}

mode_t type_of(const std::string& path) {
  struct stat info;
  return ::lstat(path.c_str(), &info) == 0 ? info.st_mode & S_IFMT : 0;
}

std::string link_of(const std::string& path) {
  char target[4096];
  const ssize_t length = ::readlink(path.c_str(), target, sizeof target);
  return length > 0 ? std::string(target, size_t(length)) : "";
}

/// Everything readable from a non-blocking descriptor now.
std::string read_available(int fd) {
  std::string got;
  char chunk[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, chunk, sizeof chunk)) > 0) got.append(chunk, size_t(n));
  return got;
}

/// A character device for the tool to write to: with minor 3 it discards what it is given (as
/// /dev/null), with minor 7 it refuses it with ENOSPC (as /dev/full). A private node in `dir`
/// where this process may make one (root), else the system's own, which the tool then could not
/// replace even if it tried (and a fixed tool never tries).
std::string memory_device(const TempDir& dir, const std::string& name, unsigned minor) {
  const std::string node = dir.file(name);
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0) return node;
  return "/dev/" + name;
}

/// Every regular file of `dir` by name, with its contents; other entries as their file type.
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& name : files_in(dir)) {
    const mode_t type = type_of(dir + "/" + name);
    files[name] =
        type == S_IFREG ? read_text(dir + "/" + name) : "<type " + std::to_string(type) + ">";
  }
  return files;
}

// --- item 5: FIFOs, devices and symbolic links are written through --------------------------

TEST(AdversarialCliOutputs, AFifoIsWrittenInPlaceNotReplaced) {
  TempDir dir;
  const std::vector<uint8_t> expected = write_identity_grad(dir, 4, 3);
  const std::string fifo = dir.file("fifo.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(::symlink("fifo.npy", dir.file("link.npy").c_str()), 0);
  for (const std::string& out : {fifo, dir.file("link.npy")}) {
    SCOPED_TRACE(out);
    // Both ends are open here, so the tool's open for writing does not wait, and its few bytes
    // stay in the pipe until read below.
    const int pipe_end = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    ASSERT_GE(pipe_end, 0);
    const std::vector<std::string> args = golden_grad(dir, 1, out);
    const CliResult r = run_cli(dir, args, limited());
    EXPECT_EQ(r.exit_code, 0) << describe(args, r);
    EXPECT_EQ(read_available(pipe_end), text_of(expected));
    ::close(pipe_end);
    EXPECT_EQ(type_of(fifo), mode_t(S_IFIFO)) << "the FIFO was replaced";
    EXPECT_EQ(link_of(dir.file("link.npy")), "fifo.npy");
    EXPECT_EQ(files_in(dir.path()),
              (std::set<std::string>{"g.npy", "r.npy", "fifo.npy", "link.npy"}));
  }
}

TEST(AdversarialCliOutputs, ADeviceIsWrittenInPlaceNotReplaced) {
  TempDir dir;
  write_identity_grad(dir, 4, 3);
  const std::string null_device = memory_device(dir, "null", 3);
  const std::string full_device = memory_device(dir, "full", 7);
  struct stat before_null, before_full, after;
  ASSERT_EQ(::stat(null_device.c_str(), &before_null), 0);
  ASSERT_EQ(::stat(full_device.c_str(), &before_full), 0);

  std::vector<std::string> args = golden_grad(dir, 1, null_device);
  CliResult r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 0) << describe(args, r);
  ASSERT_EQ(::lstat(null_device.c_str(), &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode)) << null_device << " was replaced";
  EXPECT_EQ(after.st_rdev, before_null.st_rdev);
  EXPECT_EQ(after.st_ino, before_null.st_ino);

  // A device that refuses the bytes: exit status 2 and a message naming the flag.
  args = golden_grad(dir, 1, full_device);
  r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err, "moe-routing: --out " + full_device +
                       ": output must be writable, got 'No space left on device'\n")
      << describe(args, r);
  EXPECT_TRUE(r.out.empty()) << describe(args, r);
  ASSERT_EQ(::lstat(full_device.c_str(), &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode)) << full_device << " was replaced";
  EXPECT_EQ(after.st_ino, before_full.st_ino);

  // No temporary beside either device.
  for (const std::string& device : {null_device, full_device}) {
    const std::string parent = device.substr(0, device.rfind('/'));
    const std::string stem = device.substr(device.rfind('/') + 1) + ".";
    for (const std::string& name : files_in(parent))
      EXPECT_NE(name.rfind(stem, 0), 0u) << parent << "/" << name << " was left behind";
  }
}

TEST(AdversarialCliOutputs, ASymbolicLinkIsWrittenThroughNotReplaced) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("real").c_str(), 0755), 0);
  std::ofstream(dir.file("real/target.npy")) << "old";
  ASSERT_EQ(::symlink("real/target.npy", dir.file("out.npy").c_str()), 0);
  ASSERT_EQ(::symlink("out.npy", dir.file("chain.npy").c_str()), 0);

  std::vector<uint8_t> expected = write_identity_grad(dir, 4, 3);
  std::vector<std::string> args = golden_grad(dir, 1, dir.file("out.npy"));
  CliResult r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_EQ(link_of(dir.file("out.npy")), "real/target.npy") << "the link was replaced";
  EXPECT_EQ(read_text(dir.file("real/target.npy")), text_of(expected));

  // A link to a link: the last target is written, both links stay.
  expected = write_identity_grad(dir, 5, 2, 0.25f);
  args = golden_grad(dir, 1, dir.file("chain.npy"));
  r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_EQ(link_of(dir.file("chain.npy")), "out.npy");
  EXPECT_EQ(link_of(dir.file("out.npy")), "real/target.npy");
  EXPECT_EQ(read_text(dir.file("real/target.npy")), text_of(expected));
  EXPECT_EQ(files_in(dir.file("real")), std::set<std::string>{"target.npy"});
  EXPECT_EQ(files_in(dir.path()),
            (std::set<std::string>{"g.npy", "r.npy", "out.npy", "chain.npy", "real"}));
}

TEST(AdversarialCliOutputs, ASymbolicLinkToNothingIsRefused) {
  TempDir dir;
  write_identity_grad(dir, 4, 3);
  const std::string out = dir.file("out.npy");
  ASSERT_EQ(::symlink("missing/target.npy", out.c_str()), 0);
  const std::vector<std::string> args = golden_grad(dir, 1, out);
  const CliResult r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err, "moe-routing: --out " + out +
                       ": output must not be a symbolic link to nothing (links are written "
                       "through, never replaced), got a link to 'missing/target.npy'\n")
      << describe(args, r);
  EXPECT_EQ(link_of(out), "missing/target.npy");
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"g.npy", "r.npy", "out.npy"}));
}

// --- item 6: a failed --out-dir run changes nothing -----------------------------------------

/// Writes the inputs of a `golden init-routing-v2` run with three outputs (expanded_x,
/// expanded_row_idx, the per-expert counts) as dir/x<seed>.npy and dir/idx<seed>.npy, and returns
/// its arguments writing into `out_dir`. Different seeds give different files.
std::vector<std::string> forward_run(const TempDir& dir, int seed, const std::string& out_dir,
                                     int64_t rows = 4, int64_t hidden = 2) {
  std::vector<float> x(size_t(rows * hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(seed * 100 + int(i % 97));
  std::vector<int32_t> idx(static_cast<size_t>(rows));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t((i + size_t(seed)) % 3);
  const std::string x_path = dir.file("x" + std::to_string(seed) + ".npy");
  const std::string idx_path = dir.file("idx" + std::to_string(seed) + ".npy");
  write_or_fail(x_path, f32({rows, hidden}, x));
  write_or_fail(idx_path, i32({rows, 1}, idx));
  return {"golden",
          "init-routing-v2",
          "--x",
          x_path,
          "--expert-idx",
          idx_path,
          "--expert-num",
          "3",
          "--expert-tokens-count-or-cumsum-flag",
          "2",
          "--out-dir",
          out_dir};
}

const char kCounts[] = "expert_tokens_count_or_cumsum.npy";

/// Writes the inputs of a `golden finalize-routing-grad` run with three outputs (grad_expanded_x,
/// grad_scales, grad_bias) as dir/*<seed>.npy, and returns its arguments writing into `out_dir`.
/// Different seeds give different files.
std::vector<std::string> combine_grad_run(const TempDir& dir, int seed,
                                          const std::string& out_dir) {
  const float s = float(seed);
  const std::pair<std::string, npy::Array> inputs[] = {
      {"--grad-y", f32({2, 2}, {s, 2, 3, 4})},
      {"--expanded-row-idx", i32({4}, {1, 3, 0, 2})},
      {"--expanded-x", f32({4, 2}, {0, 1, 2, 3, 4, 5, 6, s})},
      {"--scales", f32({2, 2}, {0.5f, 0.25f, 2, s})},
      {"--expert-idx", i32({2, 2}, {0, 1, 1, 0})},
      {"--bias", f32({2, 2}, {0, 1, 0, s})}};
  std::vector<std::string> args = {"golden", "finalize-routing-grad"};
  for (const auto& [flag, array] : inputs) {
    const std::string path = dir.file(flag.substr(2) + std::to_string(seed) + ".npy");
    write_or_fail(path, array);
    args.insert(args.end(), {flag, path});
  }
  args.insert(args.end(), {"--out-dir", out_dir});
  return args;
}

/// A command writing a set of files into --out-dir: `run(seed, out_dir)` gives the arguments of a
/// run (different seeds give different files), `files` the set, `last` the file made unwritable.
struct OutDirCommand {
  std::function<std::vector<std::string>(int, const std::string&)> run;
  std::set<std::string> files;
  std::string last;
};

/// A run whose last output cannot be written (a directory took its name, then a device refuses
/// the bytes) fails with exit status 2 naming it, and leaves the previous run's files as they were.
void expect_a_failed_run_keeps_the_previous_files(const TempDir& dir, const OutDirCommand& c) {
  const std::string out = dir.file("out");
  std::vector<std::string> args = c.run(1, out);
  CliResult r = run_cli(dir, args, limited());
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const std::map<std::string, std::string> previous = contents(out);
  ASSERT_EQ(previous.size(), c.files.size());
  auto expect_previous_files = [&](const CliResult& result) {
    for (const std::string& name : c.files) {
      if (name != c.last) {
        EXPECT_EQ(read_text(out + "/" + name), previous.at(name)) << name << " changed";
      }
    }
    EXPECT_EQ(files_in(out), c.files) << describe(args, result);
    EXPECT_TRUE(result.out.empty()) << describe(args, result);
  };

  // The last output cannot be written (a directory took its name).
  const std::string last = out + "/" + c.last;
  ASSERT_EQ(::unlink(last.c_str()), 0);
  ASSERT_EQ(::mkdir(last.c_str(), 0755), 0);
  args = c.run(2, out);
  r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err, "moe-routing: --out-dir " + last +
                       ": output must be writable, got 'Is a "
                       "directory'\n")
      << describe(args, r);
  expect_previous_files(r);

  // The last output is a device that refuses the bytes.
  ASSERT_EQ(::rmdir(last.c_str()), 0);
  ASSERT_EQ(::symlink(memory_device(dir, "full", 7).c_str(), last.c_str()), 0);
  r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_NE(r.err.find(c.last + ": output must be writable, got 'No space left on device'"),
            std::string::npos)
      << describe(args, r);
  expect_previous_files(r);
}

TEST(AdversarialCliOutputs, AFailedOutDirRunKeepsThePreviousRunsFiles) {
  TempDir dir;
  expect_a_failed_run_keeps_the_previous_files(
      dir, {[&](int seed, const std::string& out) { return forward_run(dir, seed, out); },
            {"expanded_x.npy", "expanded_row_idx.npy", kCounts},
            kCounts});
}

TEST(AdversarialCliOutputs, AFailedCombineGradRunKeepsThePreviousRunsFiles) {
  TempDir dir;
  expect_a_failed_run_keeps_the_previous_files(
      dir, {[&](int seed, const std::string& out) { return combine_grad_run(dir, seed, out); },
            {"grad_expanded_x.npy", "grad_scales.npy", "grad_bias.npy"},
            "grad_bias.npy"});
}

// A symbolic link to nothing as --out-dir or as one of its directories: refused, naming the link,
// before anything is written; the link stays, its target is not created (mkdir never follows a
// link), and a directory the run created on the way is removed again. Before, the message was
// "--out-dir must be creatable, got 'No such file or directory' for '<link>'", of a link that
// exists.
TEST(AdversarialCliOutputs, AnOutDirThroughASymbolicLinkToNothingIsRefused) {
  TempDir dir;
  const std::string links = dir.file("links");
  ASSERT_EQ(::mkdir(links.c_str(), 0755), 0);
  // near: the target's directory exists (a mkdir that followed the link would make the target);
  // far: its parent is missing too.
  const std::map<std::string, std::string> targets = {{"near", "target"},
                                                      {"far", "missing/target"}};
  for (const auto& [name, target] : targets)
    ASSERT_EQ(::symlink(target.c_str(), (links + "/" + name).c_str()), 0);
  const std::map<std::string, std::function<std::vector<std::string>(const std::string&)>>
      commands = {{"golden init-routing-v2",
                   [&](const std::string& out) { return forward_run(dir, 1, out); }},
                  {"golden finalize-routing-grad",
                   [&](const std::string& out) { return combine_grad_run(dir, 1, out); }}};
  for (const auto& [command, run] : commands)
    for (const auto& [name, target] : targets) {
      const std::string link = links + "/" + name;
      for (const std::string& out_dir : {link, link + "/sub", link + "/sub/deeper",
                                         dir.file("fresh/../links/") + name + "/sub"}) {
        SCOPED_TRACE(command + " --out-dir " + out_dir);
        const std::vector<std::string> args = run(out_dir);
        const std::set<std::string> before = files_in(dir.path());
        const CliResult r = run_cli(dir, args, limited());
        EXPECT_EQ(r.exit_code, 2) << describe(args, r);
        const std::string named =
            out_dir.rfind(dir.file("fresh"), 0) == 0 ? dir.file("fresh/../links/") + name : link;
        EXPECT_EQ(r.err, "moe-routing: " + command +
                             ": --out-dir must not be or pass through a symbolic link to nothing "
                             "(links are followed, their targets never created), got '" +
                             named + "', a link to '" + target + "'\n")
            << describe(args, r);
        EXPECT_TRUE(r.out.empty()) << describe(args, r);
        EXPECT_EQ(files_in(links), (std::set<std::string>{"near", "far"})) << "a target was made";
        EXPECT_EQ(link_of(link), target);
        EXPECT_EQ(files_in(dir.path()), before) << "a file or directory was left or removed";
      }
    }
}

TEST(AdversarialCliOutputs, ARenameFailingMidwayPutsTheEarlierFilesBack) {
  // The set is expanded_x (a FIFO here: written in place, before the renames), expanded_row_idx
  // (replaces the previous run's file) and the counts (new). While the tool is blocked writing
  // into the FIFO, a directory takes the counts' name: the rename of expanded_row_idx has then
  // succeeded before the counts' fails, and must be undone.
  TempDir dir;
  const int64_t rows = 1024, hidden = 1024;  // 4 MiB: far more than a pipe holds
  const std::string out = dir.file("out"), reference = dir.file("reference");
  std::vector<std::string> args = forward_run(dir, 1, out, rows, hidden);
  CliResult r = run_cli(dir, args, limited());
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const std::string previous_idx = read_text(out + "/expanded_row_idx.npy");
  args = forward_run(dir, 2, reference, rows, hidden);
  r = run_cli(dir, args, limited());
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const std::string expected_x = read_text(reference + "/expanded_x.npy");
  ASSERT_NE(read_text(reference + "/expanded_row_idx.npy"), previous_idx);

  ASSERT_EQ(::unlink((out + "/expanded_x.npy").c_str()), 0);
  ASSERT_EQ(::mkfifo((out + "/expanded_x.npy").c_str(), 0644), 0);
  ASSERT_EQ(::unlink((out + "/" + kCounts).c_str()), 0);
  args = forward_run(dir, 2, out, rows, hidden);
  CliProcess tool(dir, args, limited());
  const int fifo = ::open((out + "/expanded_x.npy").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fifo, 0);
  // Wait for the first bytes (the tool has the pipe full and waits for the rest to be read).
  pollfd ready{fifo, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::poll(&ready, 1, 50) == 0 && tool.running() &&
         std::chrono::steady_clock::now() < deadline)
    ready.revents = 0;
  if (!(ready.revents & POLLIN)) {
    ::close(fifo);
    r = tool.wait();
    FAIL() << "the tool never wrote into the FIFO\n" << describe(args, r);
  }
  ASSERT_EQ(::mkdir((out + "/" + kCounts).c_str(), 0755), 0);
  std::string received;
  for (;;) {  // until end of file: the writer has been here, so read() == 0 means it closed
    char chunk[1 << 16];
    const ssize_t n = ::read(fifo, chunk, sizeof chunk);
    if (n > 0) {
      received.append(chunk, size_t(n));
    } else if (n == 0) {
      break;
    } else {
      ASSERT_EQ(errno, EAGAIN);
      if (std::chrono::steady_clock::now() > deadline) break;
      pollfd more{fifo, POLLIN, 0};
      ::poll(&more, 1, 50);
    }
  }
  ::close(fifo);
  r = tool.wait();
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err, "moe-routing: --out-dir " + out + "/" + kCounts +
                       ": output must be writable, got 'Is a directory'\n")
      << describe(args, r);
  EXPECT_TRUE(received == expected_x)
      << "the FIFO received " << received.size() << " bytes of " << expected_x.size();
  EXPECT_EQ(read_text(out + "/expanded_row_idx.npy"), previous_idx) << "not put back";
  EXPECT_EQ(type_of(out + "/expanded_x.npy"), mode_t(S_IFIFO));
  EXPECT_EQ(files_in(out),
            (std::set<std::string>{"expanded_x.npy", "expanded_row_idx.npy", kCounts}));
}

// --- item 12: unique temporaries ------------------------------------------------------------

TEST(AdversarialCliOutputs, ConcurrentRunsWritingTheSameOutAllSucceed) {
  TempDir dir;
  const std::vector<uint8_t> expected = write_identity_grad(dir, 256, 1024);  // 1 MiB apiece
  const std::string out = dir.file("out.npy");
  const std::vector<std::string> args = golden_grad(dir, 1, out, {"--threads", "1"});
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<CliProcess>> tools;
    for (int i = 0; i < 8; ++i) tools.push_back(std::make_unique<CliProcess>(dir, args, limited()));
    for (auto& tool : tools) {
      const CliResult r = tool->wait();
      EXPECT_EQ(r.exit_code, 0) << "round " << round << "\n" << describe(args, r);
    }
    EXPECT_EQ(read_text(out), text_of(expected));
    EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"g.npy", "r.npy", "out.npy"}));
  }
}

TEST(AdversarialCliOutputs, ConcurrentRunsIntoTheSameOutDirLeaveOneWholeSet) {
  TempDir dir;
  constexpr int kRuns = 4;
  std::vector<std::map<std::string, std::string>> sets;
  for (int seed = 0; seed < kRuns; ++seed) {
    const std::string alone = dir.file("alone" + std::to_string(seed));
    const std::vector<std::string> args = forward_run(dir, seed, alone, 512, 256);
    const CliResult r = run_cli(dir, args, limited());
    ASSERT_EQ(r.exit_code, 0) << describe(args, r);
    sets.push_back(contents(alone));
  }
  const std::string out = dir.file("out");
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<std::string>> args;
    std::vector<std::unique_ptr<CliProcess>> tools;
    for (int seed = 0; seed < kRuns; ++seed) args.push_back(forward_run(dir, seed, out, 512, 256));
    for (int seed = 0; seed < kRuns; ++seed)
      tools.push_back(std::make_unique<CliProcess>(dir, args[size_t(seed)], limited()));
    for (int seed = 0; seed < kRuns; ++seed) {
      const CliResult r = tools[size_t(seed)]->wait();
      EXPECT_EQ(r.exit_code, 0) << "round " << round << "\n" << describe(args[size_t(seed)], r);
    }
    const std::map<std::string, std::string> got = contents(out);
    EXPECT_NE(std::find(sets.begin(), sets.end(), got), sets.end())
        << "round " << round << ": the files of --out-dir are not the set of any one run";
  }
}

TEST(AdversarialCliOutputs, AUsersOwnTmpFileIsNeverTouched) {
  TempDir dir;
  const std::vector<uint8_t> expected = write_identity_grad(dir, 4, 3);
  const std::string out = dir.file("out.npy");
  std::ofstream(out + ".tmp") << "mine";
  std::vector<std::string> args = golden_grad(dir, 1, out);
  CliResult r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_EQ(read_text(out), text_of(expected));
  EXPECT_EQ(read_text(out + ".tmp"), "mine");

  // A run of --out-dir that fails while writing its set.
  const std::string out_dir = dir.file("out");
  ASSERT_EQ(::mkdir(out_dir.c_str(), 0755), 0);
  std::ofstream(out_dir + "/expanded_x.npy.tmp") << "mine too";
  ASSERT_EQ(::mkdir((out_dir + "/" + kCounts).c_str(), 0755), 0);
  args = forward_run(dir, 1, out_dir);
  r = run_cli(dir, args, limited());
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(read_text(out_dir + "/expanded_x.npy.tmp"), "mine too");
  EXPECT_EQ(files_in(out_dir), (std::set<std::string>{"expanded_x.npy.tmp", kCounts}));
}

}  // namespace
}  // namespace moe_routing
