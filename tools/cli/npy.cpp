#include "npy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

namespace moe_routing::npy {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              ".npy data is little-endian and is copied as is: a big-endian host needs byte swaps");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlignment = 64;         // data offset of written files, as NumPy's
constexpr size_t kGrowthAxisDigits = 21;  // header room NumPy leaves for the first axis

struct DescrEntry {
  const char* descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::float32}, {"<f2", DType::float16}, {"<u2", DType::bfloat16},
    {"|i1", DType::int8},    {"<i4", DType::int32},   {"<i8", DType::int64},
};

std::string accepted_descrs() {
  std::string text;
  for (const DescrEntry& entry : kDescrs) {
    if (!text.empty()) text += ", ";
    text += std::string("'") + entry.descr + "' (" + dtype_name(entry.dtype) + ")";
  }
  return text;
}

template <typename... Parts>
Status file_error(const std::string& name, const Parts&... parts) {
  return invalid_argument("moe-routing: ", name, ": ", parts...);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '(';
  for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  if (shape.size() == 1) out << ',';
  out << ')';
  return out.str();
}

/// Header text for messages: printable, without the padding, cut after 120 characters.
std::string quote_header(const std::string& header) {
  size_t end = header.size();
  while (end > 0 && (header[end - 1] == ' ' || header[end - 1] == '\n')) --end;
  std::string text;
  for (size_t i = 0; i < end; ++i) {
    if (text.size() >= 120) return text + "...";
    text += (header[i] >= 32 && header[i] < 127) ? header[i] : '?';
  }
  return text;
}

/// The value of one header entry: a string, a boolean or a tuple of non-negative integers.
struct HeaderValue {
  enum Kind { string, boolean, tuple } kind = string;
  std::string text;
  bool flag = false;
  std::vector<int64_t> numbers;
};

/// Parses the header's Python dict literal, e.g.
/// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : text_(text) {}

  /// False with `error` set when the text is not such a dict.
  bool parse(std::vector<std::pair<std::string, HeaderValue>>* entries, std::string* error) {
    skip_space();
    if (!eat('{')) return fail("a '{'", error);
    skip_space();
    while (!eat('}')) {
      std::string key;
      if (!parse_string(&key)) return fail("a quoted key", error);
      skip_space();
      if (!eat(':')) return fail("':' after a key", error);
      skip_space();
      HeaderValue value;
      if (!parse_value(&value, error)) return false;
      entries->emplace_back(key, value);
      skip_space();
      if (eat(',')) {
        skip_space();
      } else if (peek() != '}') {
        return fail("',' or '}'", error);
      }
    }
    skip_space();
    if (pos_ != text_.size()) return fail("nothing after the closing '}'", error);
    return true;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool fail(const char* expected, std::string* error) {
    std::ostringstream out;
    out << expected << " at column " << pos_;
    *error = out.str();
    return false;
  }
  bool parse_string(std::string* out) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') return false;
    ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      // Escapes never occur in the keys and descrs we accept.
      if (text_[pos_] == '\\') return false;
      *out += text_[pos_++];
    }
    return eat(quote);
  }
  bool parse_word(const char* word) {
    const size_t n = std::strlen(word);
    if (text_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  bool parse_value(HeaderValue* value, std::string* error) {
    const char c = peek();
    if (c == '\'' || c == '"') {
      value->kind = HeaderValue::string;
      if (!parse_string(&value->text)) return fail("a closed string", error);
      return true;
    }
    if (parse_word("True")) {
      value->kind = HeaderValue::boolean;
      value->flag = true;
      return true;
    }
    if (parse_word("False")) {
      value->kind = HeaderValue::boolean;
      value->flag = false;
      return true;
    }
    if (c == '(') {
      ++pos_;
      value->kind = HeaderValue::tuple;
      skip_space();
      while (!eat(')')) {
        if (peek() < '0' || peek() > '9') return fail("a non-negative integer in the shape", error);
        int64_t number = 0;
        while (peek() >= '0' && peek() <= '9') {
          const int digit = peek() - '0';
          if (number > (std::numeric_limits<int64_t>::max() - digit) / 10)
            return fail("a shape dimension below 2^63", error);
          number = number * 10 + digit;
          ++pos_;
        }
        eat('L');  // Python 2 longs, as old NumPy versions wrote them
        value->numbers.push_back(number);
        skip_space();
        if (eat(',')) {
          skip_space();
        } else if (peek() != ')') {
          return fail("',' or ')' in the shape", error);
        }
      }
      return true;
    }
    if (c == '[') return fail("a plain dtype string (structured dtypes are not supported)", error);
    return fail("a string, True, False or a tuple", error);
  }

  const std::string& text_;
  size_t pos_ = 0;
};

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t value = 0;
  for (int b = bytes - 1; b >= 0; --b) value = (value << 8) | p[b];
  return value;
}

}  // namespace

