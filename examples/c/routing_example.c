/*
 * The forward MoE routing (aclnnMoeInitRoutingV2's semantics) through the C ABI, in the order a
 * CANN aclnn program takes: describe the tensors, size the outputs, ask for the workspace size,
 * allocate the workspace, run, read the results, release everything. Unlike the backward, the
 * forward needs a workspace (its sort's scratch): phase two then allocates nothing.
 *
 * The input is the worked example F1 of docs/spec/moe_init_routing.md §2.6 (dropless,
 * active_num = 3, cumsum counts, float32). The program checks every output exactly and exits
 * with 1 on any mismatch or error.
 *
 * Build: cc -std=c99 routing_example.c -lmoe_routing -lstdc++ -lpthread (or through CMake:
 * target_link_libraries(app PRIVATE moe_routing::moe_routing)).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_routing/moe_routing.h"

#define CHECK_STATUS(call)                                                     \
  do {                                                                         \
    mrStatus status_ = (call);                                                 \
    if (status_ != MR_SUCCESS) {                                               \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, mrGetStatusName(status_), \
              mrGetLastErrorMessage());                                        \
      goto cleanup;                                                            \
    }                                                                          \
  } while (0)

enum { kTokens = 3, kTopK = 2, kHidden = 2, kExperts = 3, kActive = 3 };

int main(void) {
  /* F1 (docs/spec/moe_init_routing.md §2.6). */
  const float x_host[kTokens * kHidden] = {1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f};
  const int32_t expert_idx_host[kTokens * kTopK] = {1, 0, 2, 1, 0, 2};
  const float expected_x[kActive * kHidden] = {1.0f, 1.5f, 3.0f, 3.5f, 1.0f, 1.5f};
  const int32_t expected_row_idx[kTokens * kTopK] = {2, 0, 4, 3, 1, 5};
  const int32_t expected_cumsum[kExperts] = {2, 4, 6};
  const int64_t x_shape[2] = {kTokens, kHidden};
  const int64_t expert_idx_shape[2] = {kTokens, kTopK};
  float expanded_x_host[kActive * kHidden];
  int32_t expanded_row_idx_host[kTokens * kTopK];
  int32_t cumsum_host[kExperts];
  mrTensor* x = NULL;
  mrTensor* expert_idx = NULL;
  mrTensor* expanded_x = NULL;
  mrTensor* expanded_row_idx = NULL;
  mrTensor* cumsum = NULL;
  mrExecutor* executor = NULL;
  mrTensorDesc desc[4];
  void* workspace = NULL;
  uint64_t workspace_size = 0;
  int result = 1;

  memset(expanded_x_host, 0x7f, sizeof expanded_x_host); /* poison: an unwritten value shows */
  memset(expanded_row_idx_host, 0x7f, sizeof expanded_row_idx_host);
  memset(cumsum_host, 0x7f, sizeof cumsum_host);

  /* 1. Describe the inputs. */
  CHECK_STATUS(mrCreateTensor(x_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, (void*)x_host, &x));
  CHECK_STATUS(mrCreateTensor(expert_idx_shape, 2, MR_INT32, MR_DEVICE_CPU, (void*)expert_idx_host,
                              &expert_idx));

  /* 2. The outputs' shapes: expanded_x [active_num, H], expanded_row_idx [N*K], the cumsum [E];
   *    the pre-capacity counts are not produced in dropless mode (desc[3].produced == false). */
  CHECK_STATUS(mrMoeInitRoutingV2InferShape(
      x, expert_idx, kActive, /*expertCapacity=*/0, kExperts, /*dropPadMode=*/0, /*cumsum=*/1,
      /*beforeCapacityFlag=*/false, &desc[0], &desc[1], &desc[2], &desc[3]));
  if (desc[0].shape[0] != kActive || desc[2].shape[0] != kExperts || desc[3].produced) {
    fprintf(stderr, "unexpected output shapes\n");
    goto cleanup;
  }
  CHECK_STATUS(mrCreateTensor(desc[0].shape, desc[0].ndim, desc[0].dtype, MR_DEVICE_CPU,
                              expanded_x_host, &expanded_x));
  CHECK_STATUS(mrCreateTensor(desc[1].shape, desc[1].ndim, desc[1].dtype, MR_DEVICE_CPU,
                              expanded_row_idx_host, &expanded_row_idx));
  CHECK_STATUS(mrCreateTensor(desc[2].shape, desc[2].ndim, desc[2].dtype, MR_DEVICE_CPU,
                              cumsum_host, &cumsum));

  /* 3. Phase one: validate and plan (no data read); the output not produced is passed as NULL. */
  CHECK_STATUS(mrMoeInitRoutingV2GetWorkspaceSize(x, expert_idx, kActive, 0, kExperts, 0, 1, false,
                                                  expanded_x, expanded_row_idx, cumsum, NULL,
                                                  &workspace_size, &executor));

  /* 4. The workspace phase one asked for: the sort's scratch. It depends on the shapes only, so
   *    a training loop allocates it once and reuses it for every step of the same shape. */
  workspace = malloc((size_t)workspace_size);
  if (workspace == NULL) {
    fprintf(stderr, "cannot allocate %llu bytes of workspace\n",
            (unsigned long long)workspace_size);
    goto cleanup;
  }

  /* 5. Phase two: checks the expert ids, computes; consumes the executor whatever it returns. */
  {
    mrExecutor* consumed = executor;
    executor = NULL;
    CHECK_STATUS(mrMoeInitRoutingV2(workspace, workspace_size, consumed, /*stream=*/NULL));
  }

  /* 6. Compare bit for bit with the spec. */
  if (memcmp(expanded_x_host, expected_x, sizeof expected_x) != 0 ||
      memcmp(expanded_row_idx_host, expected_row_idx, sizeof expected_row_idx) != 0 ||
      memcmp(cumsum_host, expected_cumsum, sizeof expected_cumsum) != 0) {
    fprintf(stderr, "the outputs differ from spec F1\n");
    goto cleanup;
  }
  printf("workspace %llu bytes; expanded_row_idx = [%d %d %d %d %d %d]; cumsum = [%d %d %d]\n",
         (unsigned long long)workspace_size, expanded_row_idx_host[0], expanded_row_idx_host[1],
         expanded_row_idx_host[2], expanded_row_idx_host[3], expanded_row_idx_host[4],
         expanded_row_idx_host[5], cumsum_host[0], cumsum_host[1], cumsum_host[2]);
  printf("F1 matches the spec\n");
  result = 0;

cleanup:
  /* 7. Release: an executor that never ran, the handles, the workspace. */
  mrDestroyExecutor(executor);
  mrDestroyTensor(x);
  mrDestroyTensor(expert_idx);
  mrDestroyTensor(expanded_x);
  mrDestroyTensor(expanded_row_idx);
  mrDestroyTensor(cumsum);
  free(workspace);
  return result;
}
