/*
 * The backward of MoE routing (aclnnMoeInitRoutingV2Grad's semantics) through the C ABI, in the
 * order a CANN aclnn program takes: describe the tensors, ask for the workspace size, allocate
 * the workspace, run, read the result back, release everything.
 *
 * The input is the worked example G1 of docs/spec/moe_init_routing.md §1.10 (dropless,
 * top_k = 3, float32), run once with each device's numerics: Atlas A2/A3 sums in the tree
 * order, Ascend 950 in the sequential order, and the two orders give different bits for row 0,
 * column 0. The program checks every element exactly and exits with 1 on any mismatch or error.
 *
 * Build: cc -std=c99 grad_example.c -lmoe_routing -lstdc++ -lpthread (or through CMake:
 * target_link_libraries(app PRIVATE moe_routing::moe_routing)).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_routing/moe_routing.h"

/* Prints the failing call and the library's message, then leaves main's body. */
#define CHECK_STATUS(call)                                                     \
  do {                                                                         \
    mrStatus status_ = (call);                                                 \
    if (status_ != MR_SUCCESS) {                                               \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, mrGetStatusName(status_), \
              mrGetLastErrorMessage());                                        \
      goto cleanup;                                                            \
    }                                                                          \
  } while (0)

enum { kTokens = 2, kTopK = 3, kHidden = 2, kPairs = kTokens * kTopK };

/* One run of the backward with the given numerics; writes grad_x [kTokens, kHidden]. 0 on
 * success. */
static int run_backward(mrNumerics numerics, const float* grad_expanded_x_host,
                        const int32_t* expanded_row_idx_host, float* grad_x_host) {
  int result = 1;
  mrTensor* grad_expanded_x = NULL;
  mrTensor* expanded_row_idx = NULL;
  mrTensor* grad_x = NULL;
  mrExecutor* executor = NULL;
  void* workspace = NULL;
  uint64_t workspace_size = 0;
  const int64_t grad_expanded_x_shape[2] = {kPairs, kHidden};
  const int64_t expanded_row_idx_shape[1] = {kPairs};
  mrTensorDesc grad_x_desc;

  /* 1. Describe the inputs. On a device the buffers would be device memory filled from the host;
   *    on the CPU the host buffers are used directly (inputs are only read). */
  CHECK_STATUS(mrCreateTensor(grad_expanded_x_shape, 2, MR_FLOAT32, MR_DEVICE_CPU,
                              (void*)grad_expanded_x_host, &grad_expanded_x));
  CHECK_STATUS(mrCreateTensor(expanded_row_idx_shape, 1, MR_INT32, MR_DEVICE_CPU,
                              (void*)expanded_row_idx_host, &expanded_row_idx));

  /* 2. The output's shape comes from shape inference: [N, H] = [2, 2], float32. */
  CHECK_STATUS(mrMoeInitRoutingV2GradInferShape(grad_expanded_x, expanded_row_idx, kTopK,
                                                /*dropPadMode=*/0, /*activeNum=*/0, &grad_x_desc));
  if (grad_x_desc.ndim != 2 || grad_x_desc.shape[0] != kTokens || grad_x_desc.shape[1] != kHidden ||
      grad_x_desc.dtype != MR_FLOAT32) {
    fprintf(stderr, "unexpected grad_x shape\n");
    goto cleanup;
  }
  CHECK_STATUS(mrCreateTensor(grad_x_desc.shape, grad_x_desc.ndim, grad_x_desc.dtype, MR_DEVICE_CPU,
                              grad_x_host, &grad_x));

  /* 3. Phase one: validate and plan; no data is read. */
  CHECK_STATUS(mrMoeInitRoutingV2GradGetWorkspaceSize(grad_expanded_x, expanded_row_idx, kTopK, 0,
                                                      0, grad_x, &workspace_size, &executor));
  /* The numerics (hence the order) are an executor setting: aclnn has no argument for them.
   * mrSetAccumulationOrder could override the order they imply. */
  CHECK_STATUS(mrSetNumerics(executor, numerics));

  /* 4. Allocate the workspace phase one asked for (none on the CPU). */
  if (workspace_size > 0) {
    workspace = malloc((size_t)workspace_size);
    if (workspace == NULL) {
      fprintf(stderr, "cannot allocate %llu bytes of workspace\n",
              (unsigned long long)workspace_size);
      goto cleanup;
    }
  }

  /* 5. Phase two: checks the index values and computes. It consumes the executor, whatever it
   *    returns, so the pointer is cleared before the status is looked at. */
  {
    mrExecutor* consumed = executor;
    executor = NULL;
    CHECK_STATUS(mrMoeInitRoutingV2Grad(workspace, workspace_size, consumed, /*stream=*/NULL));
  }
  result = 0;

cleanup:
  /* 6. Release: an executor that never ran, the handles, the workspace. */
  mrDestroyExecutor(executor);
  mrDestroyTensor(grad_expanded_x);
  mrDestroyTensor(expanded_row_idx);
  mrDestroyTensor(grad_x);
  free(workspace);
  return result;
}

