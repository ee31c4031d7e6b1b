#include "moe_routing/tensor.h"

#include <limits>
#include <sstream>

namespace moe_routing {

const char* device_name(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown";
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  for (int64_t extent : shape_) {
    if (ndim == kMaxDims) break;
    shape[ndim++] = extent;
  }
}

TensorView::TensorView(void* data_, DType dtype_, int ndim_, const int64_t* shape_, Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  ndim = ndim_ < 0 ? 0 : (ndim_ > kMaxDims ? kMaxDims : ndim_);
  for (int d = 0; d < ndim; ++d) shape[d] = shape_[d];
}

int64_t TensorView::numel() const {
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] <= 0) return 0;
    if (total > std::numeric_limits<int64_t>::max() / shape[d])
      return std::numeric_limits<int64_t>::max();
    total *= shape[d];
  }
  return total;
}

namespace {

std::string shape_text(const int64_t* shape, int ndim) {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < ndim; ++d) out << (d ? ", " : "") << shape[d];
  out << ']';
  return out.str();
}

}  // namespace

std::string shape_string(const TensorView& t) { return shape_text(t.shape, t.ndim); }

int64_t OutputSpec::numel() const {
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  return total;
}

std::string shape_string(const OutputSpec& spec) { return shape_text(spec.shape, spec.ndim); }

bool device_supported(Device device) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (device == Device::cuda) return true;
#endif
  return device == Device::cpu;
}

std::string describe(const TensorView& t) {
  std::ostringstream out;
  out << t.ndim << "-D " << dtype_name(t.dtype) << ' ' << shape_string(t);
  return out.str();
}

}  // namespace moe_routing
