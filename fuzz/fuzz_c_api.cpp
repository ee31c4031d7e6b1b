// libFuzzer target for the C ABI (include/moe_routing/moe_routing.h): every input drives one
// operator (moe_init_routing_grad, moe_init_routing_v2, moe_init_routing, or the combine:
// moe_finalize_routing V1 / V2 and moe_finalize_routing_grad) through shape
// inference, phase one and phase two, with shapes, dtypes, devices, attributes (extreme int64
// values included), index values, NULL or mismatched outputs and executor misuse decoded from the
// bytes. Built with ASan + UBSan (`make fuzz`); besides the sanitizers, these oracles abort:
//
//   * every status is one of the six codes, and MR_ERROR_INTERNAL never happens;
//   * mrCreateTensor accepts exactly the descriptions it documents;
//   * a failing call writes no output (the poison of every output buffer survives), leaves a
//     message, resets phase one's out-parameters;
//   * phase one fails with shape inference's exact status and message whenever shape inference
//     fails; after a successful phase one, phase two fails only with index errors;
//   * a successful phase two is bitwise equal to the C++ API's plain reference backend
//     (Backend::reference) on the same inputs, outputs poisoned the same way;
//   * a failing phase two fails in the C++ API with the same status and message;
//   * no tensor handle or executor outlives the input (each executor freed exactly once).
//
// Sizes stay small so an input runs in microseconds: a tensor gets a buffer only when it has at
// most kMaxElements elements (a larger one is passed without data, which phase one must reject),
// and phase two runs only when the expert-sized work (E, E*C, the expert range) is within the
// same budget (the forward's scratch memory grows with E by design) and a gather-reduce's index
// entries times its row length within kMaxWork.
//
// Input layout: the bytes are read front to back as decisions (operator, sizes, attributes,
// shape/dtype/device mutations, output modes); 8 of them seed a generator for the bulk data.
// Reading past the end gives zeros, which select the "natural" (valid) choice everywhere.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "cases/random.h"
#include "moe_routing/moe_routing.h"
#include "moe_routing/moe_routing.hpp"

namespace {

using namespace moe_routing;

constexpr int64_t kMaxElements = int64_t(1) << 16;
constexpr int64_t kMaxWork = int64_t(1) << 20;  // elements a phase two may visit (see below)
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr uint8_t kPoison = 0xA7;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_c_api: oracle failure: %s\n  %s\n", what, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(condition, detail)             \
  do {                                            \
    if (!(condition)) fail(#condition, (detail)); \
  } while (0)

std::string last_message() { return mrGetLastErrorMessage(); }

// ------------------------------------------------------------------------------------------
// Decoding
// ------------------------------------------------------------------------------------------

/// The fuzzer's bytes as a stream of decisions; zeros past the end.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return position_ < size_ ? data_[position_++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
  /// A value in [0, n) (n >= 1).
  int64_t below(int64_t n) { return int64_t(byte()) % n; }
  /// True with probability about k/256.
  bool rarely(int k) { return byte() >= 256 - k; }

  /// An int64 attribute: usually `natural`; sometimes small; sometimes extreme.
  int64_t attribute(int64_t natural) {
    const uint8_t b = byte();
    if (b < 200) return natural;
    if (b < 228) return int64_t(byte() % 24) - 4;
    static const int64_t extremes[] = {kInt64Min,
                                       kInt64Max,
                                       kInt32Max,
                                       kInt32Max + 1,
                                       kInt32Min,
                                       kInt32Min - 1,
                                       int64_t(1) << 32,
                                       -kInt64Max,
                                       int64_t(1) << 16,
                                       (int64_t(1) << 16) + 1,
                                       -2,
                                       10240};
    if (b < 250) return extremes[byte() % (sizeof extremes / sizeof extremes[0])];
    return int64_t(u64());
  }
  /// An enumeration value: usually `natural`, else a listed or arbitrary int32.
  int32_t enumeration(int32_t natural, int32_t count) {
    const uint8_t b = byte();
    if (b < 232) return natural;
    if (b < 248) return int32_t(byte() % (count + 2)) - 1;
    static const int32_t extremes[] = {std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max(), 64, -7};
    return extremes[byte() % 4];
  }
  /// A shape: usually `natural`; sometimes one extent changed, the rank changed, or arbitrary.
  std::vector<int64_t> shape(std::vector<int64_t> natural) {
    const uint8_t b = byte();
    if (b < 215) return natural;
    if (b < 235 && !natural.empty()) {
      natural[size_t(below(int64_t(natural.size())))] = attribute(int64_t(byte() % 9));
      return natural;
    }
    if (b < 245) {
      if (byte() % 2 == 0 || natural.empty())
        natural.push_back(int64_t(byte() % 4));
      else
        natural.pop_back();
      return natural;
    }
    std::vector<int64_t> arbitrary(size_t(byte() % 11));
    for (int64_t& extent : arbitrary) extent = attribute(int64_t(byte() % 7));
    return arbitrary;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

/// The bulk data generator: SplitMix64 (tools/cases/random.h), drawing below n by a modulo (the
/// corpus and the regressions were made with it).
class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}
  uint64_t next() { return rng_.next(); }
  int64_t below(int64_t n) { return n <= 0 ? 0 : int64_t(next() % uint64_t(n)); }

 private:
  cases::SplitMix64 rng_;
};

/// How int32 index data is filled: `limit` is the number of valid values ([0, limit)).
enum class IndexFill { valid, valid_and_minus_one, near_limit, arbitrary };

// ------------------------------------------------------------------------------------------
// Tensors
// ------------------------------------------------------------------------------------------

/// Whether mrCreateTensor must accept a description (its documented rules, restated).
bool creatable(const std::vector<int64_t>& shape, int32_t dtype, int32_t device) {
  if (shape.size() > size_t(MR_MAX_DIMS) || !is_valid_dtype(dtype)) return false;
  if (device != MR_DEVICE_CPU && device != MR_DEVICE_CUDA) return false;
  int64_t elements = 1;
  for (int64_t extent : shape) {
    if (extent < 0) return false;
  }
  const int64_t limit = kInt64Max / int64_t(dtype_size(DType(dtype)));
  bool fits = true;
  for (int64_t extent : shape) {
    if (extent == 0) return true;
    if (elements > limit / extent)
      fits = false;
    else
      elements *= extent;
  }
  return fits;
}

/// Elements of a shape, or -1 when some extent is negative or the count exceeds the budget.
int64_t budget_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t extent : shape) {
    if (extent < 0) return -1;
    if (extent == 0) return 0;
  }
  for (int64_t extent : shape) {
    if (n > kMaxElements / extent) return -1;
    n *= extent;
  }
  return n;
}

