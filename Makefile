# The front door. `make test` and `make demo` install what is missing (scripts/bootstrap), then
# configure, build and run.
JOBS ?= $(shell nproc)
BUILD_DIR := build
ASAN_DIR := build-asan

.PHONY: all bootstrap configure build test demo demo-remote asan bench format clean

all: build

bootstrap:
	@scripts/bootstrap

$(BUILD_DIR)/build.ninja:
	cmake --preset default

configure: bootstrap $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

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
