# The front door. `make test` and `make demo` install what is missing (scripts/bootstrap), then
# configure, build and run.
JOBS ?= $(shell nproc)
BUILD_DIR := build
ASAN_DIR := build-asan
# The Python package is built and tested in a venv of the build tree (scripts/pyenv), never the
# system Python.
PYENV := $(BUILD_DIR)/pyenv
PYTHON_FLAGS = -DHSS_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(PYENV))/bin/python

.PHONY: all bootstrap configure build test test-lmcache demo demo-remote asan bench format clean

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

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The drop-in inside the real LMCache 0.5.6 (a cached venv outside the clone, ~6 GB with torch).
test-lmcache: bootstrap
	scripts/lmcache_venv

demo: build
	$(BUILD_DIR)/tools/hss-demo

bench: build
	$(BUILD_DIR)/bench/hss-bench

asan: bootstrap
	cmake --preset asan
	cmake --build $(ASAN_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure -j $(JOBS) -LE "bench|install"

format:
	git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) build-host build-gpu

# hss-demo --remote against a redis-server started (and stopped) for the run.
demo-remote: build
	@scripts/demo-remote $(BUILD_DIR)/tools/hss-demo
