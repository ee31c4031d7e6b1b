// .npy reading and writing (tools/cli/npy.h): round trips for every dtype including 0-d and empty
// arrays, byte-for-byte agreement with files NumPy wrote, versions 2.0/3.0, a table of malformed
// files -> message, and atomic writes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "npy.h"

namespace moe_routing {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }

/// An .npy file as NumPy lays it out: preamble, the header dict padded with spaces to
/// `header_length` bytes (the last one '\n'), then the data.
Bytes npy_file(int major, const std::string& dict, size_t header_length, const Bytes& data) {
  std::string header = dict;
  header.append(header_length - dict.size() - 1, ' ');
  header += '\n';
  std::string file = std::string("\x93NUMPY") + char(major) + '\0';
  const int length_bytes = major == 1 ? 2 : 4;
  for (int b = 0; b < length_bytes; ++b) file += char((header.size() >> (8 * b)) & 0xff);
  Bytes out = bytes_of(file + header);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::string dict(const std::string& descr, const std::string& shape,
                 const char* fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

/// A fresh directory under the test temp dir, removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "moe_routing_npy_XXXXXX";
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    for (const std::string& f : created_) std::remove(f.c_str());
    rmdir(path_.c_str());
  }
  std::string file(const std::string& name) {
    created_.push_back(path_ + "/" + name);
    created_.push_back(path_ + "/" + name + ".tmp");
    return created_[created_.size() - 2];
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> created_;
};

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

npy::Array patterned(DType dtype, std::vector<int64_t> shape) {
  npy::Array array(dtype, std::move(shape));
  for (size_t i = 0; i < array.bytes.size(); ++i) array.bytes[i] = uint8_t(i * 37 + 11);
  return array;
}

const DType kAllDtypes[] = {DType::float32, DType::float16, DType::bfloat16,
                            DType::int8,    DType::int32,   DType::int64};

TEST(Npy, RoundTripEveryDtypeAndShape) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {2, 3}, {3, 0}, {0, 5, 2}, {2, 1, 3, 1, 2, 1, 1, 2}, {1000000000000, 0}};
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (DType dtype : kAllDtypes)
    for (const auto& shape : shapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " ndim " << shape.size());
      const npy::Array original = patterned(dtype, shape);
      Bytes file;
      ASSERT_TRUE(npy::encode(original, "mem", &file).is_ok());
      // Data starts at a multiple of 64 bytes, after a header ending in '\n'.
      const size_t header_length = file[8] | (size_t(file[9]) << 8);
      EXPECT_EQ((10 + header_length) % 64, 0u);
      EXPECT_EQ(file[10 + header_length - 1], '\n');
      EXPECT_EQ(file.size(), 10 + header_length + original.bytes.size());

      npy::Array parsed;
      Status s = npy::parse(file, "mem", &parsed);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(parsed.dtype, dtype);
      EXPECT_EQ(parsed.shape, shape);
      EXPECT_EQ(parsed.bytes, original.bytes);

      const std::string path = dir.file("a.npy");
      ASSERT_TRUE(npy::write(path, original).is_ok());
      EXPECT_FALSE(exists(path + ".tmp"));
      EXPECT_EQ(read_all(path), file);
      npy::Array from_disk;
      s = npy::read(path, &from_disk);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(from_disk.dtype, dtype);
      EXPECT_EQ(from_disk.shape, shape);
      EXPECT_EQ(from_disk.bytes, original.bytes);
    }
}