/// One tensor argument: its description, its buffer (when within budget) and its handle.
struct FuzzTensor {
  bool passed = false;  // false: the argument is NULL
  std::vector<int64_t> shape;
  int32_t dtype = MR_FLOAT32;
  int32_t device = MR_DEVICE_CPU;
  bool null_data = false;
  std::vector<uint64_t> storage;  // 8-byte aligned
  size_t bytes = 0;
  mrTensor* handle = nullptr;
  bool has_handle = false;  // a mirror copies this from its original

  FuzzTensor() = default;
  FuzzTensor(const FuzzTensor&) = delete;
  FuzzTensor& operator=(const FuzzTensor&) = delete;
  ~FuzzTensor() {
    if (handle != nullptr) mrDestroyTensor(handle);
  }

  /// Sets the description and allocates the buffer (poisoned) when the tensor is small enough.
  void describe(std::vector<int64_t> shape_, int32_t dtype_, int32_t device_, bool null_data_) {
    passed = true;
    shape = std::move(shape_);
    dtype = dtype_;
    device = device_;
    null_data = null_data_;
    const int64_t n = budget_numel(shape);
    storage.clear();
    bytes = 0;
    if (n >= 0 && is_valid_dtype(dtype)) {
      bytes = size_t(n) * dtype_size(DType(dtype));
      storage.assign(bytes / 8 + 1, 0);
      std::memset(storage.data(), kPoison, storage.size() * 8);
    }
  }
  void* data() { return null_data || storage.empty() ? nullptr : storage.data(); }
  bool has_data() { return data() != nullptr; }

  /// Makes the handle; checks mrCreateTensor against its documented rules.
  void create() {
    if (!passed) return;
    mrTensor* t = reinterpret_cast<mrTensor*>(this);  // must be reset to NULL on failure
    const mrStatus s =
        mrCreateTensor(shape.data(), uint64_t(shape.size()), dtype, device, data(), &t);
    const bool expected = creatable(shape, dtype, device);
    FUZZ_CHECK((s == MR_SUCCESS) == expected, "mrCreateTensor: " + last_message());
    if (s != MR_SUCCESS) {
      FUZZ_CHECK(s == MR_ERROR_INVALID_ARGUMENT && t == nullptr && !last_message().empty(),
                 last_message());
      return;
    }
    handle = t;
    has_handle = true;
  }
  /// The view the C++ API gets for the same argument (NULL handle = absent view).
  TensorView view() {
    if (!has_handle) return TensorView();
    return TensorView(data(), DType(dtype), int(shape.size()), shape.data(), Device(device));
  }
  /// Same description as `other`, own buffer poisoned the same way, and a matching view.
  void mirror(FuzzTensor& other) {
    passed = other.passed;
    shape = other.shape;
    dtype = other.dtype;
    device = other.device;
    null_data = other.null_data;
    has_handle = other.has_handle;
    storage.assign(other.storage.size(), 0);
    if (!storage.empty()) std::memset(storage.data(), kPoison, storage.size() * 8);
    bytes = other.bytes;
  }
  bool poisoned() const {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(storage.data());
    for (size_t i = 0; i < storage.size() * 8; ++i)
      if (p[i] != kPoison) return false;
    return true;
  }

  /// Fills the buffer: floats from raw bits or small values, int32 indices per `fill`.
  void fill(Generator& gen, uint8_t mode, int64_t limit = 0,
            IndexFill index_fill = IndexFill::valid) {
    if (storage.empty() || !is_valid_dtype(dtype)) return;
    const DType t = DType(dtype);
    const int64_t n = int64_t(bytes / dtype_size(t));
    if (t == DType::int32) {
      int32_t* p = reinterpret_cast<int32_t*>(storage.data());
      const int64_t valid = std::max<int64_t>(1, std::min<int64_t>(limit, kInt32Max));
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        switch (index_fill) {
          case IndexFill::valid: v = limit > 0 ? gen.below(valid) : 0; break;
          case IndexFill::valid_and_minus_one:
            v = gen.below(8) == 0 ? -1 : (limit > 0 ? gen.below(valid) : -1);
            break;
          case IndexFill::near_limit: v = gen.below(valid + 3) - 1; break;
          default: v = int64_t(int32_t(uint32_t(gen.next()))); break;
        }
        p[i] = int32_t(v);
      }
    } else if (is_floating(t) && mode % 2 == 0) {
      for (int64_t i = 0; i < n; ++i)
        store_from_float(storage.data(), t, i, float(gen.below(33) - 16) * 0.25f);
    } else {
      uint8_t* p = reinterpret_cast<uint8_t*>(storage.data());
      for (size_t i = 0; i < bytes; ++i) p[i] = uint8_t(gen.next());
    }
  }
};

IndexFill index_fill_of(uint8_t b) {
  if (b < 150) return IndexFill::valid;
  if (b < 210) return IndexFill::valid_and_minus_one;
  if (b < 240) return IndexFill::near_limit;
  return IndexFill::arbitrary;
}

/// An input argument: natural shape/dtype, mutated by the input, on the CPU mostly.
void decode_input(Input& in, FuzzTensor& t, std::vector<int64_t> natural_shape,
                  int32_t natural_dtype) {
  std::vector<int64_t> shape = in.shape(std::move(natural_shape));
  const int32_t dtype = in.enumeration(natural_dtype, 6);
  const int32_t device = in.rarely(4) ? in.enumeration(MR_DEVICE_CUDA, 2) : MR_DEVICE_CPU;
  t.describe(std::move(shape), dtype, device, in.rarely(3));
  if (in.rarely(2)) t.passed = false;  // NULL
}

/// An output argument from its inferred description (or a guess when inference failed).
void decode_output(Input& in, FuzzTensor& t, const mrTensorDesc* desc,
                   std::vector<int64_t> guess_shape, int32_t guess_dtype) {
  std::vector<int64_t> shape = guess_shape;
  int32_t dtype = guess_dtype;
  bool produced = true;
  if (desc != nullptr) {
    shape.assign(desc->shape, desc->shape + desc->ndim);
    dtype = desc->dtype;
    produced = desc->produced;
  }
  const uint8_t mode = in.byte() % 16;
  // Not produced: NULL is the natural choice; sometimes a buffer of the described shape.
  if (!produced && mode < 8) return;
  int32_t device = MR_DEVICE_CPU;
  bool null_data = false;
  if (mode == 11) return;  // NULL
  if (mode == 12) null_data = true;
  if (mode == 13) shape = in.shape(shape.empty() ? std::vector<int64_t>{1} : shape);
  if (mode == 14) dtype = in.enumeration(int32_t(in.byte() % 6), 6);
  if (mode == 15) device = in.enumeration(MR_DEVICE_CUDA, 2);
  t.describe(std::move(shape), dtype, device, null_data);
}

