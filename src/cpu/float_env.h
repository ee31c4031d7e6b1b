// Kernels run with the IEEE default float environment whatever the caller set (torch's
// set_flush_denormal, for instance, sets FTZ/DAZ): round-to-nearest-even, denormals kept.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

namespace moe_routing::cpu {

class DefaultFloatEnvironment {
 public:
  DefaultFloatEnvironment() : saved_(_mm_getcsr()) {
    // Clear FTZ (bit 15), DAZ (bit 6) and the rounding control (bits 13-14); keep masks/flags.
    _mm_setcsr(saved_ & ~(0x8000u | 0x0040u | 0x6000u));
  }
  ~DefaultFloatEnvironment() { _mm_setcsr(saved_); }
  DefaultFloatEnvironment(const DefaultFloatEnvironment&) = delete;
  DefaultFloatEnvironment& operator=(const DefaultFloatEnvironment&) = delete;

 private:
  unsigned saved_;
};

}  // namespace moe_routing::cpu
#else
namespace moe_routing::cpu {
struct DefaultFloatEnvironment {};
}  // namespace moe_routing::cpu
#endif
