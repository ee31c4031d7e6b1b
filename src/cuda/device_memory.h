// Small host-side helpers for callers of the CUDA backend that hold their data on the host: the
// CLI's `--device cuda`, the GPU tests and tools/gpu_check. Plain C++ (no CUDA headers); compiled
// into the library only with MOE_ROUTING_CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "moe_routing/status.h"

namespace moe_routing::cuda {

/// True when the CUDA runtime finds a usable GPU; otherwise false, and *why (if given) says what
/// the runtime answered (e.g. no driver, no device).
bool device_available(std::string* why = nullptr);

/// "NVIDIA H200 (sm_90, 132 SMs, 141 GiB)" for the current device, or the runtime's error.
std::string device_description();

/// An owning allocation of device memory on the current device (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  /// Frees what it held, then allocates `bytes` (at least one byte, so data() is never null).
  Status allocate(size_t bytes);
  /// Allocates host_bytes and copies them from host memory (synchronous).
  Status upload(const void* host, size_t bytes);
  /// Copies the first `bytes` bytes to host memory (synchronous: waits for all queued work).
  Status download(void* host, size_t bytes) const;
  /// Sets every byte to `value` (synchronous).
  Status fill(int value);

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t size_ = 0;
};

/// Waits for all work on the current device; reports an error a kernel raised asynchronously.
Status synchronize_device();

}  // namespace moe_routing::cuda
