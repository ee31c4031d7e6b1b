#include "npy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>

#include "file_io.h"

namespace moe_routing::npy {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              ".npy data is little-endian and is copied as is: a big-endian host needs byte swaps");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlignment = 64;         // data offset of written files, as NumPy's
constexpr size_t kGrowthAxisDigits = 21;  // header room NumPy leaves for the first axis
// Headers of the arrays we accept take a few hundred bytes; the bound keeps a corrupt length
// field (up to 4 GiB in versions 2.0 and 3.0) from becoming an allocation.
constexpr size_t kMaxHeaderLength = 1 << 20;

using file_io::file_error;

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

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '(';
  for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  if (shape.size() == 1) out << ',';
  out << ')';
  return out.str();
}

/// Text from a file for a message: printable ASCII ('?' for any other byte, so that a file cannot
/// put a line break or a terminal escape into the one-line message), cut after 120 characters.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (out.size() >= 120) return out + "...";
    out += (c >= 32 && c < 127) ? c : '?';
  }
  return out;
}

/// Header text for messages: printable, without the padding, cut after 120 characters.
std::string quote_header(const std::string& header) {
  size_t end = header.size();
  while (end > 0 && (header[end - 1] == ' ' || header[end - 1] == '\n')) --end;
  return printable(header.substr(0, end));
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
      bool comma = false;  // after the last element: Python writes one element as (n,)
      while (!eat(')')) {
        if (peek() < '0' || peek() > '9') return fail("a non-negative integer in the shape", error);
        // Python refuses a decimal integer with leading zeros ("06"), and so does NumPy.
        if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
            text_[pos_ + 1] <= '9')
          return fail("a shape dimension without leading zeros", error);
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
        comma = eat(',');
        if (comma) {
          skip_space();
        } else if (peek() != ')') {
          return fail("',' or ')' in the shape", error);
        }
      }
      // "(6)" is the integer 6 in Python, not a tuple: NumPy refuses it as a shape.
      if (value->numbers.size() == 1 && !comma)
        return fail("a tuple, (n,) for one dimension", error);
      return true;
    }
    if (c == '[') return fail("a plain dtype string (structured dtypes are not supported)", error);
    return fail("a string, True, False or a tuple", error);
  }

  const std::string& text_;
  size_t pos_ = 0;
};

/// NumPy's limit on a shape (np.empty and np.load refuse any other, "array is too big"): the
/// element size times the product of the non-zero extents must be below 2^63, whether or not an
/// extent is 0. On success *bytes is the data's size (0 when an extent is 0). The extents are
/// non-negative.
Status check_numpy_size(DType dtype, const std::vector<int64_t>& shape, const std::string& name,
                        uint64_t* bytes) {
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  uint64_t product = dtype_size(dtype);
  for (int64_t extent : shape) {
    if (extent == 0) continue;
    if (uint64_t(extent) > uint64_t(std::numeric_limits<int64_t>::max()) / product)
      return file_error(name, "shape must describe fewer than 2^63 bytes",
                        empty ? " counting its zero extents as 1 (NumPy's limit)" : "", ", got ",
                        shape_text(shape));
    product *= uint64_t(extent);
  }
  *bytes = empty ? 0 : product;
  return Status::ok();
}

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t value = 0;
  for (int b = bytes - 1; b >= 0; --b) value = (value << 8) | p[b];
  return value;
}