/// A description buffer whose every byte is known, to check it is left alone on failure.
mrTensorDesc poisoned_desc() {
  mrTensorDesc d;
  std::memset(&d, kPoison, sizeof d);
  return d;
}

bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

void check_status(mrStatus s, const char* where) {
  FUZZ_CHECK(s >= MR_SUCCESS && s <= MR_ERROR_RUNTIME, where);
  FUZZ_CHECK(s != MR_ERROR_INTERNAL, std::string(where) + ": " + last_message());
  if (s != MR_SUCCESS) FUZZ_CHECK(!last_message().empty(), where);
}

// ------------------------------------------------------------------------------------------
// The two phases, shared by the three operators
// ------------------------------------------------------------------------------------------

/// What an operator driver provides to run_phases.
struct Driver {
  std::vector<FuzzTensor*> outputs;
  /// Phase one with the given out-parameter pointers.
  std::function<mrStatus(uint64_t*, mrExecutor**)> phase_one;
  /// Phase two.
  std::function<mrStatus(void*, uint64_t, mrExecutor*)> phase_two;
  /// Phase two of another operator (to check that a foreign executor is refused).
  std::function<mrStatus(mrExecutor*)> foreign_phase_two;
  /// Whether phase one reports a workspace (the forward operators' sort scratch) or none.
  bool needs_workspace = false;
  /// Optional setters between the phases (numerics, order); returns whether it succeeded.
  std::function<void(Input&, mrExecutor*)> configure;
  /// The same call through the C++ API with the given configuration, writing the mirrors.
  std::function<Status(const std::vector<FuzzTensor*>& mirrors, const ExecConfig&)> cpp;
};

/// FUZZ_C_API_TRACE=1 prints one line per input: operator and the status of each phase (to
/// pick seeds for fuzz/corpus and to see what a run reaches).
bool tracing() {
  static const bool enabled = std::getenv("FUZZ_C_API_TRACE") != nullptr;
  return enabled;
}

/// Runs the C++ API into fresh mirrors of `outputs` (poisoned like them).
Status run_cpp(Driver& d, std::vector<FuzzTensor>& mirrors, const ExecConfig& config) {
  std::vector<FuzzTensor*> pointers;
  for (size_t i = 0; i < d.outputs.size(); ++i) {
    mirrors[i].mirror(*d.outputs[i]);
    pointers.push_back(&mirrors[i]);
  }
  return d.cpp(pointers, config);
}

void run_phases(const std::string& op, Input& in, Driver& d, mrStatus inferred,
                const std::string& inferred_message, bool work_within_budget) {
  for (FuzzTensor* t : d.outputs) t->create();

  // Phase one, sometimes with a NULL out-parameter.
  uint64_t workspace_size = 12345;
  mrExecutor* executor = reinterpret_cast<mrExecutor*>(&workspace_size);
  const uint8_t out_params = in.rarely(3) ? in.byte() % 3 : 0;
  const mrStatus s1 = d.phase_one(out_params == 1 ? nullptr : &workspace_size,
                                  out_params == 2 ? nullptr : &executor);
  check_status(s1, "phase one");
  if (out_params != 1)
    FUZZ_CHECK((workspace_size > 0) == (s1 == MR_SUCCESS && d.needs_workspace),
               "a workspace is reported exactly by a successful forward phase one");
  if (out_params != 0) {
    FUZZ_CHECK(s1 == MR_ERROR_INVALID_ARGUMENT, "a NULL out-parameter is refused");
    if (out_params == 1) FUZZ_CHECK(executor == nullptr, "executor reset");
  } else if (inferred != MR_SUCCESS) {
    FUZZ_CHECK(
        s1 == inferred && last_message() == inferred_message,
        "phase one agrees with shape inference: " + inferred_message + " vs " + last_message());
  } else {
    FUZZ_CHECK(s1 != MR_ERROR_INDEX_OUT_OF_RANGE, "phase one reads no index");
  }
  for (FuzzTensor* t : d.outputs) FUZZ_CHECK(t->poisoned(), "phase one writes no output");
  if (tracing()) std::fprintf(stderr, "trace %s infer=%d phase1=%d", op.c_str(), inferred, s1);
  if (s1 != MR_SUCCESS) {
    if (tracing()) std::fprintf(stderr, "\n");
    if (out_params != 2) FUZZ_CHECK(executor == nullptr, "executor reset on failure");
    return;
  }
  FUZZ_CHECK(executor != nullptr && c_api::live_executors() == 1, "one executor made");

  if (d.configure) d.configure(in, executor);

  const uint8_t misuse = in.rarely(12) ? in.byte() % 5 : 0;
  if (misuse == 1 || !work_within_budget) {
    FUZZ_CHECK(mrDestroyExecutor(executor) == MR_SUCCESS, "destroy");
  } else if (misuse == 2) {
    FUZZ_CHECK(d.phase_two(nullptr, 1 + in.byte(), executor) == MR_ERROR_INVALID_ARGUMENT,
               "NULL workspace with a size");
  } else if (misuse == 3) {
    FUZZ_CHECK(d.foreign_phase_two(executor) == MR_ERROR_INVALID_ARGUMENT, "foreign executor");
  } else if (misuse == 4 && workspace_size > 0) {
    std::vector<unsigned char> small(static_cast<size_t>(workspace_size - 1));
    FUZZ_CHECK(d.phase_two(small.data(), small.size(), executor) == MR_ERROR_INVALID_ARGUMENT,
               "a workspace smaller than reported is refused");
    for (FuzzTensor* t : d.outputs) FUZZ_CHECK(t->poisoned(), "nothing written on error");
  } else {
    // Exactly the reported size, on the heap (any access past it is an ASan report), sometimes
    // more than needed, at an odd address.
    const size_t extra = in.rarely(8) ? 1 + in.byte() % 32 : 0;
    std::vector<unsigned char> workspace(static_cast<size_t>(workspace_size) + extra);
    unsigned char* base = workspace.empty() ? nullptr : workspace.data() + extra;
    const mrStatus s2 = d.phase_two(base, workspace_size, executor);
    check_status(s2, "phase two");
    FUZZ_CHECK(s2 == MR_SUCCESS || s2 == MR_ERROR_INDEX_OUT_OF_RANGE || s2 == MR_ERROR_RUNTIME,
               "after phase one only index values or memory can fail: " + last_message());
    const std::string message = s2 == MR_SUCCESS ? std::string() : last_message();
    if (tracing()) std::fprintf(stderr, " phase2=%d", s2);

    // The C++ API's reference backend on the same arguments.
    std::vector<FuzzTensor> mirrors(d.outputs.size());
    ExecConfig reference;
    reference.backend = Backend::reference;
    const Status expected = run_cpp(d, mirrors, reference);
    FUZZ_CHECK(int(expected.code()) == s2, "C ABI and C++ reference agree on the status: " +
                                               expected.message() + " vs " + message);
    if (s2 != MR_SUCCESS) {
      FUZZ_CHECK(expected.message() == message, expected.message() + " vs " + message);
      for (FuzzTensor* t : d.outputs) FUZZ_CHECK(t->poisoned(), "nothing written on error");
    } else {
      for (size_t i = 0; i < d.outputs.size(); ++i)
        FUZZ_CHECK(d.outputs[i]->storage == mirrors[i].storage,
                   "CPU kernels and reference differ in output " + std::to_string(i));
      // The portable CPU kernels too (the C ABI runs the best ISA the CPU has).
      std::vector<FuzzTensor> baseline_mirrors(d.outputs.size());
      ExecConfig baseline;
      baseline.backend = Backend::cpu;
      baseline.isa = CpuIsa::baseline;
      baseline.num_threads = 1 + int(in.byte() % 4);
      const Status s = run_cpp(d, baseline_mirrors, baseline);
      FUZZ_CHECK(s.is_ok(), s.message());
      for (size_t i = 0; i < d.outputs.size(); ++i)
        FUZZ_CHECK(baseline_mirrors[i].storage == mirrors[i].storage,
                   "baseline CPU kernels and reference differ in output " + std::to_string(i));
    }
  }
  if (tracing()) std::fprintf(stderr, "\n");
  FUZZ_CHECK(c_api::live_executors() == 0, "the executor is freed exactly once");
}

