// `moe-routing info`: version, CPU instruction sets and the default thread count.
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cli {
namespace {

class InfoCommand : public Command {
 public:
  CommandInfo info() const override {
    return {"info", "version, CPU instruction set and thread defaults",
            "Prints the library version, the CPU instruction set the kernels use on this machine "
            "(the best one available), every instruction set this build contains and whether this "
            "CPU runs it, and the default number of CPU threads (set it with the "
            "MOE_ROUTING_NUM_THREADS environment variable).",
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
    const char* env = std::getenv("MOE_ROUTING_NUM_THREADS");
    std::cout << "default threads: " << get_num_threads()
              << (env != nullptr
                      ? " (MOE_ROUTING_NUM_THREADS=" + std::string(env) + ")"
                      : std::string(" (every core; set MOE_ROUTING_NUM_THREADS to change)"))
              << '\n';
    return kExitOk;
  }
};

}  // namespace

std::unique_ptr<Command> make_info_command() { return std::make_unique<InfoCommand>(); }

}  // namespace moe_routing::cli
