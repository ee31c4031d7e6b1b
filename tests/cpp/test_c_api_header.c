/*
 * The C ABI header compiled as C99 with -Wall -Wextra -pedantic -Werror (tests/cpp/CMakeLists.txt
 * sets the flags), and a few calls from C checking what a C caller relies on: the constants'
 * values and sizes, NULL handling, messages, and one complete two-phase call. Exits non-zero on
 * the first failed check.
 */
#include <stdio.h>
#include <string.h>

#include "moe_routing/moe_routing.h"

static int failures = 0;

#define EXPECT(condition)                                                           \
  do {                                                                              \
    if (!(condition)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      ++failures;                                                                   \
    }                                                                               \
  } while (0)

/* The constants are part of the ABI: a change here breaks binaries built against an older
 * header. */
static void check_constants(void) {
  EXPECT(sizeof(mrStatus) == 4 && sizeof(mrDataType) == 4 && sizeof(mrDevice) == 4);
  EXPECT(MR_SUCCESS == 0 && MR_ERROR_INVALID_ARGUMENT == 1 && MR_ERROR_INDEX_OUT_OF_RANGE == 2);
  EXPECT(MR_ERROR_NOT_SUPPORTED == 3 && MR_ERROR_INTERNAL == 4 && MR_ERROR_RUNTIME == 5);
  EXPECT(MR_FLOAT32 == 0 && MR_FLOAT16 == 1 && MR_BFLOAT16 == 2);
  EXPECT(MR_INT8 == 3 && MR_INT32 == 4 && MR_INT64 == 5);
  EXPECT(MR_DEVICE_CPU == 0 && MR_DEVICE_CUDA == 1);
  EXPECT(MR_ACCUMULATION_TREE == 0 && MR_ACCUMULATION_SEQUENTIAL == 1);
  EXPECT(MR_NUMERICS_ATLAS_A2 == 0 && MR_NUMERICS_ASCEND_950 == 1);
  EXPECT(MR_MAX_DIMS == 8);
  EXPECT(strcmp(mrGetStatusName(MR_ERROR_INDEX_OUT_OF_RANGE), "index out of range") == 0);
  EXPECT(strcmp(mrGetStatusName(77), "unknown status") == 0);
}

static void check_null_handling(void) {
  mrTensor* tensor = (mrTensor*)&failures; /* any non-NULL value: must be reset to NULL */
  const int64_t shape[1] = {4};
  uint64_t workspace_size = 123;
  mrExecutor* executor = (mrExecutor*)&failures;

  EXPECT(mrCreateTensor(shape, 1, MR_FLOAT32, MR_DEVICE_CPU, NULL, NULL) ==
         MR_ERROR_INVALID_ARGUMENT);
  EXPECT(strcmp(mrGetLastErrorMessage(), "mrCreateTensor: tensor must not be NULL, got NULL") == 0);
  EXPECT(mrCreateTensor(shape, 1, 42, MR_DEVICE_CPU, NULL, &tensor) == MR_ERROR_INVALID_ARGUMENT);
  EXPECT(tensor == NULL);
  EXPECT(strstr(mrGetLastErrorMessage(), "got 42") != NULL);

  EXPECT(mrMoeInitRoutingV2GradGetWorkspaceSize(NULL, NULL, 1, 0, 0, NULL, &workspace_size,
                                                &executor) == MR_ERROR_INVALID_ARGUMENT);
  EXPECT(workspace_size == 0 && executor == NULL);
  EXPECT(strcmp(mrGetLastErrorMessage(),
                "moe_init_routing_grad: grad_expanded_x must not be NULL, got NULL") == 0);
  EXPECT(mrMoeInitRoutingV2Grad(NULL, 0, NULL, NULL) == MR_ERROR_INVALID_ARGUMENT);
  EXPECT(strcmp(mrGetLastErrorMessage(),
                "moe_init_routing_grad: executor must not be NULL, got NULL") == 0);
  /* Successes (cleaning up) keep the message of the last failure. */
  EXPECT(mrDestroyTensor(NULL) == MR_SUCCESS && mrDestroyExecutor(NULL) == MR_SUCCESS);
  EXPECT(strcmp(mrGetLastErrorMessage(),
                "moe_init_routing_grad: executor must not be NULL, got NULL") == 0);
}

