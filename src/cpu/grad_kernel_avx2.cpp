// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/avx2_vector.h"
#include "cpu/grad_kernel_impl.h"

namespace moe_routing::cpu::avx2 {

void grad_kernel(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_dispatch_dtype<Avx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx2
