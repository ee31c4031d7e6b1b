// The float environment every kernel and reference implementation runs in: the IEEE default,
// whatever the caller set (torch's set_flush_denormal sets FTZ/DAZ, for instance):
// round-to-nearest-even, denormals kept. Core, so that the reference implementations and every
// backend use the same one.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

namespace moe_routing::detail {

/// Sets the IEEE default float environment on this thread for its lifetime, then restores the
/// caller's. Construct it on every thread that computes (each parallel piece).
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

}  // namespace moe_routing::detail
#else
namespace moe_routing::detail {
struct DefaultFloatEnvironment {};
}  // namespace moe_routing::detail
#endif