Array::Array(DType dtype_, std::vector<int64_t> shape_) : dtype(dtype_), shape(std::move(shape_)) {
  bytes.assign(size_t(numel()) * dtype_size(dtype), 0);
}

int64_t Array::numel() const {
  int64_t total = 1;
  for (int64_t extent : shape) total *= extent;
  return total;
}

TensorView Array::view() {
  return TensorView(bytes.data(), dtype, int(shape.size()), shape.data());
}

TensorView Array::view() const {
  return TensorView(const_cast<uint8_t*>(bytes.data()), dtype, int(shape.size()), shape.data());
}

const char* descr_for(DType dtype) {
  for (const DescrEntry& entry : kDescrs)
    if (entry.dtype == dtype) return entry.descr;
  return nullptr;
}

Status parse(const std::vector<uint8_t>& file, const std::string& name, Array* out) {
  if (file.size() < kMagicSize + 4)
    return file_error(name, "file must be at least 10 bytes long (.npy preamble), got ",
                      file.size(), " bytes");
  if (std::memcmp(file.data(), kMagic, kMagicSize) != 0) {
    std::ostringstream got;
    for (size_t i = 0; i < kMagicSize; ++i) {
      const uint8_t c = file[i];
      if (c >= 32 && c < 127)
        got << char(c);
      else
        got << "\\x" << std::hex << (c >> 4) << (c & 15) << std::dec;
    }
    return file_error(name, "file must start with the .npy magic string \\x93NUMPY, got ",
                      got.str(), " (not an .npy file)");
  }
  const int major = file[6], minor = file[7];
  if (minor != 0 || major < 1 || major > 3)
    return file_error(name, "format version must be 1.0, 2.0 or 3.0, got ", major, '.', minor);
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (file.size() < 8 + length_bytes)
    return file_error(name, "file must hold the header length, got ", file.size(), " bytes");
  const size_t header_length = read_le(file.data() + 8, int(length_bytes));
  const size_t data_offset = 8 + length_bytes + header_length;
  if (data_offset > file.size())
    return file_error(name, "header must fit in the file (", header_length,
                      " bytes declared), got a file of ", file.size(), " bytes (truncated file)");
  const std::string header(reinterpret_cast<const char*>(file.data()) + 8 + length_bytes,
                           header_length);

  std::vector<std::pair<std::string, HeaderValue>> entries;
  std::string parse_error;
  if (!HeaderParser(header).parse(&entries, &parse_error))
    return file_error(name,
                      "header must be a dict like {'descr': '<f4', 'fortran_order': False, "
                      "'shape': (2, 3)} (expected ",
                      parse_error, "), got ", quote_header(header));
  const HeaderValue* descr = nullptr;
  const HeaderValue* fortran_order = nullptr;
  const HeaderValue* shape = nullptr;
  for (const auto& [key, value] : entries) {
    const HeaderValue** slot = key == "descr"           ? &descr
                               : key == "fortran_order" ? &fortran_order
                               : key == "shape"         ? &shape
                                                        : nullptr;
    if (slot == nullptr)
      return file_error(name, "header keys must be 'descr', 'fortran_order' and 'shape', got '",
                        key, "'");
    if (*slot != nullptr)
      return file_error(name, "header key '", key, "' must appear once, got it twice");
    *slot = &value;
  }
  for (auto [key, value] : {std::pair<const char*, const HeaderValue*>{"descr", descr},
                            {"fortran_order", fortran_order},
                            {"shape", shape}})
    if (value == nullptr)
      return file_error(name, "header must contain the key '", key, "', got ",
                        quote_header(header));
  if (descr->kind != HeaderValue::string)
    return file_error(name, "descr must be a dtype string such as '<f4', got ",
                      quote_header(header));
  if (fortran_order->kind != HeaderValue::boolean)
    return file_error(name, "fortran_order must be True or False, got ", quote_header(header));
  if (shape->kind != HeaderValue::tuple)
    return file_error(name, "shape must be a tuple of integers, got ", quote_header(header));

  if (fortran_order->flag)
    return file_error(
        name, "fortran_order must be False (C order; save np.ascontiguousarray(a)), got True");
  const std::string& d = descr->text;
  if (!d.empty() && (d[0] == '>' || d[0] == '!'))
    return file_error(name, "descr must be little-endian ('<' or '|'), got '", d,
                      "' (big-endian; save a.astype(a.dtype.newbyteorder('<')))");
  const DescrEntry* entry = nullptr;
  for (const DescrEntry& candidate : kDescrs)
    if (d == candidate.descr) entry = &candidate;
  if (entry == nullptr)
    return file_error(name, "descr must be one of ", accepted_descrs(), ", got '", d, "'");
  if (shape->numbers.size() > size_t(kMaxDims))
    return file_error(name, "shape must have at most ", kMaxDims, " dimensions, got ",
                      shape->numbers.size(), ' ', shape_text(shape->numbers));

  // Bytes the data must have, with overflow checks (a corrupt header may claim anything).
  const uint64_t element = dtype_size(entry->dtype);
  uint64_t expected = element;
  bool zero = false;
  for (int64_t extent : shape->numbers) {
    if (extent == 0) zero = true;
    if (!zero && uint64_t(extent) > std::numeric_limits<uint64_t>::max() / 2 / expected)
      return file_error(name, "shape must describe fewer than 2^63 bytes, got ",
                        shape_text(shape->numbers));
    if (!zero) expected *= uint64_t(extent);
  }
  if (zero) expected = 0;
  const uint64_t actual = file.size() - data_offset;
  if (actual != expected)
    return file_error(name, "data must be ", expected, " bytes for ", dtype_name(entry->dtype), ' ',
                      shape_text(shape->numbers), ", got ", actual, " bytes",
                      actual < expected ? " (truncated file)" : " (trailing bytes)");

  Array result;
  result.dtype = entry->dtype;
  result.shape = shape->numbers;
  result.bytes.assign(file.begin() + std::ptrdiff_t(data_offset), file.end());
  *out = std::move(result);
  return Status::ok();
}

