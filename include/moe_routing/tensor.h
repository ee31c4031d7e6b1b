// A non-owning view of a dense, row-major (C-contiguous) tensor, and the execution settings every
// operator call takes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "moe_routing/dtype.h"
#include "moe_routing/status.h"

namespace moe_routing {

enum class Device : int32_t { cpu = 0, cuda = 1 };

/// "cpu" or "cuda".
const char* device_name(Device device);

constexpr int kMaxDims = 8;

/// Non-owning, contiguous row-major. Inputs are read through it and never written. Every operator
/// requires a non-empty tensor's data to be aligned to its element size, and no output to share a
/// byte with an input or another output (invalid argument otherwise); inputs may share bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  Device device = Device::cpu;

  TensorView() = default;
  TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
             Device device_ = Device::cpu);
  TensorView(const void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
             Device device_ = Device::cpu)
      : TensorView(const_cast<void*>(data_), dtype_, shape_, device_) {}
  /// From a shape array of `ndim_` entries (ndim_ <= kMaxDims is the caller's duty; more are cut).
  TensorView(void* data_, DType dtype_, int ndim_, const int64_t* shape_,
             Device device_ = Device::cpu);

  int64_t size(int dim) const { return shape[dim]; }
  /// Product of the shape (1 for a 0-d tensor). Saturates at INT64_MAX instead of overflowing.
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
};

/// "[2, 3]"
std::string shape_string(const TensorView& t);
/// "2-D float16 [2, 3]"
std::string describe(const TensorView& t);

/// Shape and dtype of one output as an operator's shape inference decides it.
struct OutputSpec {
  /// False when the configuration does not produce this output: it may then be passed with data
  /// null (any shape) and is ignored; given with data, it must have the planned shape and dtype
  /// and is filled with zeros.
  bool produced = false;
  DType dtype = DType::float32;
  int ndim = 0;
  int64_t shape[3] = {0, 0, 0};

  int64_t numel() const;
};

/// "[2, 3]"
std::string shape_string(const OutputSpec& spec);

/// Whether this build of the library runs operators on tensors of `device`: always for cpu; for
/// cuda only in a build with the CUDA backend (MOE_ROUTING_CUDA), GPU present or not.
bool device_supported(Device device);

/// Which implementation runs a call.
enum class Backend : int32_t {
  automatic = 0,  // the device's fastest implementation (CPU kernels for CPU tensors)
  reference = 1,  // the plain reference implementation (slow; the definition of the semantics)
  cpu = 2,        // the CPU kernels
};

/// Which CPU instruction set the CPU kernels use. `automatic` picks the best the CPU supports.
/// avx2 needs AVX2 and F16C; avx512 AVX-512 F, BW and VL as well (and the OS's support of their
/// registers): there the combine's kernels (moe_finalize_routing and its grad) run AVX-512 code,
/// the other operators their AVX2 code. Every level gives the same bits.
enum class CpuIsa : int32_t { automatic = 0, baseline = 1, avx2 = 2, avx512 = 3 };

/// Every CPU ISA a build may have, lowest first (what tests and `moe-routing info` walk).
constexpr CpuIsa kCpuIsas[] = {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512};

/// "automatic", "baseline", "avx2", "avx512".
const char* cpu_isa_name(CpuIsa isa);
/// Whether this build contains, and this CPU can run, the given ISA's kernels.
bool cpu_isa_available(CpuIsa isa);
/// The ISA `automatic` resolves to on this machine.
CpuIsa best_cpu_isa();

/// The most CPU threads a call may use (the calling thread included): ExecConfig::num_threads,
/// set_num_threads and MOE_ROUTING_NUM_THREADS are bounded by it. Far above any core count the
/// kernels scale to, and low enough that a mistyped count cannot ask the system for millions of
/// threads.
constexpr int kMaxNumThreads = 1024;

struct ExecConfig {
  Backend backend = Backend::automatic;
  /// CPU threads for this call, 0 .. kMaxNumThreads; 0 = the library default (see
  /// set_num_threads). A call starts only as many as its work can use (about one per 2 MiB of
  /// memory traffic), when it first needs them, and keeps them in a pool for later calls; a
  /// thread the system refuses to start is a runtime error naming the count.
  int num_threads = 0;
  CpuIsa isa = CpuIsa::automatic;
  /// CUDA tensors only: the cudaStream_t (as void*) the work is queued on; null = the default
  /// stream. Ignored for CPU tensors and in builds without CUDA.
  void* stream = nullptr;
  /// CPU kernels of moe_init_routing(_v2) and moe_finalize_routing_grad: caller-owned scratch
  /// memory of workspace_bytes bytes (any alignment), at least what
  /// moe_init_routing(_v2)_workspace_size or moe_finalize_routing_grad_workspace_size reports
  /// for the same num_threads; the bytes the call uses (that size, from workspace) must share
  /// none with an input or an output. The call then allocates nothing. Null (the default): the
  /// library allocates the scratch itself. moe_init_routing_grad and moe_finalize_routing need
  /// none; the reference backend ignores it.
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

/// Library-wide default thread count for CPU kernels, 0 .. kMaxNumThreads (invalid argument
/// otherwise, and the default stays). 0 restores the initial default: the
/// MOE_ROUTING_NUM_THREADS environment variable (read once, at the first use of the thread
/// count; not again here) if it is a whole number >= 1 (larger than
/// kMaxNumThreads: kMaxNumThreads), else every core (at most kMaxNumThreads). No thread is
/// started here: calls start what their work can use.
Status set_num_threads(int num_threads);
int get_num_threads();

/// A parallel loop supplied by the host application: runs task(context, begin, end) on at most
/// `max_pieces` contiguous pieces covering [0, num_tasks) and returns when every piece is done.
/// The pieces may run on any threads, in any order; the kernels' results never depend on how the
/// range is split.
using ParallelForFn = void (*)(int64_t num_tasks, int max_pieces,
                               void (*task)(void* context, int64_t begin, int64_t end),
                               void* context);

/// Runs the CPU kernels' parallel loops on the host's thread pool instead of the library's own
/// (null restores the built-in pool). A framework with its own pool installs its loop so that two
/// pools never compete for the same cores: the torch extension installs at::parallel_for, whose
/// OpenMP workers otherwise keep spinning on the cores our workers need right after each PyTorch
/// operator. Not for use while operators are running on other threads. The C ABI's promise that
/// phase two allocates nothing holds for the built-in pool; a host loop may allocate.
///
/// `min_bytes_per_thread`: a kernel uses another thread only for at least this much memory
/// traffic per thread. The built-in pool's sleeping workers take tens of microseconds to wake
/// (its threshold is 2 MiB); a host pool whose workers spin between jobs, like OpenMP's, starts a
/// piece in a few: 256 KiB made 16-token backward calls 1.5x faster on PyTorch's pool.
void set_parallel_backend(ParallelForFn parallel_for, int64_t min_bytes_per_thread = int64_t(256)
                                                                                     << 10);

}  // namespace moe_routing
