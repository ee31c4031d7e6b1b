// `moe-routing golden init-routing-v2` and `moe-routing golden init-routing`: the forward
// operators (moe_init_routing_v2, moe_init_routing) on .npy files, for golden data and scripts.
//
// Both compute every output in memory first and only then write the whole set into --out-dir
// (npy::write_all), so an error leaves nothing behind.
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "golden_io.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cli {
namespace {

const char* const kFileConventions =
    R"(Files are NumPy .npy arrays: float32 '<f4', float16 '<f2', bfloat16 as its uint16 bit
patterns '<u2', int8 '|i1', int32 '<i4', int64 '<i8'. expert_idx is int32 [N, K].)";

// ------------------------------------------------------------------------------------------
// golden init-routing-v2
// ------------------------------------------------------------------------------------------

class GoldenInitRoutingV2Command : public Command {
 public:
  CommandInfo info() const override {
    return {
        "golden init-routing-v2",
        "compute moe_init_routing_v2 (aclnnMoeInitRoutingV2) from .npy files",
        std::string(R"(Reads x [N, H] (float32, float16 or bfloat16) and expert_idx [N, K] (int32),
sorts the N*K (token, expert) pairs stably by expert id (ties keep ascending flat position
p = i*K + t) and copies the rows of x into expanded_x, exactly as CANN's aclnnMoeInitRoutingV2.
Expert ids must be >= 0, and < expert_num wherever expert_num is used (counts, drop-pad).

drop_pad_mode 0 (dropless): expanded_x [A', H] holds x[sorted_p / K] for the first
A' = min(active_num, N*K) sorted pairs (A' = N*K when active_num is 0); expanded_row_idx [N*K]
int32 maps each flat position p to its row (a permutation; values >= A' mark pairs cut by
active_num).

drop_pad_mode 1 (drop-pad): expanded_x [E, C, H], the c-th pair (in flat order) routed to expert
e fills slot e*C + c when c < C; unfilled slots are zero; expanded_row_idx holds the slot, or -1
for a pair dropped for capacity.

Files written into --out-dir: expanded_x.npy (dtype of x) and expanded_row_idx.npy (int32),
always; expert_tokens_count_or_cumsum.npy (int32 [E]) only with drop_pad_mode 0 and
--expert-tokens-count-or-cumsum-flag 1 (cumsum) or 2 (count); expert_tokens_before_capacity.npy
(int32 [E], per-expert counts before capacity) only with drop_pad_mode 1 and
--expert-tokens-before-capacity-flag 1. A flag that does not apply to the mode is ignored, as in
CANN.

)") + kFileConventions +
            "\n\n" + kAllOrNothing,
        "moe-routing golden init-routing-v2 --x x.npy --expert-idx idx.npy --expert-num 8 "
        "--expert-tokens-count-or-cumsum-flag 2 --out-dir out\n"
        "moe-routing golden init-routing-v2 --x x.npy --expert-idx idx.npy --active-num 96 "
        "--out-dir out\n"
        "moe-routing golden init-routing-v2 --x x.npy --expert-idx idx.npy --drop-pad-mode 1 "
        "--expert-num 8 --expert-capacity 16 --expert-tokens-before-capacity-flag 1 "
        "--out-dir out"};
  }

