// The moe-routing tool's file layer: how inputs are read and outputs written, so that the
// command-line promises of docs/reliability.md hold for every command.
//
// - Every message about a file names it as the user gave it, flag first: `moe-routing: --out
//   g.npy: output must be writable, got 'No space left on device'` (label()).
// - Sizes are checked against the memory this process can still fill before anything that large
//   is allocated (check_memory()), so a corrupt header or an absurd shape is an error message, not
//   a visit from the kernel's OOM killer.
// - Outputs are written as one set (write_all()): all of them appear or none changes; a regular
//   file is replaced atomically through a uniquely named temporary beside it; FIFOs and devices
//   are written in place and symbolic links are written through, never replaced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_routing/status.h"

namespace moe_routing::file_io {

/// How messages name a file: "--grad-expanded-x g.npy", or the path alone without a flag.
std::string label(const std::string& flag, const std::string& path);

/// What the symbolic link `path` points to, as written in the link; empty when it is not a link
/// or cannot be read.
std::string link_target(const std::string& path);

/// `moe-routing: <label>: <parts...>`, an invalid_argument Status (exit status 2 in the tool).
template <typename... Parts>
Status file_error(const std::string& label, const Parts&... parts) {
  return invalid_argument("moe-routing: ", label, ": ", parts...);
}

/// Bytes this process can still fill: MemAvailable + SwapFree of /proc/meminfo, bounded by its
/// cgroup's memory limit less the cgroup's usage (v2 or v1) and by its address-space limit
/// (RLIMIT_AS) less what it has mapped. -1 when none of these is known.
int64_t available_memory();

/// OK when `bytes` fit in available_memory() (or it is unknown); otherwise a runtime_error
/// `moe-routing: <label>: <what> must fit in the memory available, got <n> bytes (<x> GiB) to hold
/// <m> bytes (<y> GiB)`. Call it before allocating anything proportional to a file's or a flag's
/// claim: the kernel overcommits, so an allocation that cannot be backed succeeds and the process
/// is killed later, without a message, when the pages are touched.
Status check_memory(uint64_t bytes, const std::string& label, const std::string& what);

/// An input opened for reading: a regular file (its size known up front) or a stream (FIFO,
/// character device, /dev/stdin), read until end of file.
class InputFile {
 public:
  InputFile() = default;
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Opens `path` for reading; `label` names it in messages. A directory is an error.
  Status open(const std::string& path, const std::string& label);
  /// The file's size in bytes when it is a regular file, else -1 (a stream: the size is only
  /// known at end of file).
  int64_t size() const { return size_; }
  /// Reads up to `count` bytes into `out`; `*got` < count only at end of file.
  Status read(void* out, size_t count, size_t* got);
  const std::string& label() const { return label_; }

 private:
  int fd_ = -1;
  int64_t size_ = -1;
  std::string label_;
};

/// One run of bytes of an output's contents; pieces are written one after another, so data is
/// written from where it lies, never copied into a file image first.
struct Piece {
  const void* data = nullptr;
  size_t size = 0;
};

/// One output of a write_all() set.
struct OutputFile {
  std::string path;
  std::string label;  // names the file in messages, e.g. label("--out", path)
  std::vector<Piece> pieces;
};

/// Whether write_all() could write `path` as far as can be told before anything is written: not
/// a directory, and its directory exists and is writable. For commands that compute for long
/// before they write (bench --csv): a path that can never be written is an error at once, in
/// write_all()'s words, instead of after the run.
Status check_writable(const std::string& path, const std::string& label);

/// Writes `files` as one set: all of them appear, or none of the files previously at their paths
/// changes. Per path:
/// - absent or a regular file: the contents go to a uniquely named temporary beside it
///   (`<path>.XXXXXX.tmp`, created exclusively: a user's own `<path>.tmp` is never touched, and
///   concurrent runs never share one), flushed to disk, and renamed onto the path only once every
///   output of the set is complete. A file being replaced is first hard-linked to a uniquely named
///   backup, so a failure in the middle of the renames puts every earlier file back.
/// - a symbolic link: written through; the link stays, its target is created or replaced as
///   above. A link to nothing is an error.
/// - a FIFO, a character or block device: written in place (opening a FIFO waits for a reader),
///   before the renames; bytes already sent there cannot be taken back.
/// - a directory: an error.
/// Each directory of the set is locked (flock) while the set is written, so concurrent runs
/// writing the same outputs commit one whole set after the other. On error no temporary or backup
/// remains and the Status names the file by its label.
Status write_all(const std::vector<OutputFile>& files);

}  // namespace moe_routing::file_io
