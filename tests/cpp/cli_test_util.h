// Helpers for the tests that run the moe-routing binary as a subprocess (tests/cpp/test_cli_*.cpp,
// tests/adversarial/cpp/): a temporary directory per test, running the tool (optionally in the
// background, with a memory limit or a time limit) and capturing its output, writing inputs and
// reading outputs as .npy files, and comparing arrays byte for byte. The binary's path comes in
// through the MOE_ROUTING_CLI_PATH definition.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "npy.h"
#include "routing_cases.h"

#if defined(__SANITIZE_ADDRESS__)
#define MOE_ROUTING_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_ROUTING_TEST_ASAN 1
#endif
#endif

extern char** environ;

namespace moe_routing::testing {

struct CliResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string out, err;
  bool timed_out = false;  // killed at CliOptions::timeout_s
  long max_rss_kib = 0;    // the process's peak resident set
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

/// A fresh directory for one test's files; removed (with every file in it) at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "moe_routing_cli_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// How run_cli() / CliProcess run the tool.
struct CliOptions {
  std::vector<std::string> env;  // extra NAME=VALUE environment entries
  // > 0: the tool may not grow beyond this many MiB (address space, RLIMIT_AS; under
  // AddressSanitizer, whose shadow memory needs a huge address space, its hard_rss_limit_mb), so a
  // regression that reads or allocates without bound fails the test instead of the machine.
  int memory_limit_mib = 0;
  double timeout_s = 0;  // > 0: killed (SIGKILL) after this long; the result says timed_out
};

/// The tool started in the background with `args`; wait() collects its exit status and output
/// (stdout and stderr go to files of `dir` named after the process, so runs may overlap).
class CliProcess {
 public:
  CliProcess(const TempDir& dir, const std::vector<std::string>& args,
             const CliOptions& options = {})
      : timeout_s_(options.timeout_s) {
    static int serial = 0;
    const std::string stem = dir.file("cli_" + std::to_string(serial++));
    out_path_ = stem + ".stdout";
    err_path_ = stem + ".stderr";
    std::vector<std::string> argv_text = {MOE_ROUTING_CLI_PATH};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<std::string> env_text = options.env;
    const bool asan_limit = options.memory_limit_mib > 0 && kAsan;
    if (asan_limit) {
      const char* asan = std::getenv("ASAN_OPTIONS");
      env_text.push_back(std::string("ASAN_OPTIONS=") + (asan ? asan : "") +
                         ":hard_rss_limit_mb=" + std::to_string(options.memory_limit_mib));
    }
    for (char** e = environ; *e != nullptr; ++e)
      if (!asan_limit || std::strncmp(*e, "ASAN_OPTIONS=", 13) != 0) env_text.push_back(*e);
    // Everything the child needs is prepared before fork(): after it, only async-signal-safe
    // calls.
    std::vector<char*> argv, env;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env_text) env.push_back(e.data());
    env.push_back(nullptr);
    struct rlimit limit;
    limit.rlim_cur = limit.rlim_max = rlim_t(options.memory_limit_mib) << 20;
    const bool set_limit = options.memory_limit_mib > 0 && !kAsan;
    pid_ = ::fork();
    if (pid_ == 0) {
      const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
      if (set_limit && ::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(126);
      ::execve(argv[0], argv.data(), env.data());
      ::_exit(127);
    }
    if (pid_ < 0) ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(errno);
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;
  ~CliProcess() {
    if (pid_ > 0) wait();
  }

  pid_t pid() const { return pid_; }

  /// True until the process ends (it is not reaped: wait() still collects it).
  bool running() const {
    siginfo_t info{};
    return pid_ > 0 && ::waitid(P_PID, id_t(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
  }

  /// Waits for the process to end (killing it at the timeout) and returns what it did.
  CliResult wait() {
    CliResult result;
    if (pid_ <= 0) return result;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    int status = 0;
    struct rusage usage {};
    for (;;) {
      const pid_t done = ::wait4(pid_, &status, timeout_s_ > 0 ? WNOHANG : 0, &usage);
      if (done == pid_ || (done < 0 && errno != EINTR)) break;
      if (done == 0 && std::chrono::steady_clock::now() > deadline) {
        result.timed_out = true;
        ::kill(pid_, SIGKILL);
        timeout_s_ = 0;  // now wait for it without a limit
        continue;
      }
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.max_rss_kib = usage.ru_maxrss;
    result.out = read_text(out_path_);
    result.err = read_text(err_path_);
    std::remove(out_path_.c_str());
    std::remove(err_path_.c_str());
    return result;
  }

 private:
#if defined(MOE_ROUTING_TEST_ASAN)
  static constexpr bool kAsan = true;
#else
  static constexpr bool kAsan = false;
#endif
  pid_t pid_ = -1;
  double timeout_s_ = 0;
  std::string out_path_, err_path_;
};

/// Runs moe-routing with `args` to the end; captures its output.
inline CliResult run_cli(const TempDir& dir, const std::vector<std::string>& args,
                         const CliOptions& options = {}) {
  return CliProcess(dir, args, options).wait();
}

inline std::string describe(const std::vector<std::string>& args, const CliResult& r) {
  std::string text = "moe-routing";
  for (const std::string& a : args) text += " " + a;
  return text + "\nexit " + std::to_string(r.exit_code) + (r.timed_out ? " (timed out)" : "") +
         "\nstdout: " + r.out + "\nstderr: " + r.err;
}

inline npy::Array array_from(DType dtype, std::vector<int64_t> shape, const void* data) {
  npy::Array a(dtype, std::move(shape));
  if (!a.bytes.empty()) std::memcpy(a.bytes.data(), data, a.bytes.size());
  return a;
}

inline void write_or_fail(const std::string& path, const npy::Array& a) {
  Status s = npy::write(path, a);
  ASSERT_TRUE(s.is_ok()) << s.message();
}

/// `golden grad` reading dir/g.npy and dir/r.npy, writing `out`, followed by `extra` flags.
inline std::vector<std::string> golden_grad(const TempDir& dir, int64_t top_k,
                                            const std::string& out,
                                            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      "golden",          "grad",    "--grad-expanded-x",   dir.file("g.npy"), "--expanded-row-idx",
      dir.file("r.npy"), "--top-k", std::to_string(top_k), "--out",           out};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

/// Reads an output file as a FloatBuffer, checking dtype and shape.
inline FloatBuffer read_output(const std::string& path, DType dtype, std::vector<int64_t> shape) {
  npy::Array a;
  Status s = npy::read(path, &a);
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(a.dtype, dtype);
  EXPECT_EQ(a.shape, shape);
  FloatBuffer b;
  b.dtype = a.dtype;
  b.bytes = a.bytes;
  return b;
}

/// The names of the entries of `dir` (empty when it does not exist).
inline std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.insert(name);
  }
  closedir(d);
  return names;
}

inline npy::Array to_array(const Tensor& t) {
  npy::Array a(t.dtype, t.shape);
  a.bytes = t.bytes;
  return a;
}
inline npy::Array floats(DType dtype, std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  return to_array(Tensor::floats(dtype, std::move(shape), values));
}
inline npy::Array f32(std::vector<int64_t> shape, const std::vector<float>& values) {
  return floats(DType::float32, std::move(shape), values);
}
template <typename T>
npy::Array integers(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  npy::Array a(dtype, std::move(shape));
  EXPECT_EQ(a.bytes.size(), values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  return a;
}
inline npy::Array i32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  return integers(DType::int32, std::move(shape), values);
}
inline npy::Array i64(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  return integers(DType::int64, std::move(shape), values);
}
inline npy::Array i8(std::vector<int64_t> shape, const std::vector<int8_t>& values) {
  return integers(DType::int8, std::move(shape), values);
}

inline ::testing::AssertionResult same_array(const npy::Array& expected, const npy::Array& got) {
  if (expected.dtype != got.dtype || expected.shape != got.shape) {
    auto text = [](const npy::Array& a) {
      std::string t = std::string(dtype_name(a.dtype)) + " [";
      for (size_t d = 0; d < a.shape.size(); ++d) t += (d ? ", " : "") + std::to_string(a.shape[d]);
      return t + "]";
    };
    return ::testing::AssertionFailure() << "expected " << text(expected) << ", got " << text(got);
  }
  for (size_t i = 0; i < expected.bytes.size(); ++i)
    if (expected.bytes[i] != got.bytes[i])
      return ::testing::AssertionFailure()
             << "bytes differ; first at byte " << i << " (element "
             << i / dtype_size(expected.dtype) << "): expected 0x" << std::hex
             << int(expected.bytes[i]) << ", got 0x" << int(got.bytes[i]);
  return ::testing::AssertionSuccess();
}

/// One run of a forward command: inputs by flag, extra flags, and what came back.
struct ForwardRun {
  std::vector<std::string> args;
  CliResult result;
  std::map<std::string, npy::Array> outputs;  // by file name without ".npy"
  std::set<std::string> files;                // every entry of --out-dir
};

/// Writes `inputs` (flag -> array) into dir as <flag>.npy, runs `golden <command>` with them,
/// `flags` and --out-dir dir/<out>, lists the output directory and, after a successful run, reads
/// back every .npy in it.
inline ForwardRun run_forward_cli(const TempDir& dir, const std::string& command,
                                  const std::vector<std::pair<std::string, npy::Array>>& inputs,
                                  const std::vector<std::string>& flags, const std::string& out) {
  ForwardRun run;
  run.args = {"golden", command};
  for (const auto& [flag, array] : inputs) {
    const std::string path = dir.file("in" + flag + ".npy");
    write_or_fail(path, array);
    run.args.insert(run.args.end(), {flag, path});
  }
  run.args.insert(run.args.end(), flags.begin(), flags.end());
  const std::string out_dir = dir.file(out);
  run.args.insert(run.args.end(), {"--out-dir", out_dir});
  run.result = run_cli(dir, run.args);
  run.files = files_in(out_dir);
  for (const std::string& name : run.files) {
    if (run.result.exit_code != 0) break;  // after an error the directory holds no new outputs
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".npy") != 0) continue;
    npy::Array a;
    const Status s = npy::read(out_dir + "/" + name, &a);
    EXPECT_TRUE(s.is_ok()) << s.message();
    run.outputs[name.substr(0, name.size() - 4)] = a;
  }
  return run;
}

inline std::string describe(const ForwardRun& run) { return describe(run.args, run.result); }

/// The file names a set of outputs gives.
inline std::set<std::string> npy_files(const std::vector<std::string>& names) {
  std::set<std::string> files;
  for (const std::string& name : names) files.insert(name + ".npy");
  return files;
}

/// Expects a successful run that wrote exactly `expected` (name -> array), nothing else.
inline void expect_outputs(const ForwardRun& run,
                           const std::map<std::string, npy::Array>& expected) {
  ASSERT_EQ(run.result.exit_code, 0) << describe(run);
  EXPECT_TRUE(run.result.err.empty()) << describe(run);
  std::vector<std::string> names;
  for (const auto& [name, array] : expected) names.push_back(name);
  EXPECT_EQ(run.files, npy_files(names)) << describe(run);
  for (const auto& [name, array] : expected) {
    auto found = run.outputs.find(name);
    ASSERT_NE(found, run.outputs.end()) << name << " not written\n" << describe(run);
    EXPECT_TRUE(same_array(array, found->second)) << name << "\n" << describe(run);
    EXPECT_NE(run.result.out.find("/" + name + ".npy: " + name + " " + dtype_name(array.dtype)),
              std::string::npos)
        << run.result.out;
  }
}

}  // namespace moe_routing::testing
