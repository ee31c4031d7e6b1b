// Baseline instruction set (any x86-64 / any CPU): scalar float32 steps.
#define MOE_ROUTING_CPU_ISA baseline
#include "cpu/finalize_kernel_impl.h"

namespace moe_routing::cpu::baseline {

void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  finalize_dispatch<FinalizeScalarOps>(args, unit_begin, unit_end);
}

void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  grad_rows_dispatch<FinalizeScalarOps>(args, row_begin, row_end);
}

void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_bias_dispatch<FinalizeScalarOps>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::baseline
