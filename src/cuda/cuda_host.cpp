// Host-side parts of the CUDA backend that need no kernels: errors, device scope, the scratch
// pool, device buffers for host callers, and the index-error messages.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_runtime_util.h"
#include "cuda/device_memory.h"

namespace moe_routing::cuda {

Status cuda_error(const char* op, const char* what, cudaError_t error) {
  return runtime_error(op, what, " must succeed, got ", cudaGetErrorName(error), ": ",
                       cudaGetErrorString(error));
}

Status check_launch(const char* op, const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::ok();
  return runtime_error(op, "the launch of kernel ", kernel, " must succeed, got ",
                       cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

Status read_to_host(const char* op, void* host, const void* device, size_t bytes,
                    cudaStream_t stream) {
  MOE_ROUTING_CUDA_CHECK(op, cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
  MOE_ROUTING_CUDA_CHECK(op, cudaStreamSynchronize(stream));
  return Status::ok();
}

// ---- DeviceScope -----------------------------------------------------------------------------

DeviceScope::DeviceScope(const char* op, std::initializer_list<DevicePointer> pointers) {
  const char* first_name = nullptr;
  for (const DevicePointer& p : pointers) {
    if (p.bytes == 0 || p.data == nullptr) continue;
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, p.data);
    if (error != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // not sticky: clear it
      status_ = runtime_error(op, "tensors on device cuda need a usable CUDA device, got ",
                              cudaGetErrorName(error), ": ", cudaGetErrorString(error), " (for ",
                              p.name, ")");
      return;
    }
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      status_ = invalid_argument(
          op, p.name, " must be CUDA device memory for a tensor on device cuda, got ",
          attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory");
      return;
    }
    if (first_name == nullptr) {
      first_name = p.name;
      device_ = attributes.device;
    } else if (attributes.device != device_) {
      status_ = invalid_argument(op, p.name, " must be on the CUDA device of ", first_name, " (",
                                 device_, "), got device ", attributes.device);
      return;
    }
  }
  empty_ = first_name == nullptr;
  if (empty_) return;
  int current = 0;
  cudaError_t error = cudaGetDevice(&current);
  if (error != cudaSuccess) {
    status_ = cuda_error(op, "cudaGetDevice", error);
    return;
  }
  if (current != device_) {
    error = cudaSetDevice(device_);
    if (error != cudaSuccess) {
      status_ = cuda_error(op, "cudaSetDevice", error);
      return;
    }
    previous_ = current;
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) static_cast<void>(cudaSetDevice(previous_));
}

// ---- scratch pool ------------------------------------------------------------------------------

namespace {

/// The library's memory pool of each device, created on first use and never destroyed (process
/// lifetime, like the runtime's own default pools); null where memory pools are not supported.
Status library_pool(const char* op, int device, cudaMemPool_t* pool) {
  static std::mutex mutex;
  static std::vector<int> state;  // 0 = not tried, 1 = created, -1 = unsupported
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= size_t(device)) {
    pools.resize(size_t(device) + 1, nullptr);
    state.resize(size_t(device) + 1, 0);
  }
  if (state[size_t(device)] == 0) {
    state[size_t(device)] = -1;
    int supported = 0;
    MOE_ROUTING_CUDA_CHECK(
        op, cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created = nullptr;
    if (supported && cudaMemPoolCreate(&created, &props) == cudaSuccess) {
      uint64_t keep = Scratch::kPoolKeepBytes;
      static_cast<void>(cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep));
      pools[size_t(device)] = created;
      state[size_t(device)] = 1;
    }
    static_cast<void>(cudaGetLastError());  // a refused pool is not an error of this call
  }
  *pool = pools[size_t(device)];
  return Status::ok();
}

}  // namespace

Status Scratch::allocate(const char* op, size_t bytes, cudaStream_t stream) {
  int device = 0;
  MOE_ROUTING_CUDA_CHECK(op, cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  MOE_ROUTING_RETURN_IF_ERROR(library_pool(op, device, &pool));
  void* data = nullptr;
  const size_t size = std::max<size_t>(bytes, 1);
  stream_ordered_ = pool != nullptr;
  const cudaError_t error = stream_ordered_ ? cudaMallocFromPoolAsync(&data, size, pool, stream)
                                            : cudaMalloc(&data, size);
  if (error != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // an allocation failure is not sticky: clear it
    return runtime_error(op, "scratch memory of ", bytes,
                         " bytes on the GPU must be allocatable, got ", cudaGetErrorName(error),
                         ": ", cudaGetErrorString(error));
  }
  data_ = static_cast<char*>(data);
  stream_ = stream;
  return Status::ok();
}

Scratch::~Scratch() {
  if (data_ == nullptr) return;
  if (stream_ordered_)
    static_cast<void>(cudaFreeAsync(data_, stream_));
  else
    static_cast<void>(cudaFree(data_));  // waits for the work that uses it
}

int multiprocessor_count() {
  static std::mutex mutex;
  static std::vector<int> counts;
  int device = 0;
  // A failed query is not this call's error: cleared (not sticky), so that the next launch check
  // does not report it as that launch's failure; one block per multiprocessor is assumed.
  if (cudaGetDevice(&device) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return 1;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (counts.size() <= size_t(device)) counts.resize(size_t(device) + 1, 0);
  if (counts[size_t(device)] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      sms = 1;
    }
    if (sms <= 0) sms = 1;
    counts[size_t(device)] = sms;
  }
  return counts[size_t(device)];
}

int64_t grid_blocks(int64_t work_blocks, int resident_per_sm) {
  const int64_t wave = int64_t(multiprocessor_count()) * std::max(resident_per_sm, 1);
  return std::max<int64_t>(1, std::min(work_blocks, wave));
}

Status zero_device_memory(const char* op, void* data, size_t bytes, void* stream) {
  if (bytes == 0) return Status::ok();
  DeviceScope scope(op, {{"output", data, bytes}});
  MOE_ROUTING_RETURN_IF_ERROR(scope.status());
  MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(data, 0, bytes, static_cast<cudaStream_t>(stream)));
  return Status::ok();
}

// ---- messages ----------------------------------------------------------------------------------
// The CPU checks' own wording (src/params/*_problem.h); test_cuda_host.cpp compares the two.

Status grad_index_error(const MoeInitRoutingGradPlan& plan, int64_t position, int64_t value) {
  return detail::grad_row_index_error(plan, position, value);
}

Status v2_expert_id_error(int64_t top_k, int64_t limit, int64_t position, int64_t id) {
  return detail::v2_expert_id_error(top_k, limit, position, id);
}

// ---- device_memory.h ---------------------------------------------------------------------------

namespace {
constexpr const char* kHelper = "cuda: ";
}

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    if (why != nullptr)
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(error) + ": " +
             cudaGetErrorString(error);
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "cudaGetDeviceCount found no CUDA device";
    return false;
  }
  return true;
}