TEST(Npy, EncodesExactlyWhatNumpyWrites) {
  // Bytes of np.save (NumPy 2.4) for five arrays; header lengths 118 = 0x76.
  struct Case {
    npy::Array array;
    Bytes numpy;
  };
  npy::Array half(DType::float16, {2, 3});
  const uint16_t half_values[] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500};  // 0..5
  std::memcpy(half.bytes.data(), half_values, sizeof half_values);
  npy::Array scalar(DType::int64, {});
  scalar.bytes[0] = 7;
  npy::Array int8s(DType::int8, {3});
  int8s.bytes = {0xff, 0x02, 0x80};
  std::vector<Case> cases = {
      {half, npy_file(1, dict("<f2", "(2, 3)"), 118, half.bytes)},
      {scalar, npy_file(1, dict("<i8", "()"), 118, scalar.bytes)},
      {npy::Array(DType::bfloat16, {0, 3}), npy_file(1, dict("<u2", "(0, 3)"), 118, {})},
      {int8s, npy_file(1, dict("|i1", "(3,)"), 118, int8s.bytes)},
      {npy::Array(DType::float32, {12345678, 0}),
       npy_file(1, dict("<f4", "(12345678, 0)"), 118, {})},
  };
  for (const Case& c : cases) {
    Bytes encoded;
    ASSERT_TRUE(npy::encode(c.array, "mem", &encoded).is_ok());
    EXPECT_EQ(std::string(encoded.begin(), encoded.end()),
              std::string(c.numpy.begin(), c.numpy.end()));
    npy::Array parsed;
    ASSERT_TRUE(npy::parse(c.numpy, "mem", &parsed).is_ok());
    EXPECT_EQ(parsed.shape, c.array.shape);
    EXPECT_EQ(parsed.bytes, c.array.bytes);
  }
}

TEST(Npy, ReadsVersions2And3AndOtherHeaderSpellings) {
  const Bytes ints = {0x01, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x03, 0, 0, 0};  // 1, -2, 3
  struct Case {
    const char* name;
    Bytes file;
  };
  const std::vector<Case> cases = {
      {"version 2.0 (as NumPy writes it)", npy_file(2, dict("<i4", "(3,)"), 116, ints)},
      {"version 3.0", npy_file(3, dict("<i4", "(3,)"), 116, ints)},
      {"keys in another order, double quotes",
       npy_file(1, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<i4\"}", 118, ints)},
      {"python 2 long, no trailing comma",
       npy_file(1, "{'descr':'<i4','fortran_order':False,'shape':(3L,)}", 54, ints)},
      {"unpadded", npy_file(1, dict("<i4", "(3,)"), dict("<i4", "(3,)").size() + 1, ints)},
  };
  for (const Case& c : cases) {
    npy::Array a;
    Status s = npy::parse(c.file, "mem", &a);
    ASSERT_TRUE(s.is_ok()) << c.name << ": " << s.message();
    EXPECT_EQ(a.dtype, DType::int32) << c.name;
    EXPECT_EQ(a.shape, std::vector<int64_t>{3}) << c.name;
    EXPECT_EQ(a.bytes, ints) << c.name;
  }
}

TEST(Npy, ReadsEmptyArraysUpToNumpysSizeLimit) {
  // NumPy's limit: the element size times the non-zero extents below 2^63, zeros or not.
  struct Case {
    const char* descr;
    const char* shape;
    DType dtype;
    std::vector<int64_t> extents;
  };
  const std::vector<Case> cases = {
      {"<f4", "(0, 2305843009213693951)", DType::float32, {0, 2305843009213693951}},
      {"<f4", "(2305843009213693951, 0)", DType::float32, {2305843009213693951, 0}},
      {"|i1", "(9223372036854775807, 0, 1)", DType::int8, {9223372036854775807, 0, 1}},
  };
  for (const Case& c : cases) {
    npy::Array a;
    Status s = npy::parse(npy_file(1, dict(c.descr, c.shape), 118, {}), "mem", &a);
    ASSERT_TRUE(s.is_ok()) << c.shape << ": " << s.message();
    EXPECT_EQ(a.dtype, c.dtype) << c.shape;
    EXPECT_EQ(a.shape, c.extents) << c.shape;
    EXPECT_TRUE(a.bytes.empty()) << c.shape;
  }
  npy::Array a;
  Status s = npy::parse(npy_file(1, dict("<f4", "(0, 2305843009213693952)"), 118, {}), "mem", &a);
  EXPECT_EQ(s.message(),
            "moe-routing: mem: shape must describe fewer than 2^63 bytes counting its zero extents "
            "as 1 (NumPy's limit), got (0, 2305843009213693952)");
}