Status read(const std::string& path, Array* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return file_error(path, "file must be readable, got '", std::strerror(errno), "'");
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0)
    bytes.insert(bytes.end(), chunk, chunk + got);
  const bool failed = std::ferror(f) != 0;
  const int saved_errno = errno;
  std::fclose(f);
  if (failed)
    return file_error(path, "file must be readable, got '", std::strerror(saved_errno), "'");
  return parse(bytes, path, out);
}

Status encode(const Array& array, const std::string& name, std::vector<uint8_t>* file) {
  const char* descr = descr_for(array.dtype);
  if (descr == nullptr)
    return file_error(name, "dtype must be one of ", accepted_descrs(), ", got ",
                      dtype_name(array.dtype));
  if (array.shape.size() > size_t(kMaxDims))
    return file_error(name, "shape must have at most ", kMaxDims, " dimensions, got ",
                      array.shape.size());
  for (int64_t extent : array.shape)
    if (extent < 0)
      return file_error(name, "shape must be non-negative, got ", shape_text(array.shape));
  const uint64_t expected = uint64_t(array.numel()) * dtype_size(array.dtype);
  if (array.bytes.size() != expected)
    return file_error(name, "data must be ", expected, " bytes for ", dtype_name(array.dtype), ' ',
                      shape_text(array.shape), ", got ", array.bytes.size(), " bytes");

  // Byte for byte what NumPy's np.save writes: keys in sorted order, 21 - digits(shape[0]) spaces
  // of room for growing the first axis in place, then spaces and '\n' up to the next multiple of
  // 64 (a whole 64 more when already aligned, as NumPy does).
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape_text(array.shape) + ", }";
  if (!array.shape.empty()) {
    const size_t digits = std::to_string(array.shape[0]).size();
    if (digits < kGrowthAxisDigits) header.append(kGrowthAxisDigits - digits, ' ');
  }
  const size_t preamble = kMagicSize + 2 + 2;
  header.append(kAlignment - (preamble + header.size() + 1) % kAlignment, ' ');
  header += '\n';
  if (header.size() > 65535)
    return file_error(name, "header must fit format 1.0 (65535 bytes), got ", header.size());
  const size_t total = preamble + header.size();

  file->clear();
  file->reserve(total + array.bytes.size());
  file->insert(file->end(), kMagic, kMagic + kMagicSize);
  file->push_back(1);
  file->push_back(0);
  file->push_back(uint8_t(header.size() & 0xff));
  file->push_back(uint8_t(header.size() >> 8));
  file->insert(file->end(), header.begin(), header.end());
  file->insert(file->end(), array.bytes.begin(), array.bytes.end());
  return Status::ok();
}