std::string device_description() {
  int device = 0;
  cudaDeviceProp props{};
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaGetDeviceProperties(&props, device);
  if (error != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(error);
  std::ostringstream out;
  out << props.name << " (sm_" << props.major << props.minor << ", " << props.multiProcessorCount
      << " SMs, " << (props.totalGlobalMem >> 30) << " GiB)";
  return out.str();
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (data_ != nullptr) static_cast<void>(cudaFree(data_));
  data_ = nullptr;
  size_ = 0;
}

Status DeviceBuffer::allocate(size_t bytes) {
  release();
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, std::max<size_t>(bytes, 1));
  if (error != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return runtime_error(kHelper, "cudaMalloc of ", bytes, " bytes must succeed, got ",
                         cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  }
  data_ = data;
  size_ = bytes;
  return Status::ok();
}

Status DeviceBuffer::upload(const void* host, size_t bytes) {
  MOE_ROUTING_RETURN_IF_ERROR(allocate(bytes));
  if (bytes > 0)
    MOE_ROUTING_CUDA_CHECK(kHelper, cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice));
  return Status::ok();
}

Status DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > size_)
    return invalid_argument(kHelper, "download size must be at most the buffer's ", size_,
                            " bytes, got ", bytes);
  if (bytes > 0)
    MOE_ROUTING_CUDA_CHECK(kHelper, cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost));
  return Status::ok();
}

Status DeviceBuffer::fill(int value) {
  if (size_ > 0) MOE_ROUTING_CUDA_CHECK(kHelper, cudaMemset(data_, value, size_));
  MOE_ROUTING_CUDA_CHECK(kHelper, cudaDeviceSynchronize());
  return Status::ok();
}

Status synchronize_device() {
  MOE_ROUTING_CUDA_CHECK(kHelper, cudaDeviceSynchronize());
  return Status::ok();
}

}  // namespace moe_routing::cuda