TEST(Npy, RejectsMalformedFilesWithClearMessages) {
  const Bytes six_floats(24, 0);
  // A version 1.0 file with the header length NumPy uses for these short headers.
  auto v1 = [&](const std::string& header, const Bytes& data) {
    return npy_file(1, header, 118, data);
  };
  struct Case {
    const char* name;
    Bytes file;
    const char* message;
  };
  Bytes bad_magic = v1(dict("<f4", "(6,)"), six_floats);
  bad_magic[1] = 'X';
  Bytes bad_version = v1(dict("<f4", "(6,)"), six_floats);
  bad_version[6] = 4;
  Bytes long_header = v1(dict("<f4", "(6,)"), {});
  long_header[9] = 0x10;  // declares 4214 header bytes
  Bytes truncated = v1(dict("<f4", "(2, 3)"), six_floats);
  truncated.resize(truncated.size() - 4);
  Bytes trailing = v1(dict("<f4", "(2, 3)"), six_floats);
  trailing.push_back(0);
  const std::vector<Case> cases = {
      {"empty file", {}, "file must be at least 10 bytes long (.npy preamble), got 0 bytes"},
      {"not npy", bytes_of("hello, world"),
       "file must start with the .npy magic string \\x93NUMPY, got hello,"},
      {"bad magic", bad_magic, "magic string \\x93NUMPY, got \\x93XUMPY"},
      {"version 4.0", bad_version, "format version must be 1.0, 2.0 or 3.0, got 4.0"},
      {"header past the end", long_header,
       "header must fit in the file (4214 bytes declared), got a file of 128"},
      {"fortran order", v1(dict("<f4", "(2, 3)", "True"), six_floats),
       "fortran_order must be False (C order; save np.ascontiguousarray(a)), got True"},
      {"big-endian", v1(dict(">f4", "(2, 3)"), six_floats),
       "descr must be little-endian ('<' or '|'), got '>f4'"},
      {"float64", v1(dict("<f8", "(3,)"), six_floats),
       "descr must be one of '<f4' (float32), '<f2' (float16), '<u2' (bfloat16), '|i1' (int8), "
       "'<i4' (int32), '<i8' (int64), got '<f8'"},
      {"uint8", v1(dict("|u1", "(24,)"), six_floats), "got '|u1'"},
      {"bool", v1(dict("|b1", "(24,)"), six_floats), "got '|b1'"},
      {"uint32", v1(dict("<u4", "(6,)"), six_floats), "got '<u4'"},
      {"structured",
       v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", six_floats),
       "structured dtypes are not supported"},
      {"missing shape", v1("{'descr': '<f4', 'fortran_order': False}", six_floats),
       "header must contain the key 'shape', got {'descr': '<f4', 'fortran_order': False}"},
      {"extra key",
       v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", six_floats),
       "header must be a dict like"},
      {"unknown key",
       v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 'y'}", six_floats),
       "header keys must be 'descr', 'fortran_order' and 'shape', got 'x'"},
      // Text from the file is quoted printable: no line break or terminal escape gets into the
      // one-line message.
      {"line break in a key",
       v1("{'de\nscr': '<f4', 'fortran_order': False, 'shape': (6,), }", six_floats),
       "header keys must be 'descr', 'fortran_order' and 'shape', got 'de?scr'"},
      {"escape in descr", v1(dict("<f\x1b[31m4", "(6,)"), six_floats),
       "'<i4' (int32), '<i8' (int64), got '<f?[31m4'"},
      {"line break in a big-endian descr", v1(dict(">f\n4", "(6,)"), six_floats),
       "descr must be little-endian ('<' or '|'), got '>f?4' (big-endian"},
      {"duplicate key",
       v1("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", six_floats),
       "header key 'descr' must appear once, got it twice"},
      {"negative dim", v1(dict("<f4", "(-6,)"), six_floats), "a non-negative integer in the shape"},
      // Python reads "(6)" as the integer 6 and refuses "06": so does NumPy, and so must we.
      {"one dim without its comma", v1(dict("<f4", "(6)"), six_floats),
       "a tuple, (n,) for one dimension"},
      {"leading zero", v1(dict("<f4", "(06,)"), six_floats),
       "a shape dimension without leading zeros"},
      {"shape not a tuple",
       v1("{'descr': '<f4', 'fortran_order': False, 'shape': '6'}", six_floats),
       "shape must be a tuple of integers"},
      {"fortran_order not a bool",
       v1("{'descr': '<f4', 'fortran_order': 'no', 'shape': (6,)}", six_floats),
       "fortran_order must be True or False"},
      {"not a dict", v1("[1, 2]", six_floats), "header must be a dict like"},
      {"junk after dict", v1(dict("<f4", "(6,)") + " x", six_floats),
       "nothing after the closing '}'"},
      {"nine dims", v1(dict("<f4", "(1, 1, 1, 1, 1, 1, 1, 1, 6)"), six_floats),
       "shape must have at most 8 dimensions, got 9 (1, 1, 1, 1, 1, 1, 1, 1, 6)"},
      {"huge shape", v1(dict("<f4", "(4611686018427387904, 4)"), six_floats),
       "shape must describe fewer than 2^63 bytes, got (4611686018427387904, 4)"},
      {"dim above 2^63", v1(dict("<f4", "(99999999999999999999,)"), six_floats),
       "a shape dimension below 2^63"},
      // Empty, but NumPy refuses the shape (its non-zero extents make 2^64 bytes): the outputs,
      // whose shapes follow, would be files NumPy cannot load.
      {"huge shape after a zero", v1(dict("<f4", "(0, 4611686018427387904, 4)"), {}),
       "shape must describe fewer than 2^63 bytes counting its zero extents as 1 (NumPy's "
       "limit), got (0, 4611686018427387904, 4)"},
      {"truncated data", truncated,
       "data must be 24 bytes for float32 (2, 3), got 20 bytes (truncated file)"},
      {"trailing data", trailing,
       "data must be 24 bytes for float32 (2, 3), got 25 bytes (trailing bytes)"},
      {"truncated 0-d", v1(dict("<i8", "()"), Bytes(4, 0)),
       "data must be 8 bytes for int64 (), got 4 bytes (truncated file)"},
  };
  for (const Case& c : cases) {
    npy::Array out;
    out.shape = {42};
    Status s = npy::parse(c.file, "in.npy", &out);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << c.name;
    EXPECT_EQ(s.message().rfind("moe-routing: in.npy: ", 0), 0u) << c.name << ": " << s.message();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.name << ": " << s.message();
    EXPECT_EQ(out.shape, std::vector<int64_t>{42}) << c.name << ": output changed on error";
  }
}

