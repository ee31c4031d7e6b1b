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

int main(void) {
  check_constants();
  check_null_handling();
  check_two_phases();
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("the C header compiles as strict C99 and its calls behave\n");
  return 0;
}
