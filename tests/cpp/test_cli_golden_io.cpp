// How the golden commands create --out-dir (tools/cli/golden_io.h), in process: another process
// that creates a directory of the path between our stat() and our mkdir() is played by the mkdir
// the test passes in. What it created is never claimed as ours (so a failed run does not remove
// it), and what it created must be a directory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "golden_io.h"

namespace moe_routing::cli {
namespace {

using moe_routing::testing::TempDir;

std::string race_path;  // the path the racer creates just before our mkdir() of it

bool is_directory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

/// The racer creates race_path as a directory first, so our mkdir() of it fails with EEXIST.
int racer_makes_a_directory(const char* path, mode_t mode) {
  if (path != race_path) return ::mkdir(path, mode);
  EXPECT_EQ(::mkdir(path, 0777), 0) << path;
  errno = EEXIST;
  return -1;
}

/// The racer creates race_path as a regular file first.
int racer_makes_a_file(const char* path, mode_t mode) {
  if (path != race_path) return ::mkdir(path, mode);
  std::ofstream(path) << "not a directory";
  errno = EEXIST;
  return -1;
}

TEST(CliOutDir, ADirectoryAnotherProcessCreatesIsUsedButNotClaimed) {
  TempDir dir;
  race_path = dir.file("theirs");
  const std::string out = race_path + "/ours";
  std::vector<std::string> created;
  const Status s = make_directories("golden grad", out, &created, racer_makes_a_directory);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(created, std::vector<std::string>{out});
  EXPECT_TRUE(is_directory(out));
}

TEST(CliOutDir, AFileAnotherProcessCreatesIsRefused) {
  TempDir dir;
  const std::string parent = dir.file("ours");
  race_path = parent + "/theirs";
  std::vector<std::string> created;
  const Status s =
      make_directories("golden grad", race_path + "/out", &created, racer_makes_a_file);
  EXPECT_EQ(s.message(), "moe-routing: golden grad: --out-dir must be a directory, got '" +
                             race_path + "', which is a file");
  EXPECT_EQ(created, std::vector<std::string>{parent});
  EXPECT_EQ(moe_routing::testing::read_text(race_path), "not a directory");
}

TEST(CliOutDir, AFailedRunRemovesOnlyTheDirectoriesItCreated) {
  TempDir dir;
  race_path = dir.file("theirs");
  const std::string out = race_path + "/ours";
  OutputSpec spec;
  spec.produced = true;
  spec.ndim = 1;
  spec.shape[0] = 2;
  // Its file lies in a directory that does not exist: the write fails after --out-dir is made.
  std::vector<Output> outputs = {Output("missing/x", spec)};
  outputs[0].array = npy::Array(DType::float32, {2});
  ::testing::internal::CaptureStderr();
  const int exit_code = write_outputs("golden grad", out, outputs, racer_makes_a_directory);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(exit_code, 2) << err;
  EXPECT_EQ(err.rfind("moe-routing: --out-dir " + out + "/missing/x.npy: ", 0), 0u) << err;
  EXPECT_FALSE(moe_routing::testing::exists(out)) << "the directory the run created was left";
  EXPECT_TRUE(is_directory(race_path)) << "the other process's directory was removed";
}

}  // namespace
}  // namespace moe_routing::cli