// ------------------------------------------------------------------------------------------
// The operators
// ------------------------------------------------------------------------------------------

int32_t floating_dtype(Input& in) { return int32_t(in.byte() % 3); }  // fp32, fp16, bf16

/// Whether a gather-reduce over `pairs` index entries of `row` elements each (the reference visits
/// every entry for every column, dropped ones too) stays within kMaxWork: each tensor is within
/// kMaxElements, but pairs x H of two such tensors is not (a 65536-column row summed over 756
/// entries took 2 s per run under the sanitizers and the coverage instrumentation).
bool gather_within_budget(const FuzzTensor& index, const FuzzTensor& rows) {
  const int64_t pairs = budget_numel(index.shape);
  const int64_t row = rows.shape.empty() ? 1 : rows.shape.back();
  return pairs >= 0 && row >= 0 && (pairs == 0 || row <= kMaxWork / pairs);
}

void fuzz_grad(Input& in, Generator& gen) {
  const int64_t N = in.below(13), K = 1 + in.below(in.rarely(8) ? 130 : 6), H = in.below(21);
  const int64_t scenario = in.below(3);
  const int64_t E = 1 + in.below(6), C = 1 + in.below(5);
  const int64_t A = 1 + in.below(std::max<int64_t>(1, N * K + 2));
  const int64_t top_k = in.attribute(K);
  const int64_t drop_pad_mode = in.attribute(scenario == 2 ? 1 : 0);
  const int64_t active_num = in.attribute(scenario == 1 ? A : 0);
  const int32_t order = in.enumeration(int32_t(in.byte() % 2), 2);

  std::vector<int64_t> grad_shape{N * K, H};
  if (scenario == 1) grad_shape = {A, H};
  if (scenario == 2) grad_shape = {E, C, H};
  const int64_t rows = scenario == 1 ? A : (scenario == 2 ? E * C : N * K);
  FuzzTensor grad, idx, out;
  decode_input(in, grad, grad_shape, floating_dtype(in));
  decode_input(in, idx, {N * K}, MR_INT32);
  grad.fill(gen, in.byte());
  idx.fill(gen, 0, rows, index_fill_of(in.byte()));
  grad.create();
  idx.create();

  mrTensorDesc desc = poisoned_desc();
  const mrTensorDesc untouched = desc;
  const bool desc_null = in.rarely(2);
  const mrStatus inferred = mrMoeInitRoutingV2GradInferShape(
      grad.handle, idx.handle, top_k, drop_pad_mode, active_num, desc_null ? nullptr : &desc);
  check_status(inferred, "grad shape inference");
  const std::string inferred_message = inferred == MR_SUCCESS ? "" : last_message();
  if (inferred != MR_SUCCESS) FUZZ_CHECK(same_bytes(&desc, &untouched, sizeof desc), "desc kept");
  if (desc_null) {
    FUZZ_CHECK(inferred == MR_ERROR_INVALID_ARGUMENT, "NULL desc refused");
    return;
  }
  decode_output(in, out, inferred == MR_SUCCESS ? &desc : nullptr, {N, H}, grad.dtype);

  Driver d;
  d.outputs = {&out};
  d.phase_one = [&](uint64_t* ws, mrExecutor** ex) {
    return mrMoeInitRoutingV2GradGetWorkspaceSize(grad.handle, idx.handle, top_k, drop_pad_mode,
                                                  active_num, out.handle, ws, ex);
  };
  d.phase_two = [](void* w, uint64_t ws, mrExecutor* ex) {
    return mrMoeInitRoutingV2Grad(w, ws, ex, nullptr);
  };
  d.foreign_phase_two = [](mrExecutor* ex) { return mrMoeInitRouting(nullptr, 0, ex, nullptr); };
  Numerics numerics = Numerics::atlas_a2;
  AccumulationOrder chosen = AccumulationOrder::from_numerics;
  d.configure = [&](Input& input, mrExecutor* ex) {
    if (input.rarely(4)) {  // the numerics' order, unless the order setter below overrides it
      FUZZ_CHECK(mrSetNumerics(ex, MR_NUMERICS_ASCEND_950) == MR_SUCCESS, "numerics setter");
      numerics = Numerics::ascend_950;
    }
    const mrStatus s = mrSetAccumulationOrder(ex, order);
    FUZZ_CHECK((s == MR_SUCCESS) == (order == 0 || order == 1), "order setter");
    if (s == MR_SUCCESS) chosen = AccumulationOrder(order);
  };
  d.cpp = [&](const std::vector<FuzzTensor*>& m, const ExecConfig& config) {
    MoeInitRoutingGradAttrs attrs;
    attrs.top_k = top_k;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.active_num = active_num;
    attrs.numerics = numerics;
    attrs.order = chosen;
    return moe_init_routing_grad(grad.view(), idx.view(), attrs, m[0]->view(), config);
  };
  const std::string what = "grad N=" + std::to_string(N) + " K=" + std::to_string(top_k) +
                           " H=" + std::to_string(H) +
                           " drop_pad_mode=" + std::to_string(drop_pad_mode) +
                           " active_num=" + std::to_string(active_num);
  run_phases(what, in, d, inferred, inferred_message, gather_within_budget(idx, grad));
}

