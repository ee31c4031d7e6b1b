#!/usr/bin/env bash
# tools/gpu_check.sh: the CUDA backend checked and timed on a machine with an NVIDIA GPU, from a
# fresh copy of the repository, without network access (docs/cuda.md).
#
#   1. builds the library with its CUDA backend for sm_90 (H100/H200): cmake + ninja (or make) +
#      nvcc, or, without cmake, nvcc and g++ directly; the GoogleTest suites only where GoogleTest
#      is installed;
#   2. runs the CUDA test suite (GPU tests bitwise against the CPU backend), if it was built;
#   3. runs moe_routing_gpu_check (tools/gpu_check.cpp): CUDA vs CPU backend bit for bit on random
#      inputs for every scenario, dtype, order and numerics of the dispatch and its backward, and
#      every layout, api, numerics and optional input of the combine and its backward (PASS/FAIL),
#      then the benchmarks (the combine's rows on the dispatch's output) at the model shapes of
#      tools/cases/model_shapes.h (deepseek-v3: H 7168, E 256, K 8; qwen3-235b: 4096, 128, 8;
#      qwen3-30b: 2048, 128, 8; mixtral: 4096, 8, 2), in GB/s against a device-to-device
#      cudaMemcpy measured in the same run;
#   4. if python3 imports torch with CUDA: PyTorch eager baselines at the same shapes, the torch
#      operators built against that torch (CUDA tensors vs CPU tensors, bit for bit, and timed),
#      and expert parallelism (moe_routing.distributed) on CUDA tensors with a world-1 NCCL group
#      (tools/gpu_check_ep.py: dispatch / combine forward and backward vs the CPU, bit for bit);
#   5. prints a short table last.
#
# Environment: GPU_CHECK_BUILD_DIR (default build-gpu-check), GPU_CHECK_SKIP_TORCH_EXT=1 to skip the
# torch extension build, GPU_CHECK_NO_CMAKE=1 to build without cmake even where it is installed,
# CUDA_ARCH (default 90). Exit status: 0 when every check passed.
set -uo pipefail

started=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GPU_CHECK_BUILD_DIR:-$root/build-gpu-check}
arch=${CUDA_ARCH:-90}
jobs=$(nproc 2>/dev/null || echo 4)
results=$build/gpu_check_results.txt
status=0

say() { printf '\n== [%3ds] %s\n' $((SECONDS - started)) "$*"; }
fail() { echo "gpu_check: FAIL: $*"; status=1; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: nvidia-smi not found: this script needs a machine with an NVIDIA GPU" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "gpu_check: nvcc not found (PATH or /usr/local/cuda/bin): the CUDA toolkit is needed" >&2
  exit 2
fi
cuda_home=""
for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)" \
                 /usr/local/cuda; do
  if [ -n "$candidate" ] && [ -f "$candidate/include/cuda_runtime.h" ]; then cuda_home=$candidate; break; fi
done
mkdir -p "$build"
: >"$results"

# ---- 1. build ---------------------------------------------------------------------------------
gpu_check_bin=""
cuda_tests_bin=""
if command -v cmake >/dev/null 2>&1 && [ "${GPU_CHECK_NO_CMAKE:-0}" != 1 ]; then
  generator="Unix Makefiles"
  command -v ninja >/dev/null 2>&1 && generator=Ninja
  [ -f "$build/CMakeCache.txt" ] && generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
  configure() {
    cmake -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DMOE_ROUTING_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" -DMOE_ROUTING_BUILD_CLI=OFF "$@" \
      >"$build/configure.log" 2>&1
  }
  say "configure ($generator, nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$arch)"
  targets=(moe_routing_gpu_check)
  if configure -DMOE_ROUTING_BUILD_TESTS=ON; then
    targets+=(moe_routing_cuda_tests)
  else
    echo "GoogleTest not usable (see $build/configure.log): building without the test suites"
    configure -DMOE_ROUTING_BUILD_TESTS=OFF || { cat "$build/configure.log"; exit 2; }
  fi
  say "build: ${targets[*]}"
  if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build/build.log" 2>&1; then
    tail -50 "$build/build.log"
    echo "gpu_check: the build failed" >&2
    exit 2
  fi
  gpu_check_bin=$build/moe_routing_gpu_check
  [[ " ${targets[*]} " == *" moe_routing_cuda_tests "* ]] && cuda_tests_bin=$build/tests/cpp/moe_routing_cuda_tests
