// What the golden commands share (golden.cpp, golden_routing.cpp, golden_finalize.cpp): the
// --backend / --threads flags, optional inputs, outputs sized by shape inference, the memory check
// before they are allocated, and the all-or-nothing write of an --out-dir set
// (docs/reliability.md).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe_routing/status.h"
#include "moe_routing/tensor.h"
#include "npy.h"

namespace moe_routing::cli {

/// The --backend and --threads help texts, and the ExecConfig they give.
extern const char* const kBackendHelp;
extern const char* const kThreadsHelp;
ExecConfig exec_config(const std::string& backend, int64_t threads);

/// What --out-dir promises, for the commands' help.
extern const char* const kAllOrNothing;

/// One output of an operator: its name (also the file's stem), its planned spec and storage
/// (allocated by allocate_outputs()).
struct Output {
  std::string name;
  OutputSpec spec;
  npy::Array array;

  Output(std::string name_, const OutputSpec& spec_);
  /// The view passed to the operator: the array when produced, else absent (data null).
  TensorView view();

 private:
  uint64_t empty_ = 0;
};

/// Allocates the storage of every produced output, after checking that the outputs and the
/// operator's scratch memory (`scratch_bytes`, which the operator allocates itself) fit in the
/// memory available together: before anything is allocated, so that a request too large for the
/// machine is a message, not the OOM killer.
Status allocate_outputs(const std::string& command, uint64_t scratch_bytes,
                        std::vector<Output>* outputs);

/// Reads an .npy input; a view with a non-null pointer even when the array is empty, and the
/// absent view when the input was not given.
struct Input {
  npy::Array array;
  bool present = false;
  uint64_t empty = 0;

  /// Reads `path`, given by `flag` (messages name both).
  Status read(const std::string& flag, const std::string& path);
  TensorView view();
};

/// How directories are created: ::mkdir, or in tests one that plays another process creating the
/// same path at the same moment.
using MakeDirectory = int (*)(const char* path, mode_t mode);

/// Creates `dir` and its missing parents, appending each directory that this call's mkdir created
/// to `created` (deepest last); one that another process creates meanwhile is used, not recorded.
/// An error when a component is not a directory, is a symbolic link to nothing (its target is
/// never created) or cannot be created.
Status make_directories(const std::string& command, const std::string& dir,
                        std::vector<std::string>* created, MakeDirectory make_directory = ::mkdir);

/// Writes every produced output as `<dir>/<name>.npy`, all or nothing: the directory (and missing
/// parents) is created (make_directories()), the files are written as one set (npy::write_all: on
/// failure the files previously there are as they were), and on failure every directory this call
/// created is removed again. Prints one line per file written. Returns the exit status.
int write_outputs(const std::string& command, const std::string& dir,
                  const std::vector<Output>& outputs, MakeDirectory make_directory = ::mkdir);

}  // namespace moe_routing::cli