/// Whether the forward's expert-sized work stays within the budget.
bool experts_within_budget(int64_t E, int64_t C, bool drop_pad) {
  if (E < 0 || E > kMaxElements) return false;
  return !drop_pad || (C >= 0 && C <= kMaxElements && E * C <= kMaxElements);
}

void fuzz_v2(Input& in, Generator& gen) {
  const int64_t N = in.below(17), K = 1 + in.below(5), H = in.below(13), E = 1 + in.below(9);
  const bool drop_pad = in.below(3) == 0;
  const int64_t C = 1 + in.below(std::max<int64_t>(1, N));
  const int64_t active = in.below(3) == 0 ? 1 + in.below(N * K + 3) : 0;
  const int64_t active_num = in.attribute(drop_pad ? 0 : active);
  const int64_t expert_capacity = in.attribute(drop_pad ? C : 0);
  const int64_t expert_num = in.attribute(E);
  const int64_t drop_pad_mode = in.attribute(drop_pad ? 1 : 0);
  const int64_t count_flag = in.attribute(in.below(3));
  const bool before_flag = in.byte() % 2 == 1;

  FuzzTensor x, ids, expanded_x, expanded_row_idx, counts, before;
  decode_input(in, x, {N, H}, floating_dtype(in));
  decode_input(in, ids, {N, K}, MR_INT32);
  x.fill(gen, in.byte());
  ids.fill(gen, 0, E, index_fill_of(in.byte()));
  x.create();
  ids.create();

  mrTensorDesc desc[4];
  for (mrTensorDesc& d : desc) d = poisoned_desc();
  const mrStatus inferred = mrMoeInitRoutingV2InferShape(
      x.handle, ids.handle, active_num, expert_capacity, expert_num, drop_pad_mode, count_flag,
      before_flag, &desc[0], &desc[1], &desc[2], &desc[3]);
  check_status(inferred, "v2 shape inference");
  const std::string inferred_message = inferred == MR_SUCCESS ? "" : last_message();
  const bool ok = inferred == MR_SUCCESS;
  decode_output(in, expanded_x, ok ? &desc[0] : nullptr, {N * K, H}, x.dtype);
  decode_output(in, expanded_row_idx, ok ? &desc[1] : nullptr, {N * K}, MR_INT32);
  decode_output(in, counts, ok ? &desc[2] : nullptr, {E}, MR_INT32);
  decode_output(in, before, ok ? &desc[3] : nullptr, {E}, MR_INT32);

  Driver d;
  d.outputs = {&expanded_x, &expanded_row_idx, &counts, &before};
  d.phase_one = [&](uint64_t* ws, mrExecutor** ex) {
    return mrMoeInitRoutingV2GetWorkspaceSize(x.handle, ids.handle, active_num, expert_capacity,
                                              expert_num, drop_pad_mode, count_flag, before_flag,
                                              expanded_x.handle, expanded_row_idx.handle,
                                              counts.handle, before.handle, ws, ex);
  };
  d.phase_two = [](void* w, uint64_t ws, mrExecutor* ex) {
    return mrMoeInitRoutingV2(w, ws, ex, nullptr);
  };
  d.needs_workspace = true;
  d.foreign_phase_two = [](mrExecutor* ex) {
    return mrMoeInitRoutingV2Grad(nullptr, 0, ex, nullptr);
  };
  d.cpp = [&](const std::vector<FuzzTensor*>& m, const ExecConfig& config) {
    MoeInitRoutingV2Attrs attrs;
    attrs.active_num = active_num;
    attrs.expert_capacity = expert_capacity;
    attrs.expert_num = expert_num;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.expert_tokens_count_or_cumsum_flag = count_flag;
    attrs.expert_tokens_before_capacity_flag = before_flag;
    return moe_init_routing_v2(x.view(), ids.view(), attrs, m[0]->view(), m[1]->view(),
                               m[2]->view(), m[3]->view(), config);
  };
  const bool uses_experts = drop_pad_mode == 1 || count_flag == 1 || count_flag == 2;
  const std::string what =
      "v2 N=" + std::to_string(N) + " K=" + std::to_string(K) + " E=" + std::to_string(expert_num) +
      " C=" + std::to_string(expert_capacity) + " drop_pad_mode=" + std::to_string(drop_pad_mode) +
      " active_num=" + std::to_string(active_num) + " flag=" + std::to_string(count_flag) +
      " before=" + std::to_string(before_flag);
  run_phases(
      what, in, d, inferred, inferred_message,
      !uses_experts || experts_within_budget(expert_num, expert_capacity, drop_pad_mode == 1));
}