/* Dropless, top_k = 2, H = 1: grad_x[i] = g[idx[2i]] + g[idx[2i+1]], with -1 skipped. */
static void check_two_phases(void) {
  float grad_expanded_x[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  int32_t expanded_row_idx[4] = {3, 0, -1, 2};
  float grad_x[2] = {-1.0f, -1.0f};
  const int64_t g_shape[2] = {4, 1}, idx_shape[1] = {4}, out_shape[2] = {2, 1};
  mrTensor* g = NULL;
  mrTensor* idx = NULL;
  mrTensor* out = NULL;
  mrExecutor* executor = NULL;
  uint64_t workspace_size = 99;
  mrTensorDesc desc;

  EXPECT(mrCreateTensor(g_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, grad_expanded_x, &g) == MR_SUCCESS);
  EXPECT(mrCreateTensor(idx_shape, 1, MR_INT32, MR_DEVICE_CPU, expanded_row_idx, &idx) ==
         MR_SUCCESS);
  EXPECT(mrCreateTensor(out_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, grad_x, &out) == MR_SUCCESS);
  EXPECT(mrMoeInitRoutingV2GradInferShape(g, idx, 2, 0, 0, &desc) == MR_SUCCESS);
  EXPECT(desc.produced && desc.ndim == 2 && desc.shape[0] == 2 && desc.shape[1] == 1 &&
         desc.dtype == MR_FLOAT32);
  EXPECT(mrMoeInitRoutingV2GradGetWorkspaceSize(g, idx, 2, 0, 0, out, &workspace_size, &executor) ==
         MR_SUCCESS);
  EXPECT(workspace_size == 0 && executor != NULL);
  EXPECT(mrSetAccumulationOrder(executor, MR_ACCUMULATION_SEQUENTIAL) == MR_SUCCESS);
  EXPECT(mrMoeInitRoutingV2Grad(NULL, 0, executor, NULL) == MR_SUCCESS);
  EXPECT(grad_x[0] == 9.0f && grad_x[1] == 4.0f);
  mrDestroyTensor(g);
  mrDestroyTensor(idx);
  mrDestroyTensor(out);
}

/* The combine from C: the spec's example (mode 2, N = 2, K = 2, H = 1) through V2, then its
 * backward with H = 1; V1 refuses a NULL x1. */
static void check_finalize(void) {
  float expanded_x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  int32_t expanded_row_idx[4] = {1, 3, 0, 2};
  float scales[4] = {0.5f, 0.25f, 2.0f, 1.0f};
  float x1[2] = {10.0f, 20.0f};
  float out[2] = {-1.0f, -1.0f};
  float grad_expanded_x[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
  float grad_scales[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
  const int64_t rows_shape[2] = {4, 1}, idx_shape[1] = {4}, nk_shape[2] = {2, 2},
                nh_shape[2] = {2, 1};
  mrTensor *ex = NULL, *idx = NULL, *sc = NULL, *a = NULL, *o = NULL, *gex = NULL, *gs = NULL;
  mrExecutor* executor = NULL;
  uint64_t workspace_size = 99;
  unsigned char workspace[256];
  mrTensorDesc desc;

  EXPECT(mrCreateTensor(rows_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, expanded_x, &ex) == MR_SUCCESS);
  EXPECT(mrCreateTensor(idx_shape, 1, MR_INT32, MR_DEVICE_CPU, expanded_row_idx, &idx) ==
         MR_SUCCESS);
  EXPECT(mrCreateTensor(nk_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, scales, &sc) == MR_SUCCESS);
  EXPECT(mrCreateTensor(nh_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, x1, &a) == MR_SUCCESS);
  EXPECT(mrCreateTensor(nh_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, out, &o) == MR_SUCCESS);
  EXPECT(mrMoeFinalizeRoutingV2InferShape(ex, idx, a, NULL, NULL, sc, NULL, 2, &desc) ==
         MR_SUCCESS);
  EXPECT(desc.produced && desc.ndim == 2 && desc.shape[0] == 2 && desc.shape[1] == 1);
  EXPECT(mrMoeFinalizeRoutingV2GetWorkspaceSize(ex, idx, a, NULL, NULL, sc, NULL, 2, o,
                                                &workspace_size, &executor) == MR_SUCCESS);
  EXPECT(workspace_size == 0 && executor != NULL);
  EXPECT(mrSetNumerics(executor, MR_NUMERICS_ASCEND_950) == MR_SUCCESS);
  EXPECT(mrMoeFinalizeRoutingV2(NULL, 0, executor, NULL) == MR_SUCCESS);
  EXPECT(out[0] == 12.0f && out[1] == 25.0f);

  EXPECT(mrMoeFinalizeRoutingGetWorkspaceSize(ex, NULL, NULL, NULL, sc, idx, NULL, o,
                                              &workspace_size,
                                              &executor) == MR_ERROR_INVALID_ARGUMENT);
  EXPECT(strcmp(mrGetLastErrorMessage(), "moe_finalize_routing: x1 must not be NULL, got NULL") ==
         0);
  EXPECT(executor == NULL);

  /* Backward with grad_y = out's shape [2, 1] of ones: grad_expanded_x[idx[p]] = scales[p],
   * grad_scales[p] = expanded_x[idx[p]]. */
  out[0] = out[1] = 1.0f;
  EXPECT(mrCreateTensor(rows_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, grad_expanded_x, &gex) ==
         MR_SUCCESS);
  EXPECT(mrCreateTensor(nk_shape, 2, MR_FLOAT32, MR_DEVICE_CPU, grad_scales, &gs) == MR_SUCCESS);
  EXPECT(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(o, idx, ex, sc, NULL, NULL, 0, 0, 0, 0, gex, gs,
                                                    NULL, &workspace_size,
                                                    &executor) == MR_SUCCESS);
  EXPECT(workspace_size > 0 && workspace_size <= sizeof workspace && executor != NULL);
  EXPECT(mrMoeFinalizeRoutingV2Grad(workspace, workspace_size, executor, NULL) == MR_SUCCESS);
  EXPECT(grad_expanded_x[0] == 2.0f && grad_expanded_x[1] == 0.5f && grad_expanded_x[2] == 1.0f &&
         grad_expanded_x[3] == 0.25f);
  EXPECT(grad_scales[0] == 2.0f && grad_scales[1] == 4.0f && grad_scales[2] == 1.0f &&
         grad_scales[3] == 3.0f);
  mrDestroyTensor(ex);
  mrDestroyTensor(idx);
  mrDestroyTensor(sc);
  mrDestroyTensor(a);
  mrDestroyTensor(o);
  mrDestroyTensor(gex);
  mrDestroyTensor(gs);
}

int main(void) {
  check_constants();
  check_null_handling();
  check_two_phases();
  check_finalize();
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("the C header compiles as strict C99 and its calls behave\n");
  return 0;
}