/// Sizes `bytes` to `count` bytes for `array` (`what`, its dtype and shape name it in messages),
/// after checking that they fit in the memory available; an allocation failure is a Status too.
Status allocate_bytes(uint64_t count, const std::string& label, const std::string& what,
                      const Array& array, std::vector<uint8_t>* bytes) {
  const std::string described =
      what + ' ' + dtype_name(array.dtype) + ' ' + shape_text(array.shape);
  MOE_ROUTING_RETURN_IF_ERROR(file_io::check_memory(count, label, described));
  try {
    bytes->resize(size_t(count));
  } catch (const std::bad_alloc&) {
    return runtime_error("moe-routing: ", label, ": ", described, " (", count,
                         " bytes) must fit in memory, got an allocation failure");
  } catch (const std::length_error&) {
    return runtime_error("moe-routing: ", label, ": ", described, " (", count,
                         " bytes) must fit in memory, got a size beyond the address space");
  }
  return Status::ok();
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

namespace {

/// parse()'s file: bytes already in memory.
class MemorySource {
 public:
  explicit MemorySource(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  int64_t size() const { return int64_t(bytes_.size()); }
  Status read(void* out, size_t count, size_t* got) {
    *got = std::min(count, bytes_.size() - position_);
    if (*got > 0) std::memcpy(out, bytes_.data() + position_, *got);
    position_ += *got;
    return Status::ok();
  }

 private:
  const std::vector<uint8_t>& bytes_;
  size_t position_ = 0;
};

/// Decodes an .npy file from `source` (MemorySource or file_io::InputFile: size() is the total
/// when known, else -1; read() gives fewer bytes than asked only at the end). Everything the
/// header promises is checked before the data is read: the data's size against the file's when
/// it is known, and against the memory available always, so a corrupt header or an endless stream
/// (/dev/zero) is an error at once, not a read until memory runs out.
template <typename Source>
Status decode(Source& source, const std::string& name, Array* out) {
  const int64_t total = source.size();
  uint8_t preamble[kMagicSize + 2 + 4];
  size_t got = 0;
  MOE_ROUTING_RETURN_IF_ERROR(source.read(preamble, kMagicSize + 4, &got));
  if (got < kMagicSize + 4)
    return file_error(name, "file must be at least 10 bytes long (.npy preamble), got ", got,
                      " bytes");
  if (std::memcmp(preamble, kMagic, kMagicSize) != 0) {
    std::ostringstream text;
    for (size_t i = 0; i < kMagicSize; ++i) {
      const uint8_t c = preamble[i];
      if (c >= 32 && c < 127)
        text << char(c);
      else
        text << "\\x" << std::hex << (c >> 4) << (c & 15) << std::dec;
    }
    return file_error(name, "file must start with the .npy magic string \\x93NUMPY, got ",
                      text.str(), " (not an .npy file)");
  }
  const int major = preamble[6], minor = preamble[7];
  if (minor != 0 || major < 1 || major > 3)
    return file_error(name, "format version must be 1.0, 2.0 or 3.0, got ", major, '.', minor);
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (length_bytes == 4) {
    MOE_ROUTING_RETURN_IF_ERROR(source.read(preamble + kMagicSize + 4, 2, &got));
    if (got < 2)
      return file_error(name, "file must hold the header length, got ", kMagicSize + 4 + got,
                        " bytes");
  }
  const size_t header_length = read_le(preamble + 8, int(length_bytes));
  const size_t data_offset = 8 + length_bytes + header_length;
  if (total >= 0 && data_offset > uint64_t(total))
    return file_error(name, "header must fit in the file (", header_length,
                      " bytes declared), got a file of ", total, " bytes (truncated file)");
  if (header_length > kMaxHeaderLength)
    return file_error(name, "header must be at most ", kMaxHeaderLength, " bytes long, got ",
                      header_length, " bytes declared");
  std::string header(header_length, '\0');
  MOE_ROUTING_RETURN_IF_ERROR(source.read(header.data(), header_length, &got));
  if (got < header_length)
    return file_error(name, "header must fit in the file (", header_length,
                      " bytes declared), got a file of ", 8 + length_bytes + got,
                      " bytes (truncated file)");

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
                        printable(key), "'");
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
    return file_error(name, "descr must be little-endian ('<' or '|'), got '", printable(d),
                      "' (big-endian; save a.astype(a.dtype.newbyteorder('<')))");
  const DescrEntry* entry = nullptr;
  for (const DescrEntry& candidate : kDescrs)
    if (d == candidate.descr) entry = &candidate;
  if (entry == nullptr)
    return file_error(name, "descr must be one of ", accepted_descrs(), ", got '", printable(d),
                      "'");
  if (shape->numbers.size() > size_t(kMaxDims))
    return file_error(name, "shape must have at most ", kMaxDims, " dimensions, got ",
                      shape->numbers.size(), ' ', shape_text(shape->numbers));

  // Bytes the data must have, with overflow checks (a corrupt header may claim anything), and
  // only shapes NumPy itself accepts: an empty array whose other extents overflow would give
  // outputs (their shapes follow the inputs') that NumPy cannot load.
  uint64_t expected = 0;
  MOE_ROUTING_RETURN_IF_ERROR(check_numpy_size(entry->dtype, shape->numbers, name, &expected));
  auto size_error = [&](uint64_t actual, const char* more) {
    return file_error(name, "data must be ", expected, " bytes for ", dtype_name(entry->dtype), ' ',
                      shape_text(shape->numbers), ", got ", actual, more,
                      actual < expected ? " bytes (truncated file)" : " bytes (trailing bytes)");
  };
  if (total >= 0 && uint64_t(total) - data_offset != expected)
    return size_error(uint64_t(total) - data_offset, "");

  Array result;
  result.dtype = entry->dtype;
  result.shape = shape->numbers;
  MOE_ROUTING_RETURN_IF_ERROR(allocate_bytes(expected, name, "data", result, &result.bytes));
  MOE_ROUTING_RETURN_IF_ERROR(source.read(result.bytes.data(), expected, &got));
  if (got < expected) return size_error(got, "");
  if (total < 0) {  // a stream: its end must come right after the data
    uint8_t extra;
    MOE_ROUTING_RETURN_IF_ERROR(source.read(&extra, 1, &got));
    if (got > 0) return size_error(expected + 1, " or more");
  }
  *out = std::move(result);
  return Status::ok();
}

}  // namespace

Status parse(const std::vector<uint8_t>& file, const std::string& name, Array* out) {
  MemorySource source(file);
  return decode(source, name, out);
}

Status read(const std::string& path, Array* out, const std::string& flag) {
  file_io::InputFile file;
  MOE_ROUTING_RETURN_IF_ERROR(file.open(path, file_io::label(flag, path)));
  return decode(file, file.label(), out);
}

Status allocate(DType dtype, std::vector<int64_t> shape, const std::string& label,
                const std::string& name, Array* out) {
  Array result;
  result.dtype = dtype;
  result.shape = std::move(shape);
  MOE_ROUTING_RETURN_IF_ERROR(allocate_bytes(uint64_t(result.numel()) * dtype_size(dtype), label,
                                             name, result, &result.bytes));
  *out = std::move(result);
  return Status::ok();
}

Status encode_header(DType dtype, const std::vector<int64_t>& shape, const std::string& name,
                     std::string* header) {
  const char* descr = descr_for(dtype);
  if (descr == nullptr)
    return file_error(name, "dtype must be one of ", accepted_descrs(), ", got ",
                      dtype_name(dtype));
  if (shape.size() > size_t(kMaxDims))
    return file_error(name, "shape must have at most ", kMaxDims, " dimensions, got ",
                      shape.size());
  for (int64_t extent : shape)
    if (extent < 0) return file_error(name, "shape must be non-negative, got ", shape_text(shape));
  // An empty output can have a shape NumPy refuses (grad_expanded_x [E, 0, H] with E near
  // 2^62): refused here, before any file is touched, instead of written and unloadable.
  uint64_t bytes = 0;
  MOE_ROUTING_RETURN_IF_ERROR(check_numpy_size(dtype, shape, name, &bytes));

  // Byte for byte what NumPy's np.save writes: keys in sorted order, 21 - digits(shape[0]) spaces
  // of room for growing the first axis in place, then spaces and '\n' up to the next multiple of
  // 64 (a whole 64 more when already aligned, as NumPy does).
  std::string dict = std::string("{'descr': '") + descr +
                     "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  if (!shape.empty()) {
    const size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthAxisDigits) dict.append(kGrowthAxisDigits - digits, ' ');
  }
  const size_t preamble = kMagicSize + 2 + 2;
  dict.append(kAlignment - (preamble + dict.size() + 1) % kAlignment, ' ');
  dict += '\n';
  if (dict.size() > 65535)
    return file_error(name, "header must fit format 1.0 (65535 bytes), got ", dict.size());

  header->assign(kMagic, kMagicSize);
  *header += char(1);
  *header += char(0);
  *header += char(dict.size() & 0xff);
  *header += char(dict.size() >> 8);
  *header += dict;
  return Status::ok();
}