void fuzz_routing(Input& in, Generator& gen) {
  const int64_t N = in.below(17), K = 1 + in.below(5), H = in.below(13), E = 1 + in.below(9);
  const int64_t quant = in.below(4) - 1;  // -1, 0, 1, 2 (not supported)
  const bool drop_pad = quant == -1 && in.below(3) == 0;
  const int64_t C = 1 + in.below(std::max<int64_t>(1, N));
  const int64_t start = drop_pad ? 0 : in.below(E),
                end = drop_pad ? E : start + 1 + in.below(E - start);
  const bool with_range = in.byte() % 2 == 1;
  const int64_t type = in.below(3);
  const int64_t active_num = in.attribute(in.below(3) == 0 ? 1 + in.below(N * K + 2) : -1);
  const int64_t expert_capacity = in.attribute(drop_pad ? C : -1);
  const int64_t expert_num = in.attribute(E);
  const int64_t drop_pad_mode = in.attribute(drop_pad ? 1 : 0);
  const int64_t expert_tokens_num_type = in.attribute(type);
  const bool flag = in.byte() % 4 != 0;
  const int64_t quant_mode = in.attribute(quant);
  const int64_t row_idx_type = in.attribute(drop_pad ? 0 : in.below(2));
  int64_t range[3] = {in.attribute(start), in.attribute(end), 0};
  uint64_t range_length = with_range ? 2 : 0;
  if (in.rarely(4)) range_length = uint64_t(in.below(4));
  const bool range_null = in.rarely(3);
  const int32_t numerics = in.enumeration(int32_t(in.byte() % 2), 2);

  FuzzTensor x, ids, scale, offset, weight;
  FuzzTensor expanded_x, expanded_row_idx, counts, expanded_scale, expanded_weight;
  decode_input(in, x, {N, H}, quant == -1 && in.rarely(24) ? MR_INT8 : floating_dtype(in));
  decode_input(in, ids, {N, K}, MR_INT32);
  const int64_t scale_mode = in.below(4);
  if (quant == -1 && scale_mode == 0) decode_input(in, scale, {N}, MR_FLOAT32);
  if (quant == 0 && scale_mode != 3) decode_input(in, scale, {1}, MR_FLOAT32);
  if (quant == 0 && scale_mode == 1) decode_input(in, offset, {1}, MR_FLOAT32);
  if (quant == 1 && scale_mode == 0) decode_input(in, scale, {end - start, H}, MR_FLOAT32);
  if (quant == 1 && scale_mode == 1) decode_input(in, scale, {1, H}, MR_FLOAT32);
  if (in.byte() % 2 == 0) decode_input(in, weight, {N, K}, MR_FLOAT32);
  x.fill(gen, in.byte());
  // Ids outside the range (and -1) are valid here: they are not routed.
  ids.fill(gen, 0, E + 1, in.byte() < 200 ? IndexFill::near_limit : IndexFill::arbitrary);
  for (FuzzTensor* t : {&scale, &offset, &weight}) t->fill(gen, in.byte());
  for (FuzzTensor* t : {&x, &ids, &scale, &offset, &weight}) t->create();

  mrTensorDesc desc[5];
  for (mrTensorDesc& d : desc) d = poisoned_desc();
  const int64_t* range_pointer = range_null ? nullptr : range;
  const mrStatus inferred = mrMoeInitRoutingInferShape(
      x.handle, ids.handle, scale.handle, offset.handle, weight.handle, active_num, expert_capacity,
      expert_num, drop_pad_mode, expert_tokens_num_type, flag, quant_mode, range_pointer,
      range_length, row_idx_type, &desc[0], &desc[1], &desc[2], &desc[3], &desc[4]);
  check_status(inferred, "routing shape inference");
  const std::string inferred_message = inferred == MR_SUCCESS ? "" : last_message();
  const bool ok = inferred == MR_SUCCESS;
  decode_output(in, expanded_x, ok ? &desc[0] : nullptr, {N * K, H}, x.dtype);
  decode_output(in, expanded_row_idx, ok ? &desc[1] : nullptr, {N * K}, MR_INT32);
  decode_output(in, counts, ok ? &desc[2] : nullptr, {end - start}, MR_INT64);
  decode_output(in, expanded_scale, ok ? &desc[3] : nullptr, {N * K}, MR_FLOAT32);
  decode_output(in, expanded_weight, ok ? &desc[4] : nullptr, {N * K, 1}, MR_FLOAT32);

  Driver d;
  d.outputs = {&expanded_x, &expanded_row_idx, &counts, &expanded_scale, &expanded_weight};
  d.phase_one = [&](uint64_t* ws, mrExecutor** ex) {
    return mrMoeInitRoutingGetWorkspaceSize(
        x.handle, ids.handle, scale.handle, offset.handle, weight.handle, active_num,
        expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_type, flag, quant_mode,
        range_pointer, range_length, row_idx_type, expanded_x.handle, expanded_row_idx.handle,
        counts.handle, expanded_scale.handle, expanded_weight.handle, ws, ex);
  };
  d.phase_two = [](void* w, uint64_t ws, mrExecutor* ex) {
    return mrMoeInitRouting(w, ws, ex, nullptr);
  };
  d.needs_workspace = true;
  d.foreign_phase_two = [](mrExecutor* ex) { return mrMoeInitRoutingV2(nullptr, 0, ex, nullptr); };
  Numerics chosen = Numerics::atlas_a2;
  d.configure = [&](Input& input, mrExecutor* ex) {
    if (input.rarely(64))
      FUZZ_CHECK(mrSetAccumulationOrder(ex, 0) == MR_ERROR_INVALID_ARGUMENT, "");
    const mrStatus s = mrSetNumerics(ex, numerics);
    FUZZ_CHECK((s == MR_SUCCESS) == (numerics == 0 || numerics == 1), "numerics setter");
    if (s == MR_SUCCESS) chosen = Numerics(numerics);
  };
  d.cpp = [&](const std::vector<FuzzTensor*>& m, const ExecConfig& config) {
    MoeInitRoutingAttrs attrs;
    attrs.active_num = active_num;
    attrs.expert_capacity = expert_capacity;
    attrs.expert_num = expert_num;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.expert_tokens_num_type = expert_tokens_num_type;
    attrs.expert_tokens_num_flag = flag;
    attrs.quant_mode = quant_mode;
    attrs.has_active_expert_range = range_length != 0;
    attrs.active_expert_range = {range[0], range[1]};
    attrs.row_idx_type = row_idx_type;
    attrs.numerics = chosen;
    return moe_init_routing(x.view(), ids.view(), scale.view(), offset.view(), weight.view(), attrs,
                            m[0]->view(), m[1]->view(), m[2]->view(), m[3]->view(), m[4]->view(),
                            config);
  };
  // Counts keep one total per expert of the range; drop-pad one entry per expert and slot.
  const bool has_range = range_length == 2;
  const bool range_small =
      has_range ? range[0] >= 0 && range[1] >= range[0] && range[1] - range[0] <= kMaxElements
                : expert_num >= 0 && expert_num <= kMaxElements;
  const bool within_budget =
      (drop_pad_mode != 1 || experts_within_budget(expert_num, expert_capacity, true)) &&
      (!flag || range_small);
  const std::string what =
      "routing N=" + std::to_string(N) + " K=" + std::to_string(K) +
      " E=" + std::to_string(expert_num) + " quant_mode=" + std::to_string(quant_mode) +
      " drop_pad_mode=" + std::to_string(drop_pad_mode) + " range=" +
      (range_length == 2 ? std::to_string(range[0]) + ":" + std::to_string(range[1]) : "none") +
      " type=" + std::to_string(expert_tokens_num_type) + " flag=" + std::to_string(flag) +
      " row_idx_type=" + std::to_string(row_idx_type) + " scale=" + std::to_string(scale.passed) +
      " offset=" + std::to_string(offset.passed) + " topk_weight=" + std::to_string(weight.passed);
  run_phases(what, in, d, inferred, inferred_message, within_budget);
}