namespace {

/// Writes `bytes` to `<path>.tmp` and flushes it to disk; removes the temporary on failure.
Status write_temporary(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = path + ".tmp";
  std::FILE* f = std::fopen(temporary.c_str(), "wb");
  if (f == nullptr)
    return file_error(path, "output must be writable, got '", std::strerror(errno), "'");
  // Each step runs only if the previous ones succeeded; errno is kept from the first failure.
  int saved_errno = 0;
  auto step = [&](bool succeeded) {
    if (!succeeded && saved_errno == 0) saved_errno = errno != 0 ? errno : EIO;
  };
  errno = 0;
  step(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  if (saved_errno == 0) step(std::fflush(f) == 0);
  if (saved_errno == 0) step(::fsync(fileno(f)) == 0);
  step(std::fclose(f) == 0);
  if (saved_errno != 0) {
    std::remove(temporary.c_str());
    return file_error(path, "output must be writable, got '", std::strerror(saved_errno), "'");
  }
  return Status::ok();
}

}  // namespace

Status write(const std::string& path, const Array& array) { return write_all({{path, &array}}); }

Status write_all(const std::vector<OutputFile>& files) {
  // Encode everything first: an unencodable array fails before any file is touched.
  std::vector<std::vector<uint8_t>> encoded(files.size());
  for (size_t i = 0; i < files.size(); ++i)
    MOE_ROUTING_RETURN_IF_ERROR(encode(*files[i].array, files[i].path, &encoded[i]));
  for (size_t i = 0; i < files.size(); ++i) {
    const Status written = write_temporary(files[i].path, encoded[i]);
    if (!written.is_ok()) {
      for (size_t j = 0; j < i; ++j) std::remove((files[j].path + ".tmp").c_str());
      return written;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (std::rename((files[i].path + ".tmp").c_str(), files[i].path.c_str()) == 0) continue;
    const int saved_errno = errno;
    for (size_t j = 0; j < i; ++j) std::remove(files[j].path.c_str());
    for (size_t j = i; j < files.size(); ++j) std::remove((files[j].path + ".tmp").c_str());
    return file_error(files[i].path, "output must be writable, got '", std::strerror(saved_errno),
                      "'");
  }
  return Status::ok();
}

}  // namespace moe_routing::npy
