// `moe-routing golden grad`: moe_init_routing_grad on .npy files, for golden data and scripts.
#include <iostream>

#include "commands.h"
#include "golden_io.h"
#include "moe_routing/moe_routing.hpp"
#include "npy.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/device_memory.h"
#endif

namespace moe_routing::cli {
namespace {

class GoldenGradCommand : public Command {
 public:
  CommandInfo info() const override {
    return {"golden grad", "compute moe_init_routing_grad (grad_x) from .npy files",
            R"(Reads grad_expanded_x and expanded_row_idx, computes
grad_x[i, :] = sum over t < top_k of grad_expanded_x[expanded_row_idx[i*top_k + t], :]
in float32 in the order of the chosen numerics (--numerics atlas_a2: the Atlas A2/A3 kernel's tree
order; ascend_950: the Ascend 950 kernel's sequential order; --order overrides it), rounds once to the input's dtype and writes grad_x [N, H] with N = len(expanded_row_idx) / top_k.

Scenarios as in CANN's aclnnMoeInitRoutingV2Grad: dropless (drop_pad_mode 0, active_num 0,
grad_expanded_x [N*top_k, H]); active (drop_pad_mode 0, active_num > 0, grad_expanded_x
[active_num, H], indices >= active_num are skipped); drop-pad (drop_pad_mode 1, grad_expanded_x
[E, C, H], index e*C + c addresses expert e slot c). Index -1 marks a dropped pair and is skipped in
every scenario; any other index outside the rows of grad_expanded_x is an error.

grad_expanded_x is float32 ('<f4'), float16 ('<f2') or bfloat16 bit patterns stored as uint16
('<u2'); grad_x is written in the same convention. expanded_row_idx is int32 ('<i4'). The output
is written atomically: on any error nothing is written. --out may name a FIFO or a device (written
in place) or a symbolic link (its target is written); it is never replaced by a regular file.)",
            "moe-routing golden grad --grad-expanded-x g.npy --expanded-row-idx r.npy --top-k 2 "
            "--out grad_x.npy\n"
            "moe-routing golden grad --grad-expanded-x g.npy --expanded-row-idx r.npy --top-k 8 "
            "--drop-pad-mode 1 --numerics ascend_950 --out grad_x.npy"};
  }

  void declare(ArgParser& p) override {
    p.add_string("--grad-expanded-x", "FILE",
                 "grad_expanded_x .npy: [N*top_k, H] dropless, [active_num, H] active, [E, C, H] "
                 "drop-pad",
                 &grad_path_)
        .required();
    p.add_string("--expanded-row-idx", "FILE",
                 "expanded_row_idx .npy, int32 [N*top_k], as the forward returned it", &index_path_)
        .required();
    p.add_int("--top-k", "K", "top_k: experts per token in the forward (> 0)", &top_k_).required();
    p.add_int("--drop-pad-mode", "0|1",
              "drop_pad_mode of the forward: 0 dropless/active, 1 drop-pad", &drop_pad_mode_);
    p.add_int("--active-num", "A",
              "active_num of the forward (drop_pad_mode 0): 0 = dropless, > 0 = active scenario",
              &active_num_);
    add_numerics_flag(p, "selects the accumulation order (tree, sequential)", &numerics_);
    p.add_choice("--order",
                 "float32 accumulation order, overriding --numerics: tree (Atlas A2/A3 kernel) or "
                 "sequential (Ascend 950 kernel)",
                 {"tree", "sequential"}, &order_)
        .default_text("by --numerics");
    p.add_choice("--backend", kBackendHelp, {"automatic", "reference", "cpu"}, &backend_);
    p.add_int("--threads", "T", kThreadsHelp, &threads_, 0, kMaxNumThreads);
    p.add_string("--out", "FILE", "where to write grad_x .npy [N, H] (replaced atomically)",
                 &out_path_)
        .required();
    p.add_choice("--device",
                 "where it runs: cpu, or cuda (the GPU, same bits; needs a build with "
                 "MOE_ROUTING_CUDA and --backend automatic)",
                 {"cpu", "cuda"}, &device_);
  }