/// A Driver::configure that sets `numerics` (any int32, valid or not) on the executor and, when
/// the setter accepts it, records it in *chosen for the C++ call.
std::function<void(Input&, mrExecutor*)> numerics_setter(int32_t numerics, Numerics* chosen) {
  return [numerics, chosen](Input&, mrExecutor* e) {
    const mrStatus s = mrSetNumerics(e, numerics);
    FUZZ_CHECK((s == MR_SUCCESS) == (numerics == 0 || numerics == 1), "numerics setter");
    if (s == MR_SUCCESS) *chosen = Numerics(numerics);
  };
}

/// The combine's forward, V1 (`v1`) or V2: sizes, layout, which optional inputs are given, the
/// index values (-1, rows cut by active_num, out of range) and the numerics from the input.
void fuzz_finalize(Input& in, Generator& gen, bool v1) {
  const int64_t N = in.below(9), K = 1 + in.below(4), H = in.below(21), E = 1 + in.below(6);
  const int64_t mode = v1 ? 0 : in.below(4);
  const bool drop_pad = mode == 1 || mode == 3;
  const int64_t C = in.below(4);
  const int64_t pairs = N * K;
  // Dropless: usually N*K rows; sometimes fewer (the dispatch cut them by active_num).
  const int64_t rows = drop_pad ? E * C : (in.below(4) == 3 ? in.below(pairs + 1) : pairs);
  const uint8_t given =
      v1 ? uint8_t(0x1D | (in.byte() & 0x02)) : in.byte();  // V1: x1 bias scales ids
  const bool mixed = in.byte() % 2 == 1;
  const int64_t drop_pad_mode = v1 ? 0 : in.attribute(mode);
  const int32_t numerics = in.enumeration(int32_t(in.byte() % 2), 2);
  const int32_t dtype = floating_dtype(in);

  FuzzTensor ex, idx, x1, x2, bias, scales, experts, out;
  decode_input(in, ex, drop_pad ? std::vector<int64_t>{E, C, H} : std::vector<int64_t>{rows, H},
               dtype);
  decode_input(in, idx, {pairs}, MR_INT32);
  if (given & 0x01) decode_input(in, x1, {N, H}, dtype);
  if (given & 0x02) decode_input(in, x2, {N, H}, dtype);
  if (given & 0x04) decode_input(in, bias, {E, H}, dtype);
  if (given & 0x08)
    decode_input(in, scales, {N, K}, mixed && dtype == MR_BFLOAT16 ? MR_FLOAT32 : dtype);
  if (given & 0x10) decode_input(in, experts, {N, K}, MR_INT32);
  for (FuzzTensor* t : {&ex, &x1, &x2, &bias, &scales}) t->fill(gen, in.byte());
  // Valid values: rows [0, R) and, dropless, [R, N*K) (cut by active_num: skipped).
  idx.fill(gen, 0, drop_pad ? rows : pairs, index_fill_of(in.byte()));
  experts.fill(gen, 0, E, index_fill_of(in.byte()));
  for (FuzzTensor* t : {&ex, &idx, &x1, &x2, &bias, &scales, &experts}) t->create();

  mrTensorDesc desc = poisoned_desc();
  const mrTensorDesc untouched = desc;
  const bool desc_null = in.rarely(2);
  mrTensorDesc* desc_arg = desc_null ? nullptr : &desc;
  const mrStatus inferred =
      v1 ? mrMoeFinalizeRoutingInferShape(ex.handle, x1.handle, x2.handle, bias.handle,
                                          scales.handle, idx.handle, experts.handle, desc_arg)
         : mrMoeFinalizeRoutingV2InferShape(ex.handle, idx.handle, x1.handle, x2.handle,
                                            bias.handle, scales.handle, experts.handle,
                                            drop_pad_mode, desc_arg);
  check_status(inferred, "finalize shape inference");
  const std::string inferred_message = inferred == MR_SUCCESS ? "" : last_message();
  if (inferred != MR_SUCCESS) FUZZ_CHECK(same_bytes(&desc, &untouched, sizeof desc), "desc kept");
  if (desc_null) {
    FUZZ_CHECK(inferred == MR_ERROR_INVALID_ARGUMENT, "NULL desc refused");
    return;
  }
  decode_output(in, out, inferred == MR_SUCCESS ? &desc : nullptr, {N, H}, ex.dtype);

  Driver d;
  d.outputs = {&out};
  d.phase_one = [&](uint64_t* ws, mrExecutor** e) {
    return v1 ? mrMoeFinalizeRoutingGetWorkspaceSize(ex.handle, x1.handle, x2.handle, bias.handle,
                                                     scales.handle, idx.handle, experts.handle,
                                                     out.handle, ws, e)
              : mrMoeFinalizeRoutingV2GetWorkspaceSize(ex.handle, idx.handle, x1.handle, x2.handle,
                                                       bias.handle, scales.handle, experts.handle,
                                                       drop_pad_mode, out.handle, ws, e);
  };
  d.phase_two = [v1](void* w, uint64_t ws, mrExecutor* e) {
    return v1 ? mrMoeFinalizeRouting(w, ws, e, nullptr) : mrMoeFinalizeRoutingV2(w, ws, e, nullptr);
  };
  d.foreign_phase_two = [v1](mrExecutor* e) {
    return v1 ? mrMoeFinalizeRoutingV2(nullptr, 0, e, nullptr)
              : mrMoeFinalizeRouting(nullptr, 0, e, nullptr);
  };
  Numerics chosen = Numerics::atlas_a2;
  d.configure = numerics_setter(numerics, &chosen);
  d.cpp = [&](const std::vector<FuzzTensor*>& m, const ExecConfig& config) {
    MoeFinalizeRoutingInputs inputs;
    inputs.expanded_x = ex.view();
    inputs.expanded_row_idx = idx.view();
    inputs.x1 = x1.view();
    inputs.x2 = x2.view();
    inputs.bias = bias.view();
    inputs.scales = scales.view();
    inputs.expert_idx = experts.view();
    MoeFinalizeRoutingAttrs attrs;
    attrs.api = v1 ? FinalizeRoutingApi::v1 : FinalizeRoutingApi::v2;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.numerics = chosen;
    return moe_finalize_routing(inputs, attrs, m[0]->view(), config);
  };
  const std::string what = std::string(v1 ? "finalize_v1" : "finalize_v2") +
                           " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                           " H=" + std::to_string(H) + " R=" + std::to_string(rows) +
                           " drop_pad_mode=" + std::to_string(drop_pad_mode) +
                           " inputs=" + std::to_string(int(given & 0x1F));
  run_phases(what, in, d, inferred, inferred_message, gather_within_budget(idx, ex));
}