int main(void) {
  /* G1 (docs/spec/moe_init_routing.md §1.10): grad_expanded_x rows g0..g5 and the forward's
     expanded_row_idx. */
  const float grad_expanded_x[kPairs * kHidden] = {-1.0f,    0.5f,   /* g0 */
                                                   0.5f,     0.5f,   /* g1 */
                                                   0x1p-30f, 0.25f,  /* g2 */
                                                   0.125f,   2.0f,   /* g3 */
                                                   1.0f,     3.0f,   /* g4 */
                                                   0.25f,    -1.0f}; /* g5 */
  const int32_t expanded_row_idx[kPairs] = {4, 0, 2, 1, 5, 3};
  /* Token 0 sums rows 4, 0, 2; token 1 rows 1, 5, 3. In the tree order (a0 + a2) + a1, column 0
   * of token 0 is (1 + 2^-30) - 1 = 0 because 1 + 2^-30 rounds to 1 in float32; the sequential
   * order ((0 + 1) - 1) + 2^-30 keeps 2^-30. */
  const float expected_tree[kTokens * kHidden] = {0.0f, 3.75f, 0.875f, 1.5f};
  const float expected_sequential[kTokens * kHidden] = {0x1p-30f, 3.75f, 0.875f, 1.5f};
  const struct {
    const char* name;
    mrNumerics numerics;
    const float* expected;
  } runs[2] = {{"tree", MR_NUMERICS_ATLAS_A2, expected_tree},
               {"sequential", MR_NUMERICS_ASCEND_950, expected_sequential}};
  int failures = 0;
  int r, i;

  for (r = 0; r < 2; ++r) {
    float grad_x[kTokens * kHidden];
    memset(grad_x, 0x7f, sizeof grad_x); /* poison: an unwritten element shows */
    if (run_backward(runs[r].numerics, grad_expanded_x, expanded_row_idx, grad_x) != 0) {
      ++failures;
      continue;
    }
    printf("order %s: grad_x =", runs[r].name);
    for (i = 0; i < kTokens * kHidden; ++i) {
      printf(" %.9g", (double)grad_x[i]);
      /* Bitwise comparison (memcmp): both orders are exact contracts. */
      if (memcmp(&grad_x[i], &runs[r].expected[i], sizeof(float)) != 0) {
        fprintf(stderr, "\norder %s: grad_x[%d] = %.9g, expected %.9g\n", runs[r].name, i,
                (double)grad_x[i], (double)runs[r].expected[i]);
        ++failures;
      }
    }
    printf("\n");
  }
  if (failures != 0) {
    fprintf(stderr, "grad_example: %d failure(s)\n", failures);
    return 1;
  }
  printf("grad_example: both orders match the expected bits\n");
  return 0;
}
