// `moe-routing info`: version, CPU instruction sets, the default thread count and the streaming
// threshold.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "commands.h"
#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cli {
namespace {

class InfoCommand : public Command {
 public:
  CommandInfo info() const override {
    return {"info", "version, CPU instruction set and thread defaults",
            "Prints the library version, the CPU instruction set the kernels use on this machine "
            "(the best one available), every instruction set this build contains and whether this "
            "CPU runs it, the default number of CPU threads (set it with the "
            "MOE_ROUTING_NUM_THREADS environment variable), and the output size from which the "
            "kernels write with streaming (cache-bypassing) stores.",
            "moe-routing info\nMOE_ROUTING_NUM_THREADS=1 moe-routing info"};
  }

  void declare(ArgParser&) override {}

  int run(const ArgParser&) override {
    std::cout << "moe-routing " << version() << '\n';
    std::cout << "cpu isa:         " << cpu_isa_name(best_cpu_isa()) << " (chosen automatically)\n";
    std::cout << "available isas:  ";
    bool first = true;
    for (CpuIsa isa : kCpuIsas) {
      std::cout << (first ? "" : ", ") << cpu_isa_name(isa)
                << (cpu_isa_available(isa) ? "" : " (not on this CPU or build)");
      first = false;
    }
    std::cout << '\n';
    std::cout << "default threads: " << get_num_threads() << threads_source() << '\n';
    std::cout << "streaming stores: outputs of " << mib(detail::streaming_store_threshold())
              << " and more bypass the caches (last-level cache: "
              << (detail::last_level_cache_bytes() > 0 ? mib(detail::last_level_cache_bytes())
                                                       : std::string("not reported"))
              << "; the threshold is its size within 8-32 MiB)\n";
    return kExitOk;
  }

 private:
  static std::string mib(int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4g MiB", double(bytes) / double(int64_t(1) << 20));
    return text;
  }
  /// Where the default thread count comes from: the variable as the library read it (an
  /// invalid value is ignored, a large one capped: core/thread_pool.h), or every core.
  static std::string threads_source() {
    const char* env = std::getenv("MOE_ROUTING_NUM_THREADS");
    const std::string set = env != nullptr ? "MOE_ROUTING_NUM_THREADS=" + std::string(env) : "";
    using Kind = detail::NumThreadsSetting::Kind;
    switch (detail::read_num_threads_setting(env).kind) {
      case Kind::unset: return " (every core; set MOE_ROUTING_NUM_THREADS to change)";
      case Kind::invalid: return " (every core; " + set + " ignored: not a whole number >= 0)";
      case Kind::every_core: return " (every core: " + set + ")";
      case Kind::capped: return " (" + set + " capped at " + std::to_string(kMaxNumThreads) + ")";
      case Kind::set: break;
    }
    return " (" + set + ")";
  }
};

}  // namespace

std::unique_ptr<Command> make_info_command() { return std::make_unique<InfoCommand>(); }

}  // namespace moe_routing::cli
