# The two commands a new user needs (README.md): `make demo` and `make test`. Both install what
# they need first (Debian packages with apt-get, Python packages into .venv), so they work from a
# fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# The build trees, their flags and their test settings are CMakePresets.json's configure, build
# and test presets (release, asan, tsan, fuzz, cuda); the recipes below call them, so a plain
# `cmake --preset asan && cmake --build --preset asan && ctest --preset asan` is the same build.
# The directories are the presets' binaryDir.
BUILD_DIR := build
ASAN_BUILD_DIR := build-asan
TSAN_BUILD_DIR := build-tsan
JOBS ?= $(shell nproc)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := cmake ninja-build g++ libgtest-dev libgmock-dev python3-venv clang libclang-rt-14-dev \
  clang-format

CMAKE_FLAGS ?=
VENV ?= .venv
PYTHON ?= python3
VENV_PY := $(VENV)/bin/python
# .venv's torch is pinned to the CPU build this machine kind has on disk; the package itself
# supports a range (pyproject.toml) and is built against whichever torch its environment has.
PY_PACKAGES := torch==2.13.0 numpy pytest scikit-build-core ninja matplotlib

.PHONY: all deps build build-asan build-tsan test test-cpp test-asan test-tsan test-python venv \
  python demo clean help format format-check check-layers test-packaging

all: build

help:
	@echo "make demo   install, build and run the main job (moe-routing demo, then the Python MoE example)"
	@echo "make test   install, build and run every test suite (also under ASan+UBSan and TSan)"
	@echo "make build  configure and build into $(BUILD_DIR)/"
	@echo "make clean  remove build trees"

# System packages: installed only when missing.
deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "== installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

build: deps
	cmake --preset release $(CMAKE_FLAGS) >/dev/null
	cmake --build --preset release -j $(JOBS)

build-asan: deps
	cmake --preset asan $(CMAKE_FLAGS) >/dev/null
	cmake --build --preset asan -j $(JOBS)

test-cpp: build
	ctest --preset release -j $(JOBS)

# ASAN_OPTIONS / UBSAN_OPTIONS come from the preset.
test-asan: build-asan
	ctest --preset asan -j $(JOBS)

# ThreadSanitizer (its own tree: TSan and ASan exclude each other): the thread pool, the C ABI
# called from several threads, and the tests whose kernels really run on several threads (the
# test preset `tsan` lists them); tsan.detects_a_race checks that a deliberate race is reported.
build-tsan: deps
	cmake --preset tsan $(CMAKE_FLAGS) >/dev/null
	cmake --build --preset tsan -j $(JOBS)

test-tsan: build-tsan
	ctest --preset tsan -j $(JOBS)

