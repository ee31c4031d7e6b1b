// Baseline instruction set (any x86-64 / any CPU): scalar float32 steps.
#define MOE_ROUTING_CPU_ISA baseline
#include "cpu/grad_kernel_impl.h"

namespace moe_routing::cpu::baseline {

void grad_kernel(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_dispatch_dtype<ScalarOps>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::baseline