TEST(Npy, ReadReportsMissingFilesAndDirectories) {
  TempDir dir;
  npy::Array a;
  Status s = npy::read(dir.path() + "/missing.npy", &a);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("missing.npy: file must be readable, got 'No such file or directory'"),
            std::string::npos)
      << s.message();
  s = npy::read(dir.path(), &a);
  EXPECT_NE(s.message().find("file must be readable, got 'Is a directory'"), std::string::npos)
      << s.message();
}

TEST(Npy, FailedWritesLeaveNothingBehind) {
  TempDir dir;
  // Missing directory: no output, no temporary.
  const std::string nowhere = dir.path() + "/no/such/dir/out.npy";
  Status s = npy::write(nowhere, patterned(DType::float32, {2}));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("out.npy: output must be writable"), std::string::npos) << s.message();
  EXPECT_FALSE(exists(nowhere));
  EXPECT_FALSE(exists(nowhere + ".tmp"));

  // An array whose bytes do not match its shape is refused before anything is opened, and an
  // existing file keeps its contents.
  const std::string path = dir.file("keep.npy");
  ASSERT_TRUE(npy::write(path, patterned(DType::int32, {3})).is_ok());
  const Bytes before = read_all(path);
  npy::Array inconsistent = patterned(DType::int32, {3});
  inconsistent.bytes.pop_back();
  s = npy::write(path, inconsistent);
  EXPECT_NE(s.message().find("data must be 12 bytes for int32 (3,), got 11 bytes"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(read_all(path), before);
  EXPECT_FALSE(exists(path + ".tmp"));

  // Success replaces the old contents.
  ASSERT_TRUE(npy::write(path, patterned(DType::int8, {5})).is_ok());
  npy::Array back;
  ASSERT_TRUE(npy::read(path, &back).is_ok());
  EXPECT_EQ(back.dtype, DType::int8);
  EXPECT_EQ(back.shape, std::vector<int64_t>{5});
}

/// The names in a directory, "." and ".." left out.
std::vector<std::string> names_in(const std::string& directory) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(directory.c_str())) {
    while (const dirent* entry = ::readdir(d))
      if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0)
        names.push_back(entry->d_name);
    ::closedir(d);
  }
  return names;
}