else
  say "build without cmake: nvcc + g++ directly (CUDA in ${cuda_home:-?})"
  [ -n "$cuda_home" ] || { echo "gpu_check: the CUDA headers (include/cuda_runtime.h) were not found; set CUDA_HOME" >&2; exit 2; }
  obj=$build/obj
  mkdir -p "$obj"
  cxx=${CXX:-g++}
  flags=(-O3 -std=c++17 -fPIC -ffp-contract=off -fno-fast-math -I"$root/include" -I"$root/src"
         -I"$root/tools" -I"$cuda_home/include" -DMOE_ROUTING_HAVE_CUDA=1)
  machine=$(uname -m)
  [ "$machine" = x86_64 ] && flags+=(-mfpmath=sse -DMOE_ROUTING_HAVE_AVX2=1)
  sources=$(cd "$root" && ls src/core/*.cpp src/reference/*.cpp src/ops/*.cpp src/ops/*/*.cpp \
    src/cpu/*.cpp src/c_api/*.cpp src/cuda/*.cpp tools/cases/*.cpp 2>/dev/null)
  build_one() {
    local src=$1 extra=()
    case $src in
      *avx2*) [ "$machine" = x86_64 ] || return 0; extra=(-mavx2 -mf16c) ;;
    esac
    "$cxx" "${flags[@]}" "${extra[@]}" -c "$root/$src" -o "$obj/$(echo "$src" | tr / _).o"
  }
  nvcc_flags=(-O3 -std=c++17 -arch=sm_"$arch" -fmad=false -ftz=false -prec-div=true -prec-sqrt=true
              -Xcompiler=-fPIC,-ffp-contract=off,-fno-fast-math -I"$root/include" -I"$root/src"
              -DMOE_ROUTING_HAVE_CUDA=1)
  pids=()
  for cu in "$root"/src/cuda/*.cu; do
    "$nvcc" "${nvcc_flags[@]}" -c "$cu" -o "$obj/$(basename "$cu").o" & pids+=($!)
  done
  for src in $sources; do
    build_one "$src" & pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "gpu_check: the build failed" >&2; exit 2; }; done
  "$cxx" "${flags[@]}" "$root/tools/gpu_check.cpp" "$obj"/*.o -L"$cuda_home/lib64" -lcudart -lpthread \
    -Wl,-rpath,"$cuda_home/lib64" -o "$build/moe_routing_gpu_check" || { echo "gpu_check: link failed" >&2; exit 2; }
  gpu_check_bin=$build/moe_routing_gpu_check
fi

# The torch extension (step 4) builds in the background, at low priority, while the tests and
# the bitwise checks run; the benchmarks wait for it, so that they run on a quiet host.
python=${PYTHON:-python3}
ext_pid=""
ext_build=$build/torch-ext
if [ "${GPU_CHECK_SKIP_TORCH_EXT:-0}" != 1 ] && [ -n "${generator:-}" ] &&
   "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "torch extension with CUDA: building in the background (logs: $ext_build.*.log)"
  (
    cmake -S "$root" -B "$ext_build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DMOE_ROUTING_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" -DMOE_ROUTING_BUILD_PYTHON=ON \
      -DMOE_ROUTING_BUILD_TESTS=OFF -DMOE_ROUTING_BUILD_CLI=OFF -DPython_EXECUTABLE="$(command -v "$python")" \
      >"$ext_build.configure.log" 2>&1 &&
      timeout 200 nice -n 10 cmake --build "$ext_build" -j "$jobs" --target moe_routing_torch \
        >"$ext_build.build.log" 2>&1
  ) &
  ext_pid=$!
fi

# ---- 2. the CUDA test suite -------------------------------------------------------------------
if [ -n "$cuda_tests_bin" ]; then
  say "GoogleTest: moe_routing_cuda_tests (CUDA vs CPU backend, bit for bit)"
  if "$cuda_tests_bin" --gtest_brief=1 >"$build/cuda_tests.log" 2>&1; then
    grep -E "PASSED|SKIPPED|tests ran" "$build/cuda_tests.log" | head -5
    grep -q "SKIPPED" "$build/cuda_tests.log" && fail "GPU tests skipped on a GPU machine (see $build/cuda_tests.log)"
  else
    grep -E "Failure|FAILED|error|Expected|Which is|differ" "$build/cuda_tests.log" | head -40
    fail "moe_routing_cuda_tests (log: $build/cuda_tests.log)"
  fi
fi

# ---- 3. bitwise checks and benchmarks -------------------------------------------------------
say "moe_routing_gpu_check: CUDA vs CPU backend, bit for bit"
"$gpu_check_bin" --checks-only >"$build/checks.log" 2>&1
checks_status=$?
grep -vE "^PASS " "$build/checks.log"  # the failures and the summary line
[ $checks_status = 0 ] || fail "moe_routing_gpu_check --checks-only (log: $build/checks.log)"
ext_status=1
if [ -n "$ext_pid" ]; then
  say "waiting for the torch extension build"
  wait "$ext_pid" && ext_status=0
fi
say "moe_routing_gpu_check: benchmarks"
"$gpu_check_bin" --bench-only --results "$results" || fail "moe_routing_gpu_check --bench-only"
copy_gbps=$(sed -n 's/^COPY|//p' "$results" | tail -1)

# ---- 4. PyTorch -------------------------------------------------------------------------------
if [ -n "$copy_gbps" ] && "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "PyTorch eager baselines"
  "$python" "$root/tools/gpu_check.py" --copy-gbps "$copy_gbps" --results "$results" || fail "tools/gpu_check.py"
  if [ -n "$ext_pid" ] && [ $ext_status = 0 ]; then
    say "torch operators with CUDA (built against this torch): CUDA vs CPU tensors, then timed"
    ext=$(find "$ext_build" -name '_moe_routing_ops*.so' | head -1)
    "$python" "$root/tools/gpu_check.py" --copy-gbps "$copy_gbps" --results "$results" --ext "$ext" ||
      fail "torch operators on CUDA (tools/gpu_check.py --ext)"
    # moe_routing.distributed is pure Python over the operators: the package's sources next to
    # the library just built make an importable moe_routing with CUDA.
    say "expert parallelism on CUDA tensors, world 1 NCCL (tools/gpu_check_ep.py, docs/distributed.md)"
    ep_package=$build/ep-package
    rm -rf "$ep_package" && mkdir -p "$ep_package/moe_routing" &&
      cp "$root"/python/moe_routing/*.py "$ep_package/moe_routing/" &&
      cp -r "$root/python/moe_routing/distributed" "$ep_package/moe_routing/" &&
      cp "$ext" "$ep_package/moe_routing/" &&
      cp "$(find "$ext_build" -name _torch_build.py | head -1)" "$ep_package/moe_routing/" &&
      PYTHONPATH=$ep_package timeout 300 "$python" "$root/tools/gpu_check_ep.py" ||
      fail "expert parallelism on CUDA with NCCL (tools/gpu_check_ep.py)"
  elif [ -n "$ext_pid" ]; then
    echo "gpu_check: the torch extension did not build here within 200 s (logs: $ext_build.*.log); skipped"
    tail -5 "$ext_build.configure.log" "$ext_build.build.log" 2>/dev/null
  fi
else
  say "PyTorch with CUDA not importable by $python: no PyTorch comparison"
fi

# ---- 5. the table -----------------------------------------------------------------------------
say "summary (GB/s = bytes that must move / time; % of the device-to-device copy measured above)"
echo "copy bandwidth (cudaMemcpy D2D, read + write): ${copy_gbps:-?} GB/s"
printf '%-22s %-17s %-22s %-9s %9s %8s %7s %s\n' operator implementation case dtype ms GB/s %copy verified
grep '^RESULT|' "$results" | sort -t'|' -k2,2 -k4,4 -k3,3 |
  awk -F'|' '{ printf "%-22s %-17s %-22s %-9s %9.3f %8.1f %6.1f%% %s\n", $2, $3, $4, $5, $6, $7, $8, $9 }'
echo "targets: backward >= 85% of copy (deepseek-v3 N=8192 bf16, ours), forward >= 75% (dropless)"
grep -q '|NO$' "$results" && fail "a benchmark output differed from the CPU backend"
echo "gpu_check: $([ $status = 0 ] && echo PASS || echo FAIL) in $((SECONDS - started)) s"
exit $status
