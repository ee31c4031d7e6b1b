#include "file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>

namespace moe_routing::file_io {
namespace {

// --- memory -----------------------------------------------------------------------------------

/// The first number of a small text file (a cgroup's memory.max, limit_in_bytes, usage), or -1
/// when the file is missing or holds no number ("max": no limit).
int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  long long value = -1;
  if (!(in >> value)) return -1;
  return value;
}

/// The cgroup memory limit less the usage, v2 or v1, from the first directory that has one: the
/// process's own cgroup (/proc/self/cgroup), then the hierarchy's root (what a container sees).
/// -1 when there is no limit or nothing is readable.
int64_t cgroup_headroom() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  std::string v2_path, v1_path;
  while (std::getline(cgroups, line)) {
    if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
    const size_t memory = line.find(":memory:");
    if (memory != std::string::npos) v1_path = line.substr(memory + 8);
  }
  struct Candidate {
    std::string directory;
    const char* limit;
    const char* usage;
  };
  const Candidate candidates[] = {
      {"/sys/fs/cgroup" + v2_path, "memory.max", "memory.current"},
      {"/sys/fs/cgroup", "memory.max", "memory.current"},
      {"/sys/fs/cgroup/memory" + v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes"},
      {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"},
  };
  for (const Candidate& c : candidates) {
    const int64_t limit = read_number(c.directory + "/" + c.limit);
    if (limit <= 0) continue;
    // v1 reports "no limit" as a huge page-rounded number: anything beyond 2^60 is no limit.
    if (limit > (int64_t(1) << 60)) return -1;
    const int64_t usage = std::max<int64_t>(read_number(c.directory + "/" + c.usage), 0);
    return std::max<int64_t>(limit - usage, 0);
  }
  return -1;
}

std::string gibibytes(uint64_t bytes) {
  std::ostringstream text;
  text << bytes << " bytes (" << std::fixed << std::setprecision(1)
       << double(bytes) / double(uint64_t(1) << 30) << " GiB)";
  return text.str();
}

// --- output -----------------------------------------------------------------------------------

Status write_error(const std::string& label, int error_number) {
  return file_error(label, "output must be writable, got '", std::strerror(error_number), "'");
}

/// Writes every piece to `fd`, resuming after partial writes and interrupted calls. Returns 0 or
/// the errno of the failure.
int write_pieces(int fd, const std::vector<Piece>& pieces) {
  for (const Piece& piece : pieces) {
    const char* p = static_cast<const char*>(piece.data);
    size_t left = piece.size;
    while (left > 0) {
      // At most 1 GiB per call: Linux writes at most about 2 GiB at a time anyway.
      const ssize_t written = ::write(fd, p, std::min<size_t>(left, size_t(1) << 30));
      if (written < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (written == 0) return EIO;
      p += written;
      left -= size_t(written);
    }
  }
  return 0;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// The longest file name (one path component) this tool makes beside an output: Linux's
/// NAME_MAX, which every common file system of it shares.
constexpr size_t kNameMax = 255;

/// `<path>.<6 random letters or digits><suffix>`: a name beside `path` for a temporary or a
/// backup, its last component cut short where it would exceed kNameMax (an output name of up to
/// kNameMax bytes must still get one). Callers create it exclusively and draw again when it
/// exists, so the name only has to be unlikely to collide, across processes too (the seed mixes
/// the pid, the clock and the OS's entropy). The tool is single-threaded where it writes files.
std::string random_name(const std::string& path, const char* suffix) {
  static std::mt19937_64 engine([] {
    std::random_device entropy;
    return (uint64_t(entropy()) << 32) ^ uint64_t(entropy()) ^ (uint64_t(::getpid()) << 20) ^
           uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t added = 1 + 6 + std::strlen(suffix);  // ".", the letters, the suffix
  const size_t keep = std::min(path.size() - base, kNameMax - added);
  std::string name = path.substr(0, base + keep) + '.';
  for (int i = 0; i < 6; ++i) name += kAlphabet[engine() % (sizeof kAlphabet - 1)];
  return name + suffix;
}

constexpr int kNameAttempts = 100;

/// Creates a new empty file `<path>.XXXXXX<suffix>` exclusively (never one that exists); returns
/// its descriptor (open for writing) and name, or -1 with errno set.
int create_unique(const std::string& path, const char* suffix, std::string* name) {
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    *name = random_name(path, suffix);
    const int fd = ::open(name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;  // errno is EEXIST
}

/// Holds an exclusive flock on each directory of a set of outputs, taken in sorted order (so two
/// runs never wait for each other crosswise). Advisory and best effort: a directory that cannot
/// be opened or locked (missing, unreadable, a file system without locks) is simply not locked.
class DirectoryLocks {
 public:
  explicit DirectoryLocks(const std::vector<OutputFile>& files) {
    std::vector<std::string> directories;
    for (const OutputFile& file : files) directories.push_back(directory_of(file.path));
    std::sort(directories.begin(), directories.end());
    directories.erase(std::unique(directories.begin(), directories.end()), directories.end());
    for (const std::string& directory : directories) {
      const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) continue;
      while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
      }
      fds_.push_back(fd);  // closing the descriptor releases the lock
    }
  }
  ~DirectoryLocks() {
    for (int fd : fds_) ::close(fd);
  }
  DirectoryLocks(const DirectoryLocks&) = delete;
  DirectoryLocks& operator=(const DirectoryLocks&) = delete;

 private:
  std::vector<int> fds_;
};

/// What write_all() does with one output, and how far it got (for the rollback).
struct Destination {
  enum Kind { create, replace, in_place } kind = create;
  std::string target;          // the regular file created or replaced, or the file written in place
  std::string temporary;       // create, replace: the new contents, renamed onto target to commit
  std::string backup;          // replace: the previous contents' second name
  bool backup_is_link = true;  // false: an empty placeholder that the previous file moves onto
  bool moved_aside = false;    // the previous file sits at `backup`, `target` is free
  bool committed = false;      // the new contents are at `target`
  struct stat replaced {};     // replace: the previous file's mode and owner, which the new keeps
};

/// Decides how `file` is written; a directory or a link to nothing is an error.
Status classify(const OutputFile& file, Destination* d) {
  struct stat link_info;
  if (::lstat(file.path.c_str(), &link_info) != 0) {
    // A missing parent directory is reported when the temporary cannot be created.
    if (errno != ENOENT) return write_error(file.label, errno);
    d->kind = Destination::create;
    d->target = file.path;
    return Status::ok();
  }
  struct stat info = link_info;
  if (S_ISLNK(link_info.st_mode) && ::stat(file.path.c_str(), &info) != 0) {
    if (errno != ENOENT) return write_error(file.label, errno);
    return file_error(file.label,
                      "output must not be a symbolic link to nothing (links are written "
                      "through, never replaced), got a link to '",
                      link_target(file.path), "'");
  }
  if (S_ISDIR(info.st_mode)) return write_error(file.label, EISDIR);
  if (!S_ISREG(info.st_mode)) {
    d->kind = Destination::in_place;
    d->target = file.path;
    return Status::ok();
  }
  // A file the user may not write (read-only to them) is not replaced behind their back, as the
  // directory's permissions alone would allow.
  if (::access(file.path.c_str(), W_OK) != 0) return write_error(file.label, errno);
  d->kind = Destination::replace;
  d->target = file.path;
  d->replaced = info;
  if (S_ISLNK(link_info.st_mode)) {
    char* resolved = ::realpath(file.path.c_str(), nullptr);
    if (resolved == nullptr) return write_error(file.label, errno);
    d->target = resolved;
    std::free(resolved);
  }
  return Status::ok();
}

/// Writes the new contents into a fresh temporary beside the target and flushes them to disk.
Status write_temporary(const OutputFile& file, Destination* d) {
  const int fd = create_unique(d->target, ".tmp", &d->temporary);
  if (fd < 0) {
    d->temporary.clear();
    return write_error(file.label, errno);
  }
  int error = write_pieces(fd, file.pieces);
  if (error == 0 && d->kind == Destination::replace) {
    // The new file takes the replaced one's owner (where this process may give it: root, or the
    // owner itself) and then its permission bits, as a write into the old file would keep them.
    if (::fchown(fd, d->replaced.st_uid, d->replaced.st_gid) != 0) {
      // Not permitted: the new file stays this process's own.
    }
    if (::fchmod(fd, d->replaced.st_mode & 07777) != 0) error = errno;
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0 && errno != EINTR) error = errno;
  return error == 0 ? Status::ok() : write_error(file.label, error);
}

/// Gives the previous contents of a replaced target a second name, so the rollback can restore
/// them: a hard link where the file system has them, else a placeholder the file moves onto.
Status make_backup(const OutputFile& file, Destination* d) {
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    d->backup = random_name(d->target, ".old");
    if (::link(d->target.c_str(), d->backup.c_str()) == 0) return Status::ok();
    if (errno != EEXIST) break;
  }
  d->backup_is_link = false;
  const int fd = create_unique(d->target, ".old", &d->backup);
  if (fd < 0) {
    d->backup.clear();
    return write_error(file.label, errno);
  }
  ::close(fd);
  return Status::ok();
}

Status write_in_place(const OutputFile& file, const Destination& d) {
  const int fd = ::open(d.target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return write_error(file.label, errno);
  int error = write_pieces(fd, file.pieces);
  if (::close(fd) != 0 && error == 0 && errno != EINTR) error = errno;
  return error == 0 ? Status::ok() : write_error(file.label, error);
}

/// Puts the new contents at the target: one atomic rename (the backup link keeps the old ones).
Status commit(const OutputFile& file, Destination* d) {
  if (d->kind == Destination::replace && !d->backup_is_link) {
    if (std::rename(d->target.c_str(), d->backup.c_str()) != 0)
      return write_error(file.label, errno);
    d->moved_aside = true;
  }
  if (std::rename(d->temporary.c_str(), d->target.c_str()) != 0)
    return write_error(file.label, errno);
  d->temporary.clear();
  d->committed = true;
  return Status::ok();
}

/// Undoes whatever happened to `d`: the previous contents go back to the target, and no
/// temporary or backup remains. Best effort: a step that fails leaves the rest to do.
void roll_back(Destination* d) {
  if (d->committed && d->kind == Destination::create) ::unlink(d->target.c_str());
  if ((d->committed && d->kind == Destination::replace) || d->moved_aside) {
    if (std::rename(d->backup.c_str(), d->target.c_str()) == 0) d->backup.clear();
  }
  if (!d->temporary.empty()) ::unlink(d->temporary.c_str());
  if (!d->backup.empty()) ::unlink(d->backup.c_str());
}

}  // namespace

std::string label(const std::string& flag, const std::string& path) {
  return flag.empty() ? path : flag + " " + path;
}

std::string link_target(const std::string& path) {
  char target[4096];
  const ssize_t length = ::readlink(path.c_str(), target, sizeof target);
  return std::string(target, length > 0 ? size_t(length) : 0);
}

int64_t available_memory() {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0, mem_available = -1, swap_free = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") mem_available = kib;
    if (key == "SwapFree:") swap_free = kib;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (mem_available >= 0) available = (mem_available + swap_free) * 1024;
  const int64_t headroom = cgroup_headroom();
  if (headroom >= 0 && (available < 0 || headroom < available)) available = headroom;
  // An address-space limit (ulimit -v) less the address space already mapped: beyond it an
  // allocation fails outright.
  struct rlimit limit;
  long long mapped_pages = 0;
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      std::ifstream("/proc/self/statm") >> mapped_pages) {
    const int64_t mapped = int64_t(mapped_pages) * int64_t(::sysconf(_SC_PAGESIZE));
    const int64_t room = std::max<int64_t>(int64_t(limit.rlim_cur) - mapped, 0);
    if (available < 0 || room < available) available = room;
  }
  return available;
}

Status check_memory(uint64_t bytes, const std::string& label, const std::string& what) {
  const int64_t available = available_memory();
  if (available < 0 || bytes <= uint64_t(available)) return Status::ok();
  return runtime_error("moe-routing: ", label, ": ", what, " (", gibibytes(bytes),
                       ") must fit in the memory available, got ", gibibytes(uint64_t(available)));
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status InputFile::open(const std::string& path, const std::string& label) {
  label_ = label;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) return file_error(label_, "file must be readable, got '", std::strerror(errno), "'");
  struct stat info;
  if (::fstat(fd_, &info) != 0)
    return file_error(label_, "file must be readable, got '", std::strerror(errno), "'");
  if (S_ISDIR(info.st_mode))
    return file_error(label_, "file must be readable, got '", std::strerror(EISDIR), "'");
  if (S_ISREG(info.st_mode)) size_ = int64_t(info.st_size);
  return Status::ok();
}

Status InputFile::read(void* out, size_t count, size_t* got) {
  char* p = static_cast<char*>(out);
  *got = 0;
  while (*got < count) {
    const ssize_t n = ::read(fd_, p + *got, std::min<size_t>(count - *got, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return file_error(label_, "file must be readable, got '", std::strerror(errno), "'");
    }
    if (n == 0) break;
    *got += size_t(n);
  }
  return Status::ok();
}

Status check_writable(const std::string& path, const std::string& label) {
  struct stat info;
  if (::stat(path.c_str(), &info) == 0) {  // an existing output: not a directory, and writable
    if (S_ISDIR(info.st_mode)) return write_error(label, EISDIR);
    if (::access(path.c_str(), W_OK) != 0) return write_error(label, errno);
  }
  if (::access(directory_of(path).c_str(), W_OK | X_OK) != 0) return write_error(label, errno);
  return Status::ok();
}

Status write_all(const std::vector<OutputFile>& files) {
  DirectoryLocks locks(files);
  std::vector<Destination> destinations(files.size());
  Status s = Status::ok();
  for (size_t i = 0; i < files.size() && s.is_ok(); ++i) s = classify(files[i], &destinations[i]);
  // Everything that can be prepared without touching what is at the paths, then the in-place
  // writes (which cannot be taken back, so they come after every step that is likelier to fail),
  // then the renames.
  for (size_t i = 0; i < files.size() && s.is_ok(); ++i)
    if (destinations[i].kind != Destination::in_place)
      s = write_temporary(files[i], &destinations[i]);
  for (size_t i = 0; i < files.size() && s.is_ok(); ++i)
    if (destinations[i].kind == Destination::replace) s = make_backup(files[i], &destinations[i]);
  for (size_t i = 0; i < files.size() && s.is_ok(); ++i)
    if (destinations[i].kind == Destination::in_place)
      s = write_in_place(files[i], destinations[i]);
  for (size_t i = 0; i < files.size() && s.is_ok(); ++i)
    if (destinations[i].kind != Destination::in_place) s = commit(files[i], &destinations[i]);
  if (!s.is_ok()) {
    for (auto d = destinations.rbegin(); d != destinations.rend(); ++d) roll_back(&*d);
    return s;
  }
  for (const Destination& d : destinations)
    if (!d.backup.empty()) ::unlink(d.backup.c_str());
  return Status::ok();
}

}  // namespace moe_routing::file_io