TEST(Npy, WritesAndReplacesNamesOfTheLongestLengthAFileSystemTakes) {
  // The temporary and the backup beside an output took its name plus 11 bytes, past the 255
  // bytes of a file name: an output named 245-255 bytes long could not be written.
  TempDir dir;
  for (size_t length : {size_t(244), size_t(245), size_t(255)}) {
    const std::string name = std::string(length - 4, 'c') + ".npy";
    const std::string path = dir.file(name);
    ASSERT_TRUE(npy::write(path, patterned(DType::int32, {3})).is_ok()) << length;
    Status s = npy::write(path, patterned(DType::int8, {5}));  // a replace: temporary and backup
    ASSERT_TRUE(s.is_ok()) << length << ": " << s.message();
    npy::Array back;
    ASSERT_TRUE(npy::read(path, &back).is_ok());
    EXPECT_EQ(back.shape, std::vector<int64_t>{5});
    EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{name}) << "left behind";
    std::remove(path.c_str());
  }
}

TEST(Npy, ReplacingKeepsTheModeAndRefusesAFileTheUserMayNotWrite) {
  // A replaced output took the new file's mode (0666 less the umask): a private file became
  // world-readable, and a read-only one was replaced where only the directory was writable.
  TempDir dir;
  const std::string path = dir.file("private.npy");
  ASSERT_TRUE(npy::write(path, patterned(DType::int32, {3})).is_ok());
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ASSERT_TRUE(npy::write(path, patterned(DType::int32, {4})).is_ok());
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600u);

  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  const Bytes before = read_all(path);
  const Status s = npy::write(path, patterned(DType::int32, {5}));
  if (::geteuid() == 0) {  // root may write any file, as NumPy's np.save could
    EXPECT_TRUE(s.is_ok()) << s.message();
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 07777, 0444u);
  } else {
    EXPECT_NE(s.message().find("private.npy: output must be writable, got 'Permission denied'"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(read_all(path), before);
  }
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"private.npy"}) << "left behind";
  ::chmod(path.c_str(), 0600);
}

TEST(Npy, EncodeRejectsWhatCannotBeWritten) {
  Bytes file;
  npy::Array nine(DType::float32, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  Status s = npy::encode(nine, "x.npy", &file);
  EXPECT_NE(s.message().find("moe-routing: x.npy: shape must have at most 8 dimensions, got 9"),
            std::string::npos)
      << s.message();
  npy::Array negative;
  negative.shape = {-1};
  s = npy::encode(negative, "x.npy", &file);
  EXPECT_NE(s.message().find("shape must be non-negative, got (-1,)"), std::string::npos)
      << s.message();
  // An empty array NumPy could not load (np.load: "array is too big").
  npy::Array too_big;
  too_big.dtype = DType::float32;
  too_big.shape = {4611686018427387904, 0, 4};
  s = npy::encode(too_big, "x.npy", &file);
  EXPECT_EQ(s.message(),
            "moe-routing: x.npy: shape must describe fewer than 2^63 bytes counting its zero "
            "extents as 1 (NumPy's limit), got (4611686018427387904, 0, 4)");
  npy::Array bad_dtype;
  bad_dtype.dtype = static_cast<DType>(99);
  bad_dtype.shape = {0};
  s = npy::encode(bad_dtype, "x.npy", &file);
  EXPECT_NE(s.message().find("dtype must be one of '<f4' (float32)"), std::string::npos)
      << s.message();
}

TEST(Npy, ViewDescribesTheArray) {
  npy::Array a = patterned(DType::bfloat16, {4, 0, 3});
  TensorView v = a.view();
  EXPECT_EQ(v.dtype, DType::bfloat16);
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.shape[0], 4);
  EXPECT_EQ(v.shape[1], 0);
  EXPECT_EQ(v.shape[2], 3);
  EXPECT_EQ(v.numel(), 0);
  npy::Array scalar = patterned(DType::float32, {});
  const npy::Array& const_scalar = scalar;
  TensorView s = const_scalar.view();
  EXPECT_EQ(s.ndim, 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.data, scalar.bytes.data());
  EXPECT_STREQ(npy::descr_for(DType::bfloat16), "<u2");
  EXPECT_STREQ(npy::descr_for(DType::int8), "|i1");
}

}  // namespace
}  // namespace moe_routing
