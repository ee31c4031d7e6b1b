// Host-side plumbing shared by the CUDA launchers (grad_kernels.cu, routing_kernels.cu): CUDA
// error -> Status, finding and selecting the device that owns the caller's pointers, and scratch
// memory from a stream-ordered pool owned by the library.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "moe_routing/status.h"

namespace moe_routing::cuda {

/// runtime_error: "<op>: <what> must succeed, got <cudaErrorName>: <description>".
Status cuda_error(const char* op, const char* what, cudaError_t error);

#define MOE_ROUTING_CUDA_CHECK(op, call)                                          \
  do {                                                                            \
    const cudaError_t moe_routing_cuda_error_ = (call);                           \
    if (moe_routing_cuda_error_ != cudaSuccess)                                   \
      return ::moe_routing::cuda::cuda_error(op, #call, moe_routing_cuda_error_); \
  } while (0)

/// After a launch: the launch's error, if any, as a Status naming the kernel (checked launches).
Status check_launch(const char* op, const char* kernel);

/// Copies `bytes` from device memory to the host in the order of `stream` and waits for that
/// stream only (a plain cudaMemcpy would run on the legacy default stream and wait for every
/// blocking stream of the device): the index checks' read-backs.
Status read_to_host(const char* op, void* host, const void* device, size_t bytes,
                    cudaStream_t stream);

/// One pointer the caller passed, with the bytes it spans (empty spans are not checked).
struct DevicePointer {
  const char* name;
  const void* data;
  size_t bytes;
};

/// Makes the device that owns the pointers current for its lifetime and restores the previous
/// device afterwards. `status()` is an invalid_argument error when a non-empty pointer is not
/// CUDA device (or managed) memory, or when the pointers live on different devices; `empty()`
/// is true when every span is empty (nothing to do).
class DeviceScope {
 public:
  DeviceScope(const char* op, std::initializer_list<DevicePointer> pointers);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  const Status& status() const { return status_; }
  bool empty() const { return empty_; }
  int device() const { return device_; }

 private:
  Status status_;
  bool empty_ = true;
  int device_ = 0;
  int previous_ = -1;
};

/// Scratch memory from the library's pool on the current device (cudaMallocFromPoolAsync): the
/// pool keeps up to kPoolKeepBytes between calls, so repeated calls do not go back to the driver.
/// Freed stream-ordered on the same stream when the object goes out of scope. Where the device or
/// its environment has no memory pools, plain cudaMalloc / cudaFree (which synchronises) instead.
class Scratch {
 public:
  static constexpr uint64_t kPoolKeepBytes = uint64_t(256) << 20;

  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  /// Allocates `bytes` (at least 1) on `stream`.
  Status allocate(const char* op, size_t bytes, cudaStream_t stream);
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool stream_ordered_ = true;
};

/// Carves aligned sub-buffers out of one scratch allocation: first a sizing pass (base null),
/// then the real pass over the allocation.
class ScratchLayout {
 public:
  explicit ScratchLayout(char* base = nullptr) : base_(base) {}
  template <typename T>
  T* take(size_t count) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return p;
  }
  size_t bytes() const { return offset_ + kAlign; }

 private:
  static constexpr size_t kAlign = 256;
  char* base_;
  size_t offset_ = 0;
};

/// Multiprocessors of the current device (cached per device).
int multiprocessor_count();

/// Blocks for a grid-stride kernel: `work_blocks` if that is fewer, else one wave of
/// `resident_per_sm` blocks on every multiprocessor; at least 1.
int64_t grid_blocks(int64_t work_blocks, int resident_per_sm);

}  // namespace moe_routing::cuda
