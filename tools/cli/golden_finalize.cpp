// `moe-routing golden finalize-routing` and `moe-routing golden finalize-routing-grad`: the
// combine (moe_finalize_routing) and its backward on .npy files, for golden data and scripts.
//
// Both compute every output in memory first and only then write: finalize-routing its one --out
// (npy::write), finalize-routing-grad the whole set into --out-dir (write_outputs), so an error
// leaves nothing behind (docs/reliability.md).
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "golden_io.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cli {
namespace {

const char* const kCombineFiles =
    R"(Files are NumPy .npy arrays: float32 '<f4', float16 '<f2', bfloat16 as its uint16 bit
patterns '<u2' (written the same way), int32 '<i4' for the indices. Every floating input has the
dtype of the first input, except --scales, which may also be float32 with bfloat16 data (the
mixed-precision case). An input that is not given is absent.)";

/// An optional or required .npy input of a command: its flag and where its path is kept.
struct InputFlag {
  const char* flag;
  const std::string* path;
  Input* input;
};

/// Reads every given input (an empty path is an input not given); the first error wins.
Status read_inputs(const std::vector<InputFlag>& inputs) {
  for (const InputFlag& i : inputs)
    if (!i.path->empty()) MOE_ROUTING_RETURN_IF_ERROR(i.input->read(i.flag, *i.path));
  return Status::ok();
}

// ------------------------------------------------------------------------------------------
// golden finalize-routing
// ------------------------------------------------------------------------------------------