  int run(const ArgParser& parser) override {
    npy::Array grad, index;
    Status s = npy::read(grad_path_, &grad, "--grad-expanded-x");
    if (!s.is_ok()) return report_error(s);
    s = npy::read(index_path_, &index, "--expanded-row-idx");
    if (!s.is_ok()) return report_error(s);

    MoeInitRoutingGradAttrs attrs;
    attrs.top_k = top_k_;
    attrs.drop_pad_mode = drop_pad_mode_;
    attrs.active_num = active_num_;
    parse_numerics(numerics_.c_str(), &attrs.numerics);  // the parser admitted only valid names
    if (parser.given("--order")) parse_accumulation_order(order_.c_str(), &attrs.order);
    const ExecConfig config = exec_config(backend_, threads_);

    MoeInitRoutingGradPlan plan;
    s = infer_moe_init_routing_grad(grad.view(), index.view(), attrs, &plan);
    if (!s.is_ok()) return report_error(s);
    npy::Array grad_x;
    s = npy::allocate(plan.dtype, {plan.grad_x_shape[0], plan.grad_x_shape[1]}, info().name,
                      "grad_x", &grad_x);
    if (!s.is_ok()) return report_error(s);
    if (device_ == "cuda")
      s = run_on_cuda(grad, index, attrs, config, &grad_x);
    else
      s = moe_init_routing_grad(grad.view(), index.view(), attrs, grad_x.view(), config);
    if (!s.is_ok()) return report_error(s);
    s = npy::write(out_path_, grad_x, "--out");
    if (!s.is_ok()) return report_error(s);
    std::cout << "wrote " << out_path_ << ": grad_x " << dtype_name(plan.dtype) << " ["
              << plan.grad_x_shape[0] << ", " << plan.grad_x_shape[1] << "] ("
              << grad_scenario_name(plan.scenario) << ", order "
              << accumulation_order_name(plan.order) << ")\n";
    return kExitOk;
  }

 private:
  /// --device cuda: the inputs copied to the GPU, the operator run there, grad_x copied back.
  static Status run_on_cuda(const npy::Array& grad, const npy::Array& index,
                            const MoeInitRoutingGradAttrs& attrs, const ExecConfig& config,
                            npy::Array* grad_x) {
#if defined(MOE_ROUTING_HAVE_CUDA)
    std::string why;
    if (!cuda::device_available(&why))
      return runtime_error("moe-routing: golden grad: --device cuda needs a CUDA GPU, got none (",
                           why, ")");
    cuda::DeviceBuffer grad_device, index_device, out_device;
    MOE_ROUTING_RETURN_IF_ERROR(grad_device.upload(grad.bytes.data(), grad.bytes.size()));
    MOE_ROUTING_RETURN_IF_ERROR(index_device.upload(index.bytes.data(), index.bytes.size()));
    MOE_ROUTING_RETURN_IF_ERROR(out_device.allocate(grad_x->bytes.size()));
    auto on_device = [](TensorView view, const cuda::DeviceBuffer& buffer) {
      view.data = buffer.data();
      view.device = Device::cuda;
      return view;
    };
    MOE_ROUTING_RETURN_IF_ERROR(moe_init_routing_grad(
        on_device(grad.view(), grad_device), on_device(index.view(), index_device), attrs,
        on_device(grad_x->view(), out_device), config));
    return out_device.download(grad_x->bytes.data(), grad_x->bytes.size());
#else
    static_cast<void>(grad), static_cast<void>(index), static_cast<void>(attrs),
        static_cast<void>(config), static_cast<void>(grad_x);
    return not_supported(
        "moe-routing: golden grad: --device cuda needs a build with CUDA (cmake "
        "-DMOE_ROUTING_CUDA=ON), got a build without it");
#endif
  }

  std::string grad_path_, index_path_, out_path_;
  int64_t top_k_ = 0, drop_pad_mode_ = 0, active_num_ = 0, threads_ = 0;
  std::string numerics_ = "atlas_a2", order_ = "tree", backend_ = "automatic", device_ = "cpu";
};

}  // namespace

std::unique_ptr<Command> make_golden_grad_command() {
  return std::make_unique<GoldenGradCommand>();
}

}  // namespace moe_routing::cli