namespace {

/// The header of `array`, whose bytes must be as many as its dtype and shape say.
Status array_header(const Array& array, const std::string& name, std::string* header) {
  MOE_ROUTING_RETURN_IF_ERROR(encode_header(array.dtype, array.shape, name, header));
  const uint64_t expected = uint64_t(array.numel()) * dtype_size(array.dtype);
  if (array.bytes.size() != expected)
    return file_error(name, "data must be ", expected, " bytes for ", dtype_name(array.dtype), ' ',
                      shape_text(array.shape), ", got ", array.bytes.size(), " bytes");
  return Status::ok();
}

}  // namespace

Status encode(const Array& array, const std::string& name, std::vector<uint8_t>* file) {
  std::string header;
  MOE_ROUTING_RETURN_IF_ERROR(array_header(array, name, &header));
  file->assign(header.begin(), header.end());
  file->insert(file->end(), array.bytes.begin(), array.bytes.end());
  return Status::ok();
}

Status write(const std::string& path, const Array& array, const std::string& flag) {
  return write_all({{path, &array, flag}});
}

Status write_all(const std::vector<OutputFile>& files) {
  // Headers first: an unencodable array fails before any file is touched. The data is written
  // from the arrays themselves (no file image: an output is never held twice in memory).
  std::vector<std::string> headers(files.size());
  std::vector<file_io::OutputFile> outputs(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    outputs[i].path = files[i].path;
    outputs[i].label = file_io::label(files[i].flag, files[i].path);
    MOE_ROUTING_RETURN_IF_ERROR(array_header(*files[i].array, outputs[i].label, &headers[i]));
    outputs[i].pieces = {{headers[i].data(), headers[i].size()},
                         {files[i].array->bytes.data(), files[i].array->bytes.size()}};
  }
  return file_io::write_all(outputs);
}

}  // namespace moe_routing::npy