class GoldenFinalizeRoutingCommand : public Command {
 public:
  CommandInfo info() const override {
    return {"golden finalize-routing",
            "compute moe_finalize_routing (aclnnMoeFinalizeRouting V1 / V2) from .npy files",
            std::string(R"(The combine of an MoE layer: for every token i and column j
out[i, j] = x1[i, j] + x2[i, j]
            + sum over t < K of scales[i, t] * (expanded_x[row(i, t), j] + bias[expert_idx[i, t], j])
one IEEE operation at a time, the terms added in increasing t, in the accumulation type of
--numerics (atlas_a2: the Atlas A2/A3 kernels, float16 arithmetic for float16 data, float32
otherwise; ascend_950: float32 for every dtype), rounded once to the dtype of expanded_x and
written to --out [N, H].

--drop-pad-mode: 0 dropless, column layout (row(i, t) = expanded_row_idx[t*N + i]); 1 drop-pad,
column; 2 dropless, row layout (expanded_row_idx[i*K + t]); 3 drop-pad, row. expanded_x is [R, H]
(R <= N*K) in modes 0 and 2, [E, C, H] in 1 and 3. An index -1 skips its pair, and so does an
index in [R, N*K) in dropless modes (rows the dispatch cut by active_num); any other index
outside the rows of expanded_x is an error. K = scales.size(1), or --top-k without --scales;
N = len(expanded_row_idx) / K. x2 needs x1, bias needs expert_idx ([N, K], row-major in every
mode).

--api v1 follows aclnnMoeFinalizeRouting: the column layout of mode 0, and x1, bias, scales and
expert_idx required; under atlas_a2 bfloat16 is rounded with ties away from zero, as CANN's V1
kernel does. --api v2 (default) follows aclnnMoeFinalizeRoutingV2.

)") + kCombineFiles +
                R"(

--out is written only when the whole result is computed; on any error (a bad flag, an unreadable
file, an input the operator rejects, a failed write) the message goes to stderr, the exit status
is 2 and nothing is written. --out may name a FIFO or a device (written in place) or a symbolic
link (its target is written); it is never replaced by a regular file.)",
            "moe-routing golden finalize-routing --expanded-x ex.npy --expanded-row-idx r.npy "
            "--x1 x1.npy --scales s.npy --drop-pad-mode 2 --out out.npy\n"
            "moe-routing golden finalize-routing --expanded-x ex.npy --expanded-row-idx r.npy "
            "--x1 x1.npy --bias b.npy --scales s.npy --expert-idx e.npy --api v1 --out out.npy\n"
            "moe-routing golden finalize-routing --expanded-x ex.npy --expanded-row-idx r.npy "
            "--top-k 8 --drop-pad-mode 2 --numerics ascend_950 --out out.npy"};
  }

  void declare(ArgParser& p) override {
    p.add_string("--expanded-x", "FILE",
                 "expanded_x .npy: [R, H] (modes 0, 2) or [E, C, H] (1, 3), float32 / float16 / "
                 "bfloat16 ('<u2')",
                 &expanded_x_path_)
        .required();
    p.add_string("--expanded-row-idx", "FILE", "expanded_row_idx .npy, int32 [N*K]",
                 &expanded_row_idx_path_)
        .required();
    p.add_string("--x1", "FILE", "x1 .npy, [N, H] (required by --api v1)", &x1_path_)
        .default_text("none");
    p.add_string("--x2", "FILE", "x2 .npy, [N, H]; needs --x1", &x2_path_).default_text("none");
    p.add_string("--bias", "FILE", "bias .npy, [E, H]; needs --expert-idx (required by --api v1)",
                 &bias_path_)
        .default_text("none");
    p.add_string("--scales", "FILE",
                 "scales .npy, [N, K], the dtype of expanded_x or float32 (required by --api v1)",
                 &scales_path_)
        .default_text("none");
    p.add_string("--expert-idx", "FILE",
                 "expert_idx .npy, int32 [N, K]: the bias row of each pair (required by --api v1)",
                 &expert_idx_path_)
        .default_text("none");
    p.add_int("--drop-pad-mode", "0..3",
              "drop_pad_mode: 0 dropless column, 1 drop-pad column, 2 dropless row, 3 drop-pad "
              "row",
              &attrs_.drop_pad_mode);
    p.add_int("--top-k", "K", "K without --scales (CANN V4's k); with --scales 1 or scales.size(1)",
              &attrs_.top_k);
    p.add_choice("--api", "v1 (aclnnMoeFinalizeRouting) or v2 (aclnnMoeFinalizeRoutingV2)",
                 {"v1", "v2"}, &api_);
    add_numerics_flag(
        p, "selects the accumulation type (and, with --api v1, the bfloat16 rounding)", &numerics_);
    p.add_choice("--backend", kBackendHelp, {"automatic", "reference", "cpu"}, &backend_);
    p.add_int("--threads", "T", kThreadsHelp, &threads_, 0, kMaxNumThreads);
    p.add_string("--out", "FILE", "where to write out .npy [N, H] (replaced atomically)",
                 &out_path_)
        .required();
  }

  int run(const ArgParser&) override {
    Input expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx;
    Status s = read_inputs({{"--expanded-x", &expanded_x_path_, &expanded_x},
                            {"--expanded-row-idx", &expanded_row_idx_path_, &expanded_row_idx},
                            {"--x1", &x1_path_, &x1},
                            {"--x2", &x2_path_, &x2},
                            {"--bias", &bias_path_, &bias},
                            {"--scales", &scales_path_, &scales},
                            {"--expert-idx", &expert_idx_path_, &expert_idx}});
    if (!s.is_ok()) return report_error(s);
    parse_finalize_routing_api(api_.c_str(), &attrs_.api);  // the parser admitted v1 / v2 only
    parse_numerics(numerics_.c_str(), &attrs_.numerics);    // and valid numerics names only
    MoeFinalizeRoutingInputs in;
    in.expanded_x = expanded_x.view();
    in.expanded_row_idx = expanded_row_idx.view();
    in.x1 = x1.view();
    in.x2 = x2.view();
    in.bias = bias.view();
    in.scales = scales.view();
    in.expert_idx = expert_idx.view();

    MoeFinalizeRoutingPlan plan;
    s = infer_moe_finalize_routing(in, attrs_, &plan);
    if (!s.is_ok()) return report_error(s);
    std::vector<Output> outputs;
    outputs.emplace_back("out", plan.out);
    s = allocate_outputs(info().name, 0, &outputs);  // the forward needs no scratch
    if (!s.is_ok()) return report_error(s);
    s = moe_finalize_routing(in, attrs_, outputs[0].view(), exec_config(backend_, threads_));
    if (!s.is_ok()) return report_error(s);
    s = npy::write(out_path_, outputs[0].array, "--out");
    if (!s.is_ok()) return report_error(s);
    std::cout << "wrote " << out_path_ << ": out " << dtype_name(plan.dtype) << ' '
              << shape_string(plan.out) << " (api " << api_ << ", drop_pad_mode "
              << plan.drop_pad_mode << ", K " << plan.top_k << ", numerics "
              << numerics_name(plan.numerics) << ")\n";
    return kExitOk;
  }

 private:
  std::string expanded_x_path_, expanded_row_idx_path_, x1_path_, x2_path_, bias_path_,
      scales_path_, expert_idx_path_, out_path_;
  MoeFinalizeRoutingAttrs attrs_;  // the operator's defaults until a flag is given
  int64_t threads_ = 0;
  std::string api_ = "v2", numerics_ = "atlas_a2", backend_ = "automatic";
};

