// Runs the seed's example through the installed library: expanded_row_idx = 4 1 5 3 0 2, K = 2.
#include <cstdio>
#include <vector>

#include <moe_routing/moe_routing.hpp>

int main() {
  std::vector<float> grad_expanded_x{1, 10, 100, 1000, 10000, 100000};
  std::vector<int32_t> expanded_row_idx{4, 1, 5, 3, 0, 2};
  std::vector<float> grad_x(3, -1.0f);
  moe_routing::MoeInitRoutingGradAttrs attrs;
  attrs.top_k = 2;
  moe_routing::Status status = moe_routing::moe_init_routing_grad(
      moe_routing::TensorView(grad_expanded_x.data(), moe_routing::DType::float32, {6, 1}),
      moe_routing::TensorView(expanded_row_idx.data(), moe_routing::DType::int32, {6}), attrs,
      moe_routing::TensorView(grad_x.data(), moe_routing::DType::float32, {3, 1}));
  if (!status.is_ok()) {
    std::fprintf(stderr, "%s\n", status.message().c_str());
    return 1;
  }
  const bool ok = grad_x[0] == 10010.0f && grad_x[1] == 101000.0f && grad_x[2] == 101.0f;
  std::printf("grad_x = [%g, %g, %g] %s\n", grad_x[0], grad_x[1], grad_x[2], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