  void declare(ArgParser& p) override {
    p.add_string("--x", "FILE", "x .npy, [N, H] float32 / float16 / bfloat16 ('<u2')", &x_path_)
        .required();
    p.add_string("--expert-idx", "FILE", "expert_idx .npy, [N, K] int32", &expert_idx_path_)
        .required();
    p.add_int("--active-num", "A",
              "active_num (>= 0), drop_pad_mode 0: 0 keeps every pair, A > 0 keeps the first "
              "min(A, N*K) sorted rows",
              &attrs_.active_num);
    p.add_int("--expert-capacity", "C",
              "expert_capacity: slots per expert in drop_pad_mode 1 (1 <= C <= N)",
              &attrs_.expert_capacity);
    p.add_int("--expert-num", "E",
              "expert_num: required (>= 1) by drop_pad_mode 1 and by the count outputs",
              &attrs_.expert_num);
    p.add_int("--drop-pad-mode", "0|1", "drop_pad_mode: 0 dropless, 1 drop-pad",
              &attrs_.drop_pad_mode);
    p.add_int("--expert-tokens-count-or-cumsum-flag", "0|1|2",
              "expert_tokens_count_or_cumsum_flag (drop_pad_mode 0): 0 none, 1 cumsum, 2 count",
              &attrs_.expert_tokens_count_or_cumsum_flag);
    p.add_int("--expert-tokens-before-capacity-flag", "0|1",
              "expert_tokens_before_capacity_flag (drop_pad_mode 1): 1 writes the per-expert "
              "counts before capacity",
              &before_capacity_flag_, 0, 1);
    add_numerics_flag(p,
                      "no effect here (moe_init_routing_v2 has no quantisation); accepted as by "
                      "every golden command",
                      &numerics_);
    p.add_choice("--backend", kBackendHelp, {"automatic", "reference", "cpu"}, &backend_);
    p.add_int("--threads", "T", kThreadsHelp, &threads_, 0, kMaxNumThreads);
    p.add_string("--out-dir", "DIR",
                 "directory for the output files (created if missing; see above for which)",
                 &out_dir_)
        .required();
  }

  int run(const ArgParser&) override {
    const std::string command = info().name;
    Input x, expert_idx;
    Status s = x.read("--x", x_path_);
    if (!s.is_ok()) return report_error(s);
    s = expert_idx.read("--expert-idx", expert_idx_path_);
    if (!s.is_ok()) return report_error(s);
    attrs_.expert_tokens_before_capacity_flag = before_capacity_flag_ != 0;

    MoeInitRoutingV2Plan plan;
    s = infer_moe_init_routing_v2(x.view(), expert_idx.view(), attrs_, &plan);
    if (!s.is_ok()) return report_error(s);
    std::vector<Output> outputs;
    outputs.reserve(4);  // stable addresses: the views point into the outputs
    outputs.emplace_back("expanded_x", plan.expanded_x);
    outputs.emplace_back("expanded_row_idx", plan.expanded_row_idx);
    outputs.emplace_back("expert_tokens_count_or_cumsum", plan.expert_tokens_count_or_cumsum);
    outputs.emplace_back("expert_tokens_before_capacity", plan.expert_tokens_before_capacity);
    s = allocate_outputs(command, moe_init_routing_v2_workspace_size(plan, int(threads_)),
                         &outputs);
    if (!s.is_ok()) return report_error(s);
    s = moe_init_routing_v2(x.view(), expert_idx.view(), attrs_, outputs[0].view(),
                            outputs[1].view(), outputs[2].view(), outputs[3].view(),
                            exec_config(backend_, threads_));
    if (!s.is_ok()) return report_error(s);
    return write_outputs(command, out_dir_, outputs);
  }

 private:
  std::string x_path_, expert_idx_path_, out_dir_;
  MoeInitRoutingV2Attrs attrs_;  // the operator's defaults until a flag is given
  int64_t before_capacity_flag_ = 0, threads_ = 0;
  std::string numerics_ = "atlas_a2", backend_ = "automatic";
};

// ------------------------------------------------------------------------------------------
// golden init-routing
// ------------------------------------------------------------------------------------------

