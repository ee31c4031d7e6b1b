#include "golden_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <utility>

#include "commands.h"
#include "file_io.h"

namespace moe_routing::cli {

Status make_directories(const std::string& command, const std::string& dir,
                        std::vector<std::string>* created, MakeDirectory make_directory) {
  std::string path;
  size_t position = 0;
  while (position <= dir.size()) {
    const size_t slash = dir.find('/', position);
    const size_t end = slash == std::string::npos ? dir.size() : slash;
    path = dir.substr(0, end);
    position = end + 1;
    if (path.empty() || path == "." || path == "..") continue;
    struct stat info;
    if (::stat(path.c_str(), &info) != 0) {
      if (make_directory(path.c_str(), 0777) == 0) {
        created->push_back(path);
        continue;
      }
      // EEXIST: another process created it since our stat(), or it is a symbolic link to
      // nothing (mkdir never follows a link, so its target is not created). Not ours to remove on
      // failure, and a directory is required of it as of one that was there before.
      if (errno != EEXIST || ::stat(path.c_str(), &info) != 0) {
        const int error = errno;
        struct stat link_info;
        if (error == ENOENT && ::lstat(path.c_str(), &link_info) == 0 && S_ISLNK(link_info.st_mode))
          return invalid_argument("moe-routing: ", command,
                                  ": --out-dir must not be or pass through a symbolic link to "
                                  "nothing (links are followed, their targets never created), "
                                  "got '",
                                  path, "', a link to '", file_io::link_target(path), "'");
        return invalid_argument("moe-routing: ", command, ": --out-dir must be creatable, got '",
                                std::strerror(error), "' for '", path, "'");
      }
    }
    if (!S_ISDIR(info.st_mode))
      return invalid_argument("moe-routing: ", command, ": --out-dir must be a directory, got '",
                              path, "', which is a file");
  }
  return Status::ok();
}

const char* const kBackendHelp =
    "implementation: automatic (CPU kernels), reference (plain loops) or cpu; all give the same "
    "bits";
const char* const kThreadsHelp =
    "CPU threads; 0 = library default (MOE_ROUTING_NUM_THREADS or every core)";

ExecConfig exec_config(const std::string& backend, int64_t threads) {
  ExecConfig config;
  config.backend = backend == "reference" ? Backend::reference
                   : backend == "cpu"     ? Backend::cpu
                                          : Backend::automatic;
  config.num_threads = int(threads);
  return config;
}

Output::Output(std::string name_, const OutputSpec& spec_) : name(std::move(name_)), spec(spec_) {}

TensorView Output::view() {
  if (!spec.produced) return TensorView();
  // A non-null pointer even when the output is empty (a vector's data() may be null then).
  void* data = array.bytes.empty() ? static_cast<void*>(&empty_) : array.bytes.data();
  return TensorView(data, spec.dtype, spec.ndim, spec.shape);
}

Status allocate_outputs(const std::string& command, uint64_t scratch_bytes,
                        std::vector<Output>* outputs) {
  uint64_t total = scratch_bytes;
  std::string what;
  for (const Output& output : *outputs) {
    if (!output.spec.produced) continue;
    uint64_t bytes = 0;  // saturated: a sum past 2^64 fits nowhere either
    if (__builtin_mul_overflow(uint64_t(output.spec.numel()), dtype_size(output.spec.dtype),
                               &bytes) ||
        __builtin_add_overflow(total, bytes, &total))
      total = ~uint64_t(0);
    what += std::string(what.empty() ? "" : ", ") + output.name + ' ' +
            dtype_name(output.spec.dtype) + ' ' + shape_string(output.spec);
  }
  MOE_ROUTING_RETURN_IF_ERROR(file_io::check_memory(total, command,
                                                    "the outputs (" + what +
                                                        ") and the operator's scratch memory (" +
                                                        std::to_string(scratch_bytes) + " bytes)"));
  for (Output& output : *outputs)
    if (output.spec.produced)
      MOE_ROUTING_RETURN_IF_ERROR(npy::allocate(
          output.spec.dtype,
          std::vector<int64_t>(output.spec.shape, output.spec.shape + output.spec.ndim), command,
          output.name, &output.array));
  return Status::ok();
}

Status Input::read(const std::string& flag, const std::string& path) {
  present = true;
  return npy::read(path, &array, flag);
}

TensorView Input::view() {
  if (!present) return TensorView();
  void* data = array.bytes.empty() ? static_cast<void*>(&empty) : array.bytes.data();
  return TensorView(data, array.dtype, int(array.shape.size()), array.shape.data());
}

int write_outputs(const std::string& command, const std::string& dir,
                  const std::vector<Output>& outputs, MakeDirectory make_directory) {
  std::vector<npy::OutputFile> files;
  for (const Output& output : outputs)
    if (output.spec.produced)
      files.push_back({dir + "/" + output.name + ".npy", &output.array, "--out-dir"});
  std::vector<std::string> created;
  Status s = make_directories(command, dir, &created, make_directory);
  if (s.is_ok()) s = npy::write_all(files);
  if (!s.is_ok()) {
    for (auto it = created.rbegin(); it != created.rend(); ++it) ::rmdir(it->c_str());
    return report_error(s);
  }
  for (const Output& output : outputs)
    if (output.spec.produced)
      std::cout << "wrote " << dir << "/" << output.name << ".npy: " << output.name << ' '
                << dtype_name(output.spec.dtype) << ' ' << shape_string(output.spec) << '\n';
  return kExitOk;
}

const char* const kAllOrNothing =
    R"(Every output is computed before anything is written; the files are then written as one
set into --out-dir (created if missing). On any error (a bad flag, an unreadable file, an input
the operator rejects, a failed write) the message goes to stderr, the exit status is 2, no file
is written or left behind, and the files of a previous run in --out-dir are as they were. An
output that is a FIFO or a device is written in place, one that is a symbolic link is written
through; none is replaced by a regular file. Files of outputs that the configuration does not
produce are neither written nor removed: use a fresh directory per configuration.)";

}  // namespace moe_routing::cli