/// The combine's backward: both modes, active_num, which optional inputs and outputs are given.
void fuzz_finalize_grad(Input& in, Generator& gen) {
  const int64_t N = in.below(9), K = 1 + in.below(4), H = in.below(21), E = 1 + in.below(6);
  const int64_t mode = in.below(2), C = in.below(4), pairs = N * K;
  const int64_t active = mode == 0 && pairs > 1 && in.below(3) == 2 ? 1 + in.below(pairs - 1) : 0;
  const int64_t rows = mode == 1 ? E * C : (active > 0 ? active : pairs);
  const uint8_t given = uint8_t(in.byte() ^ 0x03);  // natural: expanded_x and scales
  const bool mixed = in.byte() % 2 == 1;
  const int64_t drop_pad_mode = in.attribute(mode);
  const int64_t active_num = in.attribute(active);
  const int64_t expert_num = in.attribute(mode == 1 ? E : 0);
  const int64_t expert_capacity = in.attribute(mode == 1 ? C : 0);
  const int32_t numerics = in.enumeration(int32_t(in.byte() % 2), 2);
  const int32_t dtype = floating_dtype(in);

  FuzzTensor gy, idx, ex, scales, experts, bias, gex, gs, gb;
  const std::vector<int64_t> rows_shape =
      mode == 1 ? std::vector<int64_t>{E, C, H} : std::vector<int64_t>{rows, H};
  decode_input(in, gy, {N, H}, dtype);
  decode_input(in, idx, {pairs}, MR_INT32);
  if (given & 0x01) decode_input(in, ex, rows_shape, dtype);
  if (given & 0x02)
    decode_input(in, scales, {N, K}, mixed && dtype == MR_BFLOAT16 ? MR_FLOAT32 : dtype);
  if (given & 0x04) decode_input(in, experts, {N, K}, MR_INT32);
  if (given & 0x08) decode_input(in, bias, {E, H}, dtype);
  for (FuzzTensor* t : {&gy, &ex, &scales, &bias}) t->fill(gen, in.byte());
  idx.fill(gen, 0, mode == 1 ? rows : pairs, index_fill_of(in.byte()));
  experts.fill(gen, 0, E, index_fill_of(in.byte()));
  for (FuzzTensor* t : {&gy, &idx, &ex, &scales, &experts, &bias}) t->create();

  mrTensorDesc desc[3];
  for (mrTensorDesc& dd : desc) dd = poisoned_desc();
  const mrStatus inferred = mrMoeFinalizeRoutingV2GradInferShape(
      gy.handle, idx.handle, ex.handle, scales.handle, experts.handle, bias.handle, drop_pad_mode,
      active_num, expert_num, expert_capacity, &desc[0], &desc[1], &desc[2]);
  check_status(inferred, "finalize grad shape inference");
  const std::string inferred_message = inferred == MR_SUCCESS ? "" : last_message();
  const bool ok = inferred == MR_SUCCESS;
  decode_output(in, gex, ok ? &desc[0] : nullptr, rows_shape, gy.dtype);
  decode_output(in, gs, ok ? &desc[1] : nullptr, {N, K}, scales.dtype);
  decode_output(in, gb, ok ? &desc[2] : nullptr, {E, H}, gy.dtype);

  Driver d;
  d.outputs = {&gex, &gs, &gb};
  d.phase_one = [&](uint64_t* ws, mrExecutor** e) {
    return mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
        gy.handle, idx.handle, ex.handle, scales.handle, experts.handle, bias.handle, drop_pad_mode,
        active_num, expert_num, expert_capacity, gex.handle, gs.handle, gb.handle, ws, e);
  };
  d.phase_two = [](void* w, uint64_t ws, mrExecutor* e) {
    return mrMoeFinalizeRoutingV2Grad(w, ws, e, nullptr);
  };
  // The pair lists; none with no columns (nothing to sum: phase one reports 0). Phase one
  // succeeds only with grad_y 2-D, whose last extent is then H.
  d.needs_workspace = gy.shape.size() != 2 || gy.shape[1] > 0;
  d.foreign_phase_two = [](mrExecutor* e) {
    return mrMoeInitRoutingV2Grad(nullptr, 0, e, nullptr);
  };
  Numerics chosen = Numerics::atlas_a2;
  d.configure = numerics_setter(numerics, &chosen);
  d.cpp = [&](const std::vector<FuzzTensor*>& m, const ExecConfig& config) {
    MoeFinalizeRoutingGradInputs inputs;
    inputs.grad_y = gy.view();
    inputs.expanded_row_idx = idx.view();
    inputs.expanded_x = ex.view();
    inputs.scales = scales.view();
    inputs.expert_idx = experts.view();
    inputs.bias = bias.view();
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.active_num = active_num;
    attrs.expert_num = expert_num;
    attrs.expert_capacity = expert_capacity;
    attrs.numerics = chosen;
    MoeFinalizeRoutingGradOutputs outputs;
    outputs.grad_expanded_x = m[0]->view();
    outputs.grad_scales = m[1]->view();
    outputs.grad_bias = m[2]->view();
    return moe_finalize_routing_grad(inputs, attrs, outputs, config);
  };
  const std::string what =
      "finalize_grad N=" + std::to_string(N) + " K=" + std::to_string(K) +
      " H=" + std::to_string(H) + " drop_pad_mode=" + std::to_string(drop_pad_mode) +
      " active_num=" + std::to_string(active_num) + " E=" + std::to_string(expert_num) +
      " C=" + std::to_string(expert_capacity) + " inputs=" + std::to_string(int(given & 0x0F));
  // The pair lists hold one entry per row of grad_expanded_x (E*C in drop-pad).
  run_phases(what, in, d, inferred, inferred_message,
             gather_within_budget(idx, gy) &&
                 (drop_pad_mode != 1 || experts_within_budget(expert_num, expert_capacity, true)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t op = in.byte();
  mrSetNumThreads(1 + in.below(3));
  Generator gen(in.u64());
  // Below 128 the dispatch's operators (as before the combine came: saved inputs keep their
  // meaning), from 128 the combine's.
  if (op < 128) {
    switch (op % 3) {
      case 0: fuzz_grad(in, gen); break;
      case 1: fuzz_v2(in, gen); break;
      default: fuzz_routing(in, gen); break;
    }
  } else {
    switch ((op - 128) % 3) {
      case 0: fuzz_finalize(in, gen, true); break;
      case 1: fuzz_finalize(in, gen, false); break;
      default: fuzz_finalize_grad(in, gen); break;
    }
  }
  FUZZ_CHECK(c_api::live_tensors() == 0 && c_api::live_executors() == 0,
             "every handle and executor is freed");
  return 0;
}