// ------------------------------------------------------------------------------------------
// golden finalize-routing-grad
// ------------------------------------------------------------------------------------------

class GoldenFinalizeRoutingGradCommand : public Command {
 public:
  CommandInfo info() const override {
    return {
        "golden finalize-routing-grad",
        "compute moe_finalize_routing_grad (aclnnMoeFinalizeRoutingV2Grad) from .npy files",
        std::string(
            R"(The backward of the combine in the row layout (the forward's drop_pad_mode 2 and 3 are
this one's 0 and 1). For every pair p = i*K + t that is not dropped (-1, or an index in
[active_num, N*K)), with row r = expanded_row_idx[p] and expert e = expert_idx[p]:
grad_expanded_x[r] = grad_y[i] * scales[p] (one float32 product, one rounding; grad_y[i] without
--scales); rows no pair names are zero;
grad_scales[p] = sum over j of (expanded_x[r, j] + bias[e, j]) * grad_y[i, j], each product
rounded to float32, summed in the order of --numerics (atlas_a2: the Atlas A2/A3 kernel's 512-lane
trees; ascend_950: the Ascend 950 kernel's fold), one rounding to the dtype of scales; 0 for a
dropped pair;
grad_bias[e] = sum over e's pairs in increasing p of scales[p] * grad_y[i], float32, one
rounding (moe_routing's own output: CANN computes none).

--drop-pad-mode 0: grad_expanded_x is [N*K, H], or [active_num, H] when 0 < active_num < N*K;
1: [expert_num, expert_capacity, H]. K = scales.size(1), else len(expanded_row_idx) / N.

Files written into --out-dir: grad_expanded_x.npy (dtype of grad_y), always; grad_scales.npy
(dtype of scales, [N, K]) with --scales and --expanded-x; grad_bias.npy (dtype of grad_y,
[E, H]) with --bias.

)") + kCombineFiles +
            "\n\n" + kAllOrNothing,
        "moe-routing golden finalize-routing-grad --grad-y gy.npy --expanded-row-idx r.npy "
        "--expanded-x ex.npy --scales s.npy --out-dir out\n"
        "moe-routing golden finalize-routing-grad --grad-y gy.npy --expanded-row-idx r.npy "
        "--expanded-x ex.npy --scales s.npy --expert-idx e.npy --bias b.npy --drop-pad-mode 1 "
        "--expert-num 8 --expert-capacity 16 --numerics ascend_950 --out-dir out"};
  }

  void declare(ArgParser& p) override {
    p.add_string("--grad-y", "FILE", "grad_y .npy, [N, H] float32 / float16 / bfloat16 ('<u2')",
                 &grad_y_path_)
        .required();
    p.add_string("--expanded-row-idx", "FILE", "expanded_row_idx .npy, int32 [N*K], row layout",
                 &expanded_row_idx_path_)
        .required();
    p.add_string("--expanded-x", "FILE",
                 "expanded_x .npy, the forward's (shaped as grad_expanded_x); needed for "
                 "grad_scales",
                 &expanded_x_path_)
        .default_text("none");
    p.add_string("--scales", "FILE", "scales .npy, [N, K], the dtype of grad_y or float32",
                 &scales_path_)
        .default_text("none");
    p.add_string("--expert-idx", "FILE", "expert_idx .npy, int32 [N, K]; needed by --bias",
                 &expert_idx_path_)
        .default_text("none");
    p.add_string("--bias", "FILE", "bias .npy, [E, H]; gives grad_bias", &bias_path_)
        .default_text("none");
    p.add_int("--drop-pad-mode", "0|1", "drop_pad_mode: 0 dropless, 1 drop-pad",
              &attrs_.drop_pad_mode);
    p.add_int("--active-num", "A",
              "active_num (drop_pad_mode 0): 0 < A < N*K gives grad_expanded_x [A, H]",
              &attrs_.active_num);
    p.add_int("--expert-num", "E", "expert_num (drop_pad_mode 1)", &attrs_.expert_num);
    p.add_int("--expert-capacity", "C", "expert_capacity (drop_pad_mode 1)",
              &attrs_.expert_capacity);
    add_numerics_flag(p, "selects grad_scales' summation order", &numerics_);
    p.add_choice("--backend", kBackendHelp, {"automatic", "reference", "cpu"}, &backend_);
    p.add_int("--threads", "T", kThreadsHelp, &threads_, 0, kMaxNumThreads);
    p.add_string("--out-dir", "DIR",
                 "directory for the output files (created if missing; see above for which)",
                 &out_dir_)
        .required();
  }

  int run(const ArgParser&) override {
    const std::string command = info().name;
    Input grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias;
    Status s = read_inputs({{"--grad-y", &grad_y_path_, &grad_y},
                            {"--expanded-row-idx", &expanded_row_idx_path_, &expanded_row_idx},
                            {"--expanded-x", &expanded_x_path_, &expanded_x},
                            {"--scales", &scales_path_, &scales},
                            {"--expert-idx", &expert_idx_path_, &expert_idx},
                            {"--bias", &bias_path_, &bias}});
    if (!s.is_ok()) return report_error(s);
    parse_numerics(numerics_.c_str(), &attrs_.numerics);  // the parser admitted only valid names
    MoeFinalizeRoutingGradInputs in;
    in.grad_y = grad_y.view();
    in.expanded_row_idx = expanded_row_idx.view();
    in.expanded_x = expanded_x.view();
    in.scales = scales.view();
    in.expert_idx = expert_idx.view();
    in.bias = bias.view();

    // Every output the inputs give is written (infer's compute_grad_* say which).
    MoeFinalizeRoutingGradPlan plan;
    s = infer_moe_finalize_routing_grad(in, attrs_, &plan);
    if (!s.is_ok()) return report_error(s);
    std::vector<Output> outputs;
    outputs.reserve(3);  // stable addresses: the views point into the outputs
    outputs.emplace_back("grad_expanded_x", plan.grad_expanded_x);
    outputs.emplace_back("grad_scales", plan.grad_scales);
    outputs.emplace_back("grad_bias", plan.grad_bias);
    s = allocate_outputs(command, moe_finalize_routing_grad_workspace_size(plan, int(threads_)),
                         &outputs);
    if (!s.is_ok()) return report_error(s);
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = outputs[0].view();
    out.grad_scales = outputs[1].view();
    out.grad_bias = outputs[2].view();
    s = moe_finalize_routing_grad(in, attrs_, out, exec_config(backend_, threads_));
    if (!s.is_ok()) return report_error(s);
    return write_outputs(command, out_dir_, outputs);
  }

 private:
  std::string grad_y_path_, expanded_row_idx_path_, expanded_x_path_, scales_path_,
      expert_idx_path_, bias_path_, out_dir_;
  MoeFinalizeRoutingGradAttrs attrs_;  // the operator's defaults until a flag is given
  int64_t threads_ = 0;
  std::string numerics_ = "atlas_a2", backend_ = "automatic";
};

}  // namespace

std::unique_ptr<Command> make_golden_finalize_routing_command() {
  return std::make_unique<GoldenFinalizeRoutingCommand>();
}

std::unique_ptr<Command> make_golden_finalize_routing_grad_command() {
  return std::make_unique<GoldenFinalizeRoutingGradCommand>();
}

}  // namespace moe_routing::cli
