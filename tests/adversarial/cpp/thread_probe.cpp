// A process for the thread tests of test_threads.cpp to start under a limit or an environment of
// their choosing (a fresh process: the thread pool and the default thread count are per process).
// Uses the C ABI only. Prints one line:
//   moe_routing_thread_probe default        "<mrGetNumThreads()>"
//   moe_routing_thread_probe call <threads>  "<status> <message>" of mrSetNumThreads(<threads>) and
//                                           phase one of a moe_init_routing_v2 call large enough
//                                           for that many threads ("0 ok" on success)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe_routing/moe_routing.h"

namespace {

int call(int threads) {
  mrStatus status = mrSetNumThreads(threads);
  if (status == MR_SUCCESS) {
    // 8192 tokens of 512 float32: 16 MiB of rows, enough work for 8 threads.
    const int64_t rows = 8192, hidden = 512;
    std::vector<float> x(size_t(rows * hidden), 1.0f), expanded_x(x.size());
    std::vector<int32_t> ids(static_cast<size_t>(rows), 0), row_idx(static_cast<size_t>(rows));
    const int64_t x_shape[] = {rows, hidden}, idx_shape[] = {rows, 1}, row_shape[] = {rows};
    mrTensor *x_t, *idx_t, *out_t, *row_t;
    mrCreateTensor(x_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, x.data(), &x_t);
    mrCreateTensor(idx_shape, 2, MR_INT32, MR_DEVICE_CPU, ids.data(), &idx_t);
    mrCreateTensor(x_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, expanded_x.data(), &out_t);
    mrCreateTensor(row_shape, 1, MR_INT32, MR_DEVICE_CPU, row_idx.data(), &row_t);
    uint64_t workspace_size = 0;
    mrExecutor* executor = nullptr;
    status = mrMoeInitRoutingV2GetWorkspaceSize(x_t, idx_t, 0, 0, 0, 0, 0, false, out_t, row_t,
                                                nullptr, nullptr, &workspace_size, &executor);
    mrDestroyExecutor(executor);
    for (mrTensor* t : {x_t, idx_t, out_t, row_t}) mrDestroyTensor(t);
  }
  std::printf("%d %s\n", status, status == MR_SUCCESS ? "ok" : mrGetLastErrorMessage());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "default") == 0) {
    std::printf("%d\n", mrGetNumThreads());
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "call") == 0) return call(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: moe_routing_thread_probe default | call <threads>\n");
  return 2;
}