# Python: a local virtual environment, the package installed into it (scikit-build-core drives
# CMake; its build tree build/python/ is reused between runs).
$(VENV)/.installed: | deps
	$(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q --upgrade pip
	$(VENV_PY) -m pip install -q $(PY_PACKAGES)
	touch $@

venv: $(VENV)/.installed

python: venv
	$(VENV_PY) -m pip install -q --no-build-isolation --no-deps .

# tests/python: the package's suites; tests/adversarial/python: calls an adversary would make
# (issue 17), each once accepted with a wrong result. TorchInductor's compiled-code cache is per
# checkout: the default, /tmp/torchinductor_$USER, is shared by every checkout of the machine, and
# its keys do not cover our operators' schemas, so a checkout whose operators differ (another
# branch) got code calling them with the wrong arguments.
test-python: python build
	cd tests/python && MOE_ROUTING_CLI=$(abspath $(BUILD_DIR))/moe-routing \
	  TORCHINDUCTOR_CACHE_DIR=$(abspath $(BUILD_DIR))/torchinductor-cache \
	  ../../$(VENV_PY) -m pytest -q -p no:cacheprovider . ../adversarial/python

# Packaging (tests/packaging): the wheel built against .venv's torch and installed into a fresh
# virtual environment that already has that torch, which it must leave untouched; and the CUDA
# build's skip where there is no nvcc.
test-packaging: python
	$(VENV_PY) -m pytest -q -p no:cacheprovider tests/packaging

# The supported torch range (pyproject.toml) checked release by release: moe_routing built against
# each and the Python suites run with it (tools/check_torch_range.sh). Not part of `make test`:
# each release is a CUDA build of torch from PyPI, about 5 GB installed; run it when the range
# changes.
TORCH_RELEASES ?= 2.12.1 2.13.0 2.14.1 2.15.0
.PHONY: check-torch-range
check-torch-range: deps
	PYTHON=$(PYTHON) tools/check_torch_range.sh $(TORCH_RELEASES)

test: format-check check-layers test-cpp test-asan test-tsan test-python test-packaging fuzz \
  test-cuda-build
	@echo "== make test: every suite passed"

# libFuzzer on the C ABI (fuzz/fuzz_c_api.cpp), built with clang, ASan and UBSan in its own tree:
# first replays every saved crash (fuzz/regressions/*.bin) once, then fuzzes for FUZZ_SECONDS from
# the committed seeds (fuzz/corpus/; new inputs go to $(FUZZ_BUILD_DIR)/corpus). A crash, leak,
# sanitizer report, timeout or oracle failure exits non-zero and leaves the input in
# $(FUZZ_BUILD_DIR)/ (crash-*, leak-*, timeout-*).
FUZZ_BUILD_DIR := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_ENV := ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: fuzz
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS)
	shopt -s nullglob; regressions=(fuzz/regressions/*.bin); \
	if [ $${#regressions[@]} -gt 0 ]; then \
	  echo "== replaying $${#regressions[@]} regression input(s)"; \
	  $(FUZZ_ENV) $(FUZZ_BUILD_DIR)/fuzz_c_api $${regressions[@]}; \
	fi
	mkdir -p $(FUZZ_BUILD_DIR)/corpus
	$(FUZZ_ENV) $(FUZZ_BUILD_DIR)/fuzz_c_api -max_total_time=$(FUZZ_SECONDS) -timeout=20 \
	  -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD_DIR)/ $(FUZZ_BUILD_DIR)/corpus fuzz/corpus \
	  2>&1 | grep -v -E '^#[0-9]+.*(NEW|REDUCE|pulse)|# Uses: [0-9]+$$|recommended dictionary'
	@echo "== make fuzz: no crash, leak or sanitizer report in $(FUZZ_SECONDS) s"

demo: build python
	$(BUILD_DIR)/moe-routing demo
	@echo
	@echo "== a whole MoE layer (moe_init_routing -> experts -> moe_finalize_routing) trained vs plain PyTorch"
	$(VENV_PY) examples/python/tiny_moe.py
	@echo
	@echo "== expert parallelism: the layer trained on 2 ranks (gloo, 127.0.0.1) vs one process (docs/distributed.md)"
	$(VENV_PY) examples/python/ep_moe.py

# Source style (.clang-format): `make format` applies it, `make format-check` (part of make test)
# fails naming every file that differs.
format: deps
	git ls-files -z -- '*.h' '*.hpp' '*.cpp' '*.c' '*.cu' '*.cuh' | xargs -0 clang-format -i

format-check: deps
	tools/checks/format_check.sh

# The one-way layers of docs/ARCHITECTURE.md: fails naming file, line and rule for every #include
# that goes up a layer or across backends / front ends.
check-layers:
	$(PYTHON) tools/checks/check_layers.py

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(TSAN_BUILD_DIR) $(FUZZ_BUILD_DIR) $(CUDA_BUILD_DIR) build/python

# The CUDA backend (docs/cuda.md) built with this machine's nvcc for sm_90 (H100/H200) in its own
# tree, and every suite run there: CUDA code that stops compiling or linking fails `make test`
# even without a GPU. Without a GPU the GPU tests skip, saying so; the CPU tests and the kernels'
# logic on the CPU (test_cuda_host.cpp) still run. A machine without nvcc (no CUDA toolkit) skips
# all of it, saying so in one line (tests/packaging/test_cuda_skip.py).
CUDA_BUILD_DIR := build-cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)

.PHONY: test-cuda-build
test-cuda-build: deps
	@if [ ! -x "$(NVCC)" ]; then \
	  echo "== make test-cuda-build: skipped, no nvcc at $(NVCC): the CUDA backend is neither built nor tested (install the CUDA toolkit or set NVCC=/path/to/nvcc)"; \
	  exit 0; \
	fi; \
	set -x; \
	cmake --preset cuda -DCMAKE_CUDA_COMPILER=$(NVCC) $(CMAKE_FLAGS) >/dev/null; \
	cmake --build --preset cuda -j $(JOBS); \
	ctest --preset cuda -j $(JOBS)
