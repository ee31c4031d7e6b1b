// What the GPU suites share (tests/cpp/test_cuda_*gpu.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "cuda/device_memory.h"

/// Skips the test, saying why, when no GPU is present.
#define SKIP_WITHOUT_GPU()                                                             \
  do {                                                                                 \
    std::string why_no_gpu;                                                            \
    if (!::moe_routing::cuda::device_available(&why_no_gpu))                           \
      GTEST_SKIP() << "no GPU is present (" << why_no_gpu << "); this test needs one"; \
  } while (0)