class GoldenInitRoutingCommand : public Command {
 public:
  CommandInfo info() const override {
    return {
        "golden init-routing", "compute moe_init_routing (the torch API, CANN V4) from .npy files",
        std::string(R"(Reads x [N, H] and expert_idx [N, K] (int32) and the optional scale, offset
and topk_weight, and computes the torch API cann_ops_transformer.moe_init_routing (CANN
aclnnMoeInitRoutingV4) with its defaults. Pairs whose expert id lies outside
--active-expert-range [START, END) (default [0, expert_num)), negative ids included, are not
routed; the routed pairs are sorted stably by expert id (ties keep ascending flat position).

expanded_x is [N*K, H] (dropless; rows past the routed pairs, or past active_num, are zero) or
[E, C, H] (drop_pad_mode 1), of x's dtype, or int8 with --quant-mode 0 (static: scale [1] and
optional offset [1]) or 1 (dynamic per row, optional smooth scale [END - START, H] or [1, H]).
--numerics picks the quantisation arithmetic: atlas_a2 (Atlas A2/A3 kernels: static in float32,
dynamic scale max/127) or ascend_950 (Ascend 950 kernels: static in float16, dynamic scale
max * float32(1/127)); they differ in the last bit on some inputs.

expanded_row_idx [N*K] int32: --row-idx-type 0 maps each flat position to its row (-1 for pairs
not routed or dropped); 1 lists the flat position of each row (the pairs not routed follow).

Files written into --out-dir: expanded_x.npy and expanded_row_idx.npy, always;
expert_tokens_count_or_cumsum.npy (int64; [END - START] for --expert-tokens-num-type 0 cumsum or
1 count, [E, 2] for 2 key_value) only with --expert-tokens-num-flag 1; expanded_scale.npy
(float32 [N*K], or [E*C] in drop-pad) only with --quant-mode 1 (the dynamic scales) or
--quant-mode -1 with --scale [N] (the per-token scale gathered); expanded_topk_weight.npy
(float32 [N*K, 1] or [E*C, 1]) only with --topk-weight.

)") + kFileConventions +
            "\n\n" + kAllOrNothing,
        "moe-routing golden init-routing --x x.npy --expert-idx idx.npy --expert-num 8 "
        "--expert-tokens-num-flag 1 --out-dir out\n"
        "moe-routing golden init-routing --x x.npy --expert-idx idx.npy --expert-num 8 "
        "--active-expert-range 2,6 --row-idx-type 1 --topk-weight w.npy --out-dir out\n"
        "moe-routing golden init-routing --x x.npy --expert-idx idx.npy --expert-num 8 "
        "--quant-mode 0 --scale s.npy --offset o.npy --numerics ascend_950 --out-dir out"};
  }

  void declare(ArgParser& p) override {
    p.add_string("--x", "FILE",
                 "x .npy, [N, H] float32 / float16 / bfloat16 ('<u2'), or int8 with quant_mode -1",
                 &x_path_)
        .required();
    p.add_string("--expert-idx", "FILE",
                 "expert_idx .npy, [N, K] int32; ids outside the active expert range (e.g. -1) are "
                 "not routed",
                 &expert_idx_path_)
        .required();
    p.add_string("--scale", "FILE",
                 "scale .npy, float32: quant_mode -1 [N] (per token, optional), 0 [1] (needed), "
                 "1 [END - START, H] or [1, H] (smooth, optional)",
                 &scale_path_)
        .default_text("none");
    p.add_string("--offset", "FILE", "offset .npy, float32 [1], quant_mode 0 only", &offset_path_)
        .default_text("none");
    p.add_string("--topk-weight", "FILE", "topk_weight .npy, float32 [N, K]", &topk_weight_path_)
        .default_text("none");
    p.add_int("--active-num", "A",
              "active_num, dropless: -1 or 0 keep every routed pair, A > 0 keeps the first "
              "min(A, routed pairs) rows",
              &attrs_.active_num);
    p.add_int("--expert-capacity", "C",
              "expert_capacity: slots per expert in drop_pad_mode 1 (1 <= C <= N)",
              &attrs_.expert_capacity);
    p.add_int("--expert-num", "E", "expert_num (>= 1; the torch default -1 is rejected)",
              &attrs_.expert_num);
    p.add_int("--drop-pad-mode", "0|1",
              "drop_pad_mode: 0 dropless, 1 drop-pad (quant_mode -1, row_idx_type 0, full range)",
              &attrs_.drop_pad_mode);
    p.add_int("--expert-tokens-num-type", "0|1|2",
              "expert_tokens_num_type: 0 cumsum, 1 count, 2 key_value",
              &attrs_.expert_tokens_num_type);
    p.add_int("--expert-tokens-num-flag", "0|1",
              "expert_tokens_num_flag: 1 writes expert_tokens_count_or_cumsum", &num_flag_, 0, 1);
    p.add_int("--quant-mode", "-1|0|1", "quant_mode: -1 none, 0 static int8, 1 dynamic int8",
              &attrs_.quant_mode);
    p.add_int_list(
         "--active-expert-range", "START,END",
         "active_expert_range: route only expert ids in [START, END), 0 <= START < END <= "
         "expert_num",
         2, &active_expert_range_)
        .default_text("0,expert_num");
    p.add_int("--row-idx-type", "0|1",
              "row_idx_type: 0 gather (indexed by flat position), 1 scatter (indexed by row)",
              &attrs_.row_idx_type);
    add_numerics_flag(p, "selects the int8 quantisation of --quant-mode 0 and 1", &numerics_);
    p.add_choice("--backend", kBackendHelp, {"automatic", "reference", "cpu"}, &backend_);
    p.add_int("--threads", "T", kThreadsHelp, &threads_, 0, kMaxNumThreads);
    p.add_string("--out-dir", "DIR",
                 "directory for the output files (created if missing; see above for which)",
                 &out_dir_)
        .required();
  }

  int run(const ArgParser& parser) override {
    const std::string command = info().name;
    Input x, expert_idx, scale, offset, topk_weight;
    const std::tuple<Input*, const char*, const std::string*> inputs[] = {
        {&x, "--x", &x_path_},
        {&expert_idx, "--expert-idx", &expert_idx_path_},
        {&scale, "--scale", &scale_path_},
        {&offset, "--offset", &offset_path_},
        {&topk_weight, "--topk-weight", &topk_weight_path_}};
    for (const auto& [input, flag, path] : inputs) {
      if (path->empty()) continue;  // an optional input that was not given
      const Status s = input->read(flag, *path);
      if (!s.is_ok()) return report_error(s);
    }
    attrs_.expert_tokens_num_flag = num_flag_ != 0;
    attrs_.has_active_expert_range = parser.given("--active-expert-range");
    if (attrs_.has_active_expert_range)
      attrs_.active_expert_range = {active_expert_range_[0], active_expert_range_[1]};
    parse_numerics(numerics_.c_str(), &attrs_.numerics);  // the parser admitted only these

    MoeInitRoutingPlan plan;
    Status s = infer_moe_init_routing(x.view(), expert_idx.view(), scale.view(), offset.view(),
                                      topk_weight.view(), attrs_, &plan);
    if (!s.is_ok()) return report_error(s);
    std::vector<Output> outputs;
    outputs.reserve(5);  // stable addresses: the views point into the outputs
    outputs.emplace_back("expanded_x", plan.expanded_x);
    outputs.emplace_back("expanded_row_idx", plan.expanded_row_idx);
    outputs.emplace_back("expert_tokens_count_or_cumsum", plan.expert_tokens_count_or_cumsum);
    outputs.emplace_back("expanded_scale", plan.expanded_scale);
    outputs.emplace_back("expanded_topk_weight", plan.expanded_topk_weight);
    s = allocate_outputs(command, moe_init_routing_workspace_size(plan, int(threads_)), &outputs);
    if (!s.is_ok()) return report_error(s);
    s = moe_init_routing(x.view(), expert_idx.view(), scale.view(), offset.view(),
                         topk_weight.view(), attrs_, outputs[0].view(), outputs[1].view(),
                         outputs[2].view(), outputs[3].view(), outputs[4].view(),
                         exec_config(backend_, threads_));
    if (!s.is_ok()) return report_error(s);
    return write_outputs(command, out_dir_, outputs);
  }

 private:
  std::string x_path_, expert_idx_path_, scale_path_, offset_path_, topk_weight_path_, out_dir_;
  MoeInitRoutingAttrs attrs_;  // the torch API's defaults until a flag is given
  int64_t num_flag_ = 0, threads_ = 0;
  std::vector<int64_t> active_expert_range_;
  std::string numerics_ = "atlas_a2", backend_ = "automatic";
};

}  // namespace

std::unique_ptr<Command> make_golden_init_routing_v2_command() {
  return std::make_unique<GoldenInitRoutingV2Command>();
}

std::unique_ptr<Command> make_golden_init_routing_command() {
  return std::make_unique<GoldenInitRoutingCommand>();
}

}  // namespace moe_routing::cli
