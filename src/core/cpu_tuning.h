// Which measured tuning the CPU kernels take on this CPU: where the best prefetch policy was found
// to differ between microarchitectures (docs/PERFORMANCE.md, "On an AMD Zen 4 VM" and "Page
// translations two runs ahead"). A tuning changes only when lines are requested, never a bit of a
// result.
#pragma once

namespace moe_routing::detail {

enum class CpuTuning {
  standard,  // the Intel and the earlier AMD VMs the distances were chosen on, and any other CPU
  amd_zen4,  // AMD family 19h with AVX-512: Zen 4 (Zen 3, the same family, has no AVX-512)
};

/// The tuning of a CPU by its CPUID vendor, its (displayed) family and whether it has AVX-512.
CpuTuning cpu_tuning_for(bool amd, int family, bool avx512);

/// This CPU's tuning, detected once (standard off x86-64), unless set_cpu_tuning_for_testing
/// forced one. Thread-safe.
CpuTuning cpu_tuning();

/// Tests only: forces `tuning` for the process, or with nullptr restores the detected one.
void set_cpu_tuning_for_testing(const CpuTuning* tuning);

}  // namespace moe_routing::detail
