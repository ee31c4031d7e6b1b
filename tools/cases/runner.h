// The ways of running an operator that the test cases are checked under: the reference, and the
// CPU backend at every instruction set this machine has and several thread counts.
#pragma once

#include <string>
#include <vector>

#include "moe_routing/tensor.h"

namespace moe_routing::cases {

/// One way of running an operator: a backend, an ISA and a thread count; for the forward
/// operators on the CPU backend, with a caller workspace (ExecConfig::workspace, exactly the
/// reported size, misaligned on purpose: AddressSanitizer checks the size bound) or without.
struct Runner {
  Backend backend;
  CpuIsa isa;
  int threads;
  bool caller_workspace = false;
  std::string name() const {
    if (backend == Backend::reference) return "reference";
    return std::string("cpu-") + cpu_isa_name(isa) + "-t" + std::to_string(threads) +
           (caller_workspace ? "-ws" : "");
  }
  ExecConfig config() const {
    ExecConfig c;
    c.backend = backend;
    c.isa = isa;
    c.num_threads = threads;
    return c;
  }
};

/// The reference plus every CPU ISA this machine can run, at 1, 2, 3 and 8 threads (1 and 3 with
/// a caller workspace).
inline std::vector<Runner> all_runners() {
  std::vector<Runner> runners{{Backend::reference, CpuIsa::automatic, 1}};
  for (CpuIsa isa : kCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    for (int threads : {1, 2, 3, 8})
      runners.push_back({Backend::cpu, isa, threads, threads == 1 || threads == 3});
  }
  return runners;
}

}  // namespace moe_routing::cases
