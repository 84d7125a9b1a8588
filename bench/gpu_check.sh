#!/usr/bin/env bash
# The GPU check of hsstore, in one call on a bare, offline GPU machine.
#
#   bash bench/gpu_check.sh prepare [--deps DIR]        # here (network): fill DIR (.gpu-deps)
#   bash bench/gpu_check.sh run [--deps DIR]            # on the GPU machine, DIR carried along
#   bash bench/gpu_check.sh run --dry-run [--deps DIR]  # here: configure, and tests/gpu on the model
#   bash bench/gpu_check.sh selftest WORKDIR            # ctest: prepare into WORKDIR, dry run
#
# prepare: `apt-get download`s the Debian packages the GPU machine lacks (yaml-cpp, xxHash,
# GoogleTest/GMock, hiredis, with their runtime libraries, and pkgconf in case the machine has
# no pkg-config) into DIR, at most 24 MiB, and prints the one-line command to run there.
#
# run: unpacks every .deb of DIR with `dpkg -x` into a temporary prefix (never /), configures
# a Release build for sm_90 against it (CMAKE_PREFIX_PATH, pkg-config path, LD_LIBRARY_PATH;
# warnings are not errors: the machine's host compiler is unknown), builds with all cores, then
# runs the stages in this order, the most important figures first, each under its own timeout
# and all within $HSS_GPU_CHECK_BUDGET_S (default 480 s: 8 minutes from the start, the build
# included): the tests/gpu tests (the hss_gpu_tests binary, all of them in one process); the
# GPU benchmarks of device store and restore against cudaMemcpyAsync (gpu_store, gpu_retrieve),
# of batch launches (gpu_batch) and of the FP8 device store and restore against the bf16 ones
# (gpu_fp8: the table says whether the FP8 store reached 0.9x the bf16 store), of the
# device-resident tier's resident and mixed restores against a D2D cudaMemcpyAsync and its
# write-through store (gpu_tier: the table says whether the resident restore reached 0.8x);
# compute-sanitizer memcheck on a representative subset of
# tests/gpu (memcheck_filter below says which and why); gpu_store_mapped, gpu_small and
# gpu_overlap; racecheck and synccheck; the kernels' resource usage; the Python binding's CUDA
# tests when python/CMakeLists.txt exists. memcheck judges memory errors, not the CUDA API errors
# the tests provoke on purpose (--report-api-errors no). A stage the budget leaves no time for is
# NOT RUN (listed, not a failure); a stage cut short still reports what it got (the tests passed
# before, the test it stopped in). With the machine's start (a minute or two) a whole run takes
# about 10 of a session's 15 device minutes: a rerun within the same session needs a smaller
# HSS_GPU_CHECK_BUDGET_S (the first stages only). Tests that need two GPUs (suites *TwoDevices)
# are left out on a one-GPU machine, where they would skip. Pools may exceed the VM's
# MemAvailable at start (its memory grows as it is used): HSS_POOL_MEMORY_CHECK=0. It prints a
# short table last and writes the log, the table and the benchmark JSON into $OUT when set (else
# into BUILD_DIR/gpu-check-out). Exit status 1 when no
# CUDA device was used, when any GPU test or benchmark was skipped, when a sanitizer reported an
# error, or when a stage failed or timed out.
#
# run --dry-run: the same unpack and configure, but with the system's copies of those libraries
# hidden from CMake (CMAKE_IGNORE_PREFIX_PATH / CMAKE_IGNORE_PATH, pkg-config limited to the
# prefix), then checks in CMakeCache.txt that every dependency was found inside the prefix; then
# builds tests/gpu against the CUDA runtime model (HSS_CUDA_MODEL, the same prefix) and runs
# them with one model device through the same stage as the GPU run (the hss_gpu_tests binary in
# one process: the two-device tests left out, any skip a failure), so the one-GPU accounting is
# proven here.
#
# Options: --deps DIR (default .gpu-deps), --build-dir DIR (default build-gpu; build-gpu-dry for
# --dry-run, its model build beside it with suffix -model). Environment: HSS_GPU_CHECK_BUDGET_S,
# HSS_GPU_MEMCHECK_FILTER (a gtest filter; default: memcheck_filter below), HSS_GPU_SANITIZE_FILTER
# (racecheck and synccheck; default: the kernel tests).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 2

readonly max_deps_bytes=$((24 * 1024 * 1024))
# The -dev packages the build needs; their runtime libraries are added from their Depends.
readonly dev_packages=(libyaml-cpp-dev libxxhash-dev libgtest-dev libgmock-dev libhiredis-dev)
# pkgconf: CMake needs a pkg-config for xxHash (and hiredis); the GPU machine may have none.
readonly tool_packages=(pkgconf-bin)
# Present on any machine that runs the result (and newer there); never carried.
readonly base_libraries=(libc6 libgcc-s1 libstdc++6)

die() {
  echo "gpu_check: $*" >&2
  exit 2
}

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  exit "${1:-0}"
}

# ---------------------------------------------------------------------------------------------
# prepare

# The runtime libraries a package depends on directly (lib*, minus the base libraries).
runtime_depends() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "$1" 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^lib/ && $2 !~ /^</ {print $2}' |
    grep -vxF -f <(printf '%s\n' "${base_libraries[@]}") || true
}

cmd_prepare() {
  local deps=$1
  command -v apt-get >/dev/null 2>&1 || die "prepare needs apt-get (a Debian/Ubuntu machine)"
  local -a packages=()
  local p d
  for p in "${dev_packages[@]}" "${tool_packages[@]}"; do
    packages+=("$p")
    while read -r d; do [[ -n $d ]] && packages+=("$d"); done < <(runtime_depends "$p")
  done
  mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)

  mkdir -p "$deps" || die "cannot create $deps"
  local download
  download=$(mktemp -d "${TMPDIR:-/tmp}/hss-gpu-download.XXXXXX") || die "mktemp failed"
  local -a apt_opts=(-q)
  # apt drops to user _apt for downloads, which cannot write a root-owned 0700 directory.
  [[ $(id -u) -eq 0 ]] && apt_opts+=(-o APT::Sandbox::User=root)
  if ! (cd "$download" && apt-get "${apt_opts[@]}" download "${packages[@]}") >"$download.log" 2>&1; then
    if [[ $(id -u) -eq 0 ]]; then
      # Package lists may be missing (a fresh container): fetch them once and retry.
      apt-get -qq update >>"$download.log" 2>&1
      (cd "$download" && apt-get "${apt_opts[@]}" download "${packages[@]}") >>"$download.log" 2>&1
    fi
  fi
  local got
  got=$(find "$download" -maxdepth 1 -name '*.deb' | wc -l)
  if ((got != ${#packages[@]})); then
    cat "$download.log" >&2
    rm -rf -- "$download" "$download.log"
    die "apt-get download fetched $got of ${#packages[@]} packages (${packages[*]})"
  fi
  local bytes
  bytes=$(du -cb "$download"/*.deb | tail -n 1 | cut -f1)
  if ((bytes > max_deps_bytes)); then
    rm -rf -- "$download" "$download.log"
    die "the packages take $bytes bytes, more than the $max_deps_bytes allowed"
  fi
  find "$deps" -maxdepth 1 -name '*.deb' -delete
  mv "$download"/*.deb "$deps"/
  rm -rf -- "$download" "$download.log"
  {
    echo "# bench/gpu_check.sh prepare, $(date -u '+%Y-%m-%d %H:%M UTC'), on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')"
    echo "# package version sha256"
    for deb in "$deps"/*.deb; do
      printf '%s %s %s\n' "$(dpkg-deb -f "$deb" Package 2>/dev/null)" \
        "$(dpkg-deb -f "$deb" Version 2>/dev/null)" "$(sha256sum "$deb" | cut -d' ' -f1)"
    done
  } >"$deps/MANIFEST"
  bytes=$(du -sb "$deps" | cut -f1)
  ((bytes <= max_deps_bytes)) || die "$deps holds $bytes bytes, more than $max_deps_bytes"

  local rel=${deps#"$repo"/}
  local deps_arg=""
  [[ $rel != .gpu-deps ]] && deps_arg=" --deps $rel"
  echo "prepared $rel: ${#packages[@]} packages, $bytes bytes (limit $max_deps_bytes): ${packages[*]}"
  echo "on the GPU machine, from the repository root, carrying [\"$rel\"]:"
  echo "  bash bench/gpu_check.sh run$deps_arg"
}

# ---------------------------------------------------------------------------------------------
# unpack + configure (run and run --dry-run)

prefix=""
cleanup_prefix() {
  # Only the directory this script created, never anything else.
  if [[ -n $prefix && $prefix == "${TMPDIR:-/tmp}"/hss-gpu-prefix-* && -d $prefix ]]; then
    rm -rf -- "$prefix"
  fi
}

unpack_deb() {
  local deb=$1 dest=$2
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg -x "$deb" "$dest"
  else
    # No dpkg: a .deb is an ar archive holding data.tar.*.
    local member
    member=$(ar t "$deb" | grep '^data\.tar') || return 1
    ar p "$deb" "$member" | tar -x -C "$dest" -f - --auto-compress 2>/dev/null ||
      ar p "$deb" "$member" | tar -x -C "$dest" -I "${member##*.}" -f -
  fi
}

# Unpacks into $prefix (named after the build directory, so a rerun configures the same paths and
# rebuilds nothing) and exports what the configure, build and tests need.
setup_prefix() {
  local deps=$1 build_dir=$2
  shopt -s nullglob
  local debs=("$deps"/*.deb)
  shopt -u nullglob
  ((${#debs[@]} > 0)) || die "no .deb in $deps: run 'bash bench/gpu_check.sh prepare' first (with network)"
  local tag
  tag=$(printf '%s' "$build_dir" | md5sum | cut -c1-12)
  prefix="${TMPDIR:-/tmp}/hss-gpu-prefix-$tag"
  [[ $prefix != / && -n $tag ]] || die "bad prefix $prefix"
  cleanup_prefix
  mkdir -p "$prefix" || die "cannot create $prefix"
  trap cleanup_prefix EXIT
  local deb
  for deb in "${debs[@]}"; do
    unpack_deb "$deb" "$prefix" || die "cannot unpack $deb"
  done
  deps_root="$prefix/usr"
  local arch
  arch=$(gcc -print-multiarch 2>/dev/null || true)
  [[ -n $arch ]] || arch="$(uname -m)-linux-gnu"
  deps_libdir="$deps_root/lib/$arch"
  [[ -d $deps_libdir ]] || die "$deps_libdir missing after unpacking: packages of another architecture?"
  # .pc files name /usr; point them at the prefix (pkg-config would drop -I/usr/include anyway).
  local pc
  for pc in "$deps_libdir"/pkgconfig/*.pc "$deps_root"/lib/pkgconfig/*.pc "$deps_root"/share/pkgconfig/*.pc; do
    [[ -f $pc ]] && sed -i -E "s#^([A-Za-z_]+)=/usr(/|\$)#\\1=$deps_root\\2#" "$pc"
  done
  export LD_LIBRARY_PATH="$deps_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  pc_dirs="$deps_libdir/pkgconfig:$deps_root/lib/pkgconfig:$deps_root/share/pkgconfig"
  # The carried pkgconf when it runs here, else the machine's.
  pkg_config="$deps_root/bin/pkgconf"
  if ! "$pkg_config" --version >/dev/null 2>&1; then
    pkg_config=$(command -v pkg-config || command -v pkgconf || true)
    [[ -n $pkg_config ]] || die "neither the carried pkgconf nor a pkg-config runs here"
  fi
  echo "prefix: $prefix (${#debs[@]} packages from $deps); pkg-config: $pkg_config"
}

# CUDA tools may live outside PATH on a bare image.
find_cuda_tools() {
  local d
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /opt/nvidia/nsight-compute; do
    [[ -d $d && :$PATH: != *:$d:* ]] && PATH="$PATH:$d"
  done
  export PATH
}

# configure_args DRY_RUN: the cmake arguments for the build against the prefix.
configure_args() {
  local dry=$1
  args=(-S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DHSS_WARNINGS_AS_ERRORS=OFF
    -DCMAKE_PREFIX_PATH="$deps_root" -DPKG_CONFIG_EXECUTABLE="$pkg_config"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
    # CMake < 3.26 does not know nvcc's C++20 flag; harmless where CMake knows it.
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
  if command -v ninja >/dev/null 2>&1; then args+=(-G Ninja); fi
  local nvcc
  nvcc=$(command -v nvcc || true)
  if [[ -n $nvcc ]]; then
    args+=(-DHSS_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc")
  elif ((dry)); then
    echo "no nvcc here: the dry run configures the host path only"
    args+=(-DHSS_ENABLE_CUDA=OFF)
  else
    die "no nvcc on PATH or in /usr/local/cuda/bin"
  fi
  if ((dry)); then
    # Hide every system copy: prefixes /usr, /usr/local and / (merged /lib), their library and
    # include directories, and pkg-config's default search path.
    local arch=${deps_libdir##*/}
    args+=(-DCMAKE_IGNORE_PREFIX_PATH="/usr;/usr/local;/"
      -DCMAKE_IGNORE_PATH="/usr/include;/usr/local/include;/usr/lib;/usr/lib/$arch;/lib;/lib/$arch;/usr/local/lib;/usr/lib/$arch/cmake;/usr/lib/cmake;/usr/share/cmake")
    export PKG_CONFIG_LIBDIR="$pc_dirs"
    unset PKG_CONFIG_PATH
  else
    export PKG_CONFIG_PATH="$pc_dirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  fi
}

# After a dry-run configure: every cache entry about a carried library must point into the prefix.
check_cache_in_prefix() {
  local cache="$build_dir/CMakeCache.txt" bad=0 others=0 name value required
  [[ -f $cache ]] || {
    echo "no $cache" >&2
    return 1
  }
  for required in yaml-cpp_DIR GTest_DIR pkgcfg_lib_XXHASH_xxhash XXHASH_INCLUDE_DIRS; do
    value=$(grep -E "^$required:[A-Z]+=" "$cache" | head -n 1 | cut -d= -f2-)
    if [[ $value == "$prefix"/* ]]; then
      printf '  ok   %-28s %s\n' "$required" "$value"
    else
      printf '  BAD  %-28s %s (expected under %s)\n' "$required" "${value:-<unset>}" "$prefix"
      bad=1
    fi
  done
  # Any other entry naming one of the libraries (e.g. an optional hiredis tier) with a path value.
  while IFS= read -r line; do
    name=${line%%:*}
    value=${line#*=}
    value=${value%%;*}
    [[ $value == /* ]] || continue
    case $name in yaml-cpp_DIR | GTest_DIR | pkgcfg_lib_XXHASH_xxhash | XXHASH_INCLUDE_DIRS) continue ;; esac
    if [[ $value == "$prefix"/* ]]; then
      others=$((others + 1))
    else
      printf '  BAD  %-28s %s (expected under %s)\n' "$name" "$value" "$prefix"
      bad=1
    fi
  done < <(grep -iE '^[^#/:]*(yaml|xxhash|gtest|gmock|hiredis)[^:]*:[A-Z]+=' "$cache")
  echo "  ok   $others more cache entries naming yaml-cpp/xxhash/gtest/gmock/hiredis, all under the prefix"
  return $bad
}

# ---------------------------------------------------------------------------------------------
# stages

start=$(date +%s)
declare -a stage_names=() stage_results=() stage_seconds=() stage_details=()

remaining() { echo $((budget - ($(date +%s) - start))); }

record() {
  stage_names+=("$1")
  stage_results+=("$2")
  stage_seconds+=("$3")
  stage_details+=("$4")
}

# run_stage NAME TIMEOUT_S CMD...: logs to $logs/NAME.log; sets stage_rc (124 = timed out,
# -1 = not run for lack of budget).
run_stage() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  rm -f "$logs/$name.log"
  stage_time=0
  if ((left < 5)); then
    echo "== $name: not run, the ${budget} s budget is spent"
    stage_rc=-1
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (timeout ${limit} s): $*"
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  stage_rc=$?
  ((stage_rc == 137)) && stage_rc=124
  stage_time=$(($(date +%s) - t0))
  tail -n 15 "$logs/$name.log" | sed 's/^/   | /'
  echo "== $name: exit $stage_rc after ${stage_time} s ($(($(date +%s) - start)) s elapsed)"
}

# result_of RC [PROBLEM]: the table's word for a stage.
result_of() {
  local rc=$1 problem=${2:-}
  if ((rc == -1)); then
    echo "NOT RUN"
  elif ((rc == 124)); then
    echo "TIMEOUT"
  elif ((rc != 0)) || [[ -n $problem ]]; then
    echo "FAIL"
  else
    echo "ok"
  fi
}

count() { grep -cE "$1" "$2" 2>/dev/null || true; }

stage_configure() {
  run_stage configure 60 cmake "${args[@]}"
  record configure "$(result_of $stage_rc)" "$stage_time" "sm_90, deps from $deps_rel"
}

stage_build() {
  run_stage build 200 cmake --build "$build_dir" -j "$jobs" --target hss_gpu_tests hss-bench
  record build "$(result_of $stage_rc)" "$stage_time" "hss_gpu_tests hss-bench, -j $jobs"
}

# How many CUDA devices this machine has (the dry run: the model's, one like the lent machine).
count_gpus() {
  if ((dry)); then
    gpus=1
  else
    gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  fi
  gpus=${gpus:-0}
}

# Tests that need two devices are suites named *TwoDevices; on one GPU they would skip.
two_device_exclusion() {
  gtest_exclude=""
  if ((gpus < 2)); then
    gtest_exclude="*TwoDevices*"
  fi
}

# A gtest filter with the two-device tests taken out when this machine has one GPU.
gtest_filter_for() {
  local filter=$1
  [[ -z $gtest_exclude ]] && { echo "$filter"; return; }
  if [[ $filter == *-* ]]; then echo "$filter:$gtest_exclude"; else echo "$filter-$gtest_exclude"; fi
}

# gtest_count BINARY FILTER: how many tests of BINARY the gtest filter selects (0 when it cannot say).
gtest_count() {
  local n
  n=$(timeout 60 "$1" --gtest_list_tests --gtest_filter="$2" 2>/dev/null | grep -c '^  ' || true)
  echo "${n:-0}"
}

# stage_gpu_tests NAME BINARY LIMIT [VAR=VALUE...]: every test of the tests/gpu binary (the
# two-device suites left out on one GPU) in ONE process, with the environment VAR=VALUE...; a
# skip fails. One process, not one per ctest entry: 80-odd processes each paying for a CUDA
# context and its stores' device state (1 GiB staging, launch slots, kernel warm-up) need more
# than a minute four at a time, and one process runs the timing tests with nothing beside them.
# The tests are written to share a process (the model runs them so, gpu_model.
# one_process_manual_scheduling). A crash or a hang loses the tests after it: the detail names
# the test the run stopped in, and the tests passed before it still count.
stage_gpu_tests() {
  local name=$1 binary=$2 limit=$3
  shift 3
  local filter expected left_out=""
  filter=$(gtest_filter_for "*")
  expected=$(gtest_count "$binary" "$filter")
  run_stage "$name" "$limit" env "$@" "$binary" --gtest_filter="$filter" --gtest_color=no
  local log="$logs/$name.log" passed failed skipped finished stopped="" problem=""
  # One line per finished test: "[       OK ] Suite.Name (12 ms)" (FAILED, SKIPPED likewise).
  passed=$(count '^\[       OK \] .* \([0-9]+ ms\)$' "$log")
  failed=$(count '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$log")
  skipped=$(count '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$log")
  finished=$((${passed:-0} + ${failed:-0} + ${skipped:-0}))
  if ((finished < expected)); then
    stopped=$(sed -nE 's/^\[ RUN      \] (.*)/\1/p' "$log" | tail -n 1)
    problem="stopped"
  fi
  if [[ -n $gtest_exclude ]]; then
    left_out=", $(gtest_count "$binary" "$gtest_exclude") two-device tests left out ($gpus GPU)"
  fi
  gpu_tests_passed=$passed
  gpu_tests_skipped=$skipped
  ((failed > 0)) && problem="failed"
  ((skipped > 0)) && problem="skipped"
  ((expected == 0 || passed == 0)) && problem="no tests"
  record "$name" "$(result_of $stage_rc "$problem")" "$stage_time" \
    "${passed} passed, ${failed} failed, ${skipped} skipped, of ${expected} (one process)${stopped:+, stopped in $stopped}$left_out"
  ((skipped > 0)) && skip_total=$((skip_total + skipped))
}

# memcheck's default: a representative subset of tests/gpu, not all of it. Under the sanitizer
# every CUDA call and kernel is many times slower, and some tests would break or outlast the
# stage: StreamGate holds and host-function sleeps (stream-order tests), wall-clock asserts
# (DeviceHazards.StoreOnAHeldStreamReturnsAtOnce wants < 50 ms), DeviceDifferential (96 stores,
# each with its device state), the 80 MiB StoreLargerThanOneStagingBufferRunsInRounds, and the
# capture tests. These, with none of those, still launch every kernel: stores of each input
# dtype and storage dtype (the staging gather/cast), restores with each implementation (kernel,
# cub, memcpy; padded outputs), device->device round trips of every dtype pair at an odd width
# from a misaligned base, single calls against batches (the batch store and restore kernels
# over odd widths, strides and offsets), every output dtype through the path itself, and a store
# under pool pressure right after device restores.
readonly memcheck_filter="*DeviceStoreDTypes.*:*DeviceRestore.*:*DeviceRoundTrip.*:*DeviceBatch.*\
:DeviceBatchRules.OneLaunchPerStreamAndResultsBitIdenticalToTheHostPathsSingleCalls\
:DeviceHazards.BatchEqualsSingleCallsBitForBit:DeviceHazards.StoreUnderPressureRightAfterADeviceRestore\
:DeviceOrdering.RetrieveWritesEveryOutputDTypeToHostAndDevice:DeviceOrdering.NativeBf16RestoredIntoBf16IsBitIdentical\
:DeviceOrdering.BatchResultsEqualSingleCallsWithOneKeyPassPerTokenList\
:DevicePathContract.RestoreWritesEveryOutputDType"

stage_sanitizer() {
  local tool=$1 filter=$2 limit=$3
  local binary="$build_dir/tests/hss_gpu_tests"
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    record "$tool" FAIL 0 "compute-sanitizer not found"
    return
  fi
  filter=$(gtest_filter_for "$filter")
  # memcheck: --report-api-errors no (a memcheck option; its default, explicit, reports and counts
  # every CUDA API call that returns an error). Such errors are the tests' own business, and some
  # provoke them on purpose (DeviceCapture asks the legacy stream while a blocking stream
  # captures: cudaErrorStreamCaptureImplicit); memcheck counts the memory errors.
  local -a tool_options=()
  [[ $tool == memcheck ]] && tool_options=(--report-api-errors no)
  run_stage "$tool" "$limit" compute-sanitizer --tool "$tool" "${tool_options[@]}" \
    --error-exitcode 86 "$binary" --gtest_filter="$filter" --gtest_brief=0 --gtest_color=no
  local log="$logs/$tool.log" errors ran skipped problem=""
  errors=$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/p' "$log" | tail -n 1)
  ran=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$log" | tail -n 1)
  skipped=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below.*/\1/p' "$log" | tail -n 1)
  skipped=${skipped:-0}
  [[ -z $errors ]] && problem="no error summary"
  [[ -n $errors && $errors != 0 ]] && problem="errors"
  [[ -z $ran || $ran == 0 ]] && problem="no tests ran"
  ((skipped > 0)) && problem="skipped" && skip_total=$((skip_total + skipped))
  # A long filter (memcheck's subset) is in the log's command line, not in the table.
  local shown=$filter
  ((${#shown} > 60)) && shown="gtest filter in logs/$tool.log"
  record "$tool" "$(result_of $stage_rc "$problem")" "$stage_time" \
    "${errors:-?} errors, ${ran:-0} tests, ${skipped} skipped ($shown)"
}

# Figures and GPU skips in a bench JSON: "FIGURES SKIPS".
bench_counts() {
  python3 - "$1" <<'EOF' 2>/dev/null || echo "0 0"
import json, sys
d = json.load(open(sys.argv[1]))
figs = [f for f in d["figures"] if f["workload"].startswith("gpu_")]
skips = [s for s in d["skipped"] if s["workload"].startswith("gpu_")]
print(len(figs), len(skips))
EOF
}

stage_bench() {
  local name=$1 limit=$2
  shift 2
  local json="$out/$name.json"
  run_stage "$name" "$limit" "$build_dir/bench/hss-bench" "$@" --check --json "$json"
  local figures=0 skips=0 problem=""
  [[ -s $json ]] && read -r figures skips < <(bench_counts "$json")
  ((figures == 0)) && problem="no figures"
  ((skips > 0)) && problem="skipped" && skip_total=$((skip_total + skips))
  bench_figures=$((bench_figures + figures))
  record "$name" "$(result_of $stage_rc "$problem")" "$stage_time" \
    "$figures figures, $skips skipped ($*) -> $(basename "$json")"
}

stage_resources() {
  # The bench binary holds every kernel of the library (libhss may be static).
  local binary="$build_dir/bench/hss-bench"
  if ! command -v cuobjdump >/dev/null 2>&1 || [[ ! -x $binary ]]; then
    record resources FAIL 0 "cuobjdump or $binary missing"
    return
  fi
  run_stage resources 15 cuobjdump --dump-resource-usage "$binary"
  # Per hss kernel: registers, stack, local memory (spills land in local memory: expect 0).
  local usage
  usage=$(grep -A1 "Function _ZN3hss" "$logs/resources.log" |
    sed -nE 's/.*(gather_cast_kernel|restore_gather_kernel).*/\1/p; s/.*REG:([0-9]+) STACK:([0-9]+).*LOCAL:([0-9]+).*/REG \1 STACK \2 LOCAL \3/p' |
    paste - - | sort | uniq -c | awk '{$1=$1; print}' | head -n 6 | paste -sd';' -)
  local kernels nonzero
  kernels=$(count 'Function _ZN3hss' "$logs/resources.log")
  nonzero=$(grep -A1 "Function _ZN3hss" "$logs/resources.log" | grep -cE 'STACK:[1-9]|LOCAL:[1-9]' || true)
  record resources "$(result_of $stage_rc)" "$stage_time" \
    "$kernels hss kernels, $nonzero with stack/local memory"
  [[ -n $usage ]] && echo "kernel resource usage (count name REG STACK LOCAL): $usage" >"$logs/resources.summary"
}

stage_python() {
  if [[ ! -f python/CMakeLists.txt ]]; then
    record python "absent" 0 "no python/CMakeLists.txt: no binding to test"
    return
  fi
  local -a py_args=(-DHSS_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
  local nb
  nb=$(python3 -m nanobind --cmake_dir 2>/dev/null || true)
  [[ -n $nb ]] && py_args+=(-Dnanobind_DIR="$nb")
  run_stage python_configure 40 cmake "${args[@]}" "${py_args[@]}"
  record python_configure "$(result_of $stage_rc)" "$stage_time" "HSS_BUILD_PYTHON=ON"
  ((stage_rc == 0)) || return
  # Ninja has one phony target per directory; other generators build everything.
  local -a target=()
  if [[ -f $build_dir/build.ninja ]] && ninja -C "$build_dir" -t query python/all >/dev/null 2>&1; then
    target=(--target python/all)
  fi
  run_stage python_build 60 cmake --build "$build_dir" -j "$jobs" "${target[@]}"
  record python_build "$(result_of $stage_rc)" "$stage_time" "${target[*]:-all targets}"
  ((stage_rc == 0)) || return
  run_stage python_tests 45 env PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m pytest python/tests -m cuda -rs -q
  local log="$logs/python_tests.log" passed skipped problem=""
  passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' "$log" | tail -n 1)
  skipped=$(sed -nE 's/.* ([0-9]+) skipped.*/\1/p' "$log" | tail -n 1)
  [[ -z $passed || $passed == 0 ]] && problem="none passed"
  [[ -n $skipped && $skipped != 0 ]] && problem="skipped" && skip_total=$((skip_total + skipped))
  record python_tests "$(result_of $stage_rc "$problem")" "$stage_time" \
    "${passed:-0} passed, ${skipped:-0} skipped (pytest -m cuda, torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?'))"
}

# The benchmark figures, one line each: median time, GB/s, ratio to each reference.
bench_table() {
  local json
  for json in "$out"/gpu_store.json "$out"/gpu_store_mapped.json "$out"/gpu_retrieve.json \
    "$out"/gpu_small_overlap.json "$out"/gpu_batch.json "$out"/gpu_fp8.json "$out"/gpu_tier.json; do
    [[ -s $json ]] || continue
    python3 - "$json" <<'EOF' 2>/dev/null || echo "  (cannot read $json)"
import json, sys
d = json.load(open(sys.argv[1]))
def t(s):
    return f"{s*1e6:.1f} us" if s < 1e-3 else f"{s*1e3:.2f} ms"
for f in d["figures"]:
    p = f["params"]
    shape = f"c{p['chunk_size']} h{p['hidden_dim']} t{p['tokens']}"
    refs = "; ".join(f"{r['name']} {r['ratio']['median']:.2f}x" for r in f["refs"])
    print(f"  {f['workload'] + '/' + f['name']:<58} {shape:<20} {t(f['seconds']['median']):>10} {f['gbps']:8.2f} GB/s  {refs}")
for s in d["skipped"]:
    print(f"  {s['workload']}/{s['what']}: SKIPPED: {s['reason']}")
EOF
  done
}

# The FP8 target (issue 55): each FP8 device store against the bf16 device store of the same rows,
# per token, on the card named.
fp8_targets() {
  local json="$out/gpu_fp8.json"
  [[ -s $json ]] || return 0
  python3 - "$json" "$smi" <<'EOF' 2>/dev/null || echo "  (cannot read $json)"
import json, sys
d = json.load(open(sys.argv[1]))
for f in d["figures"]:
    if not f["name"].endswith(" store"):
        continue
    for r in f["refs"]:
        if r["name"] == "bf16 device store":
            x = r["ratio"]["median"]
            verdict = "met" if x >= 0.9 else "MISSED"
            print(f"  {f['name']}: {x:.2f}x the bf16 device store (target >= 0.9x: {verdict}) on {sys.argv[2]}")
EOF
}

# The device tier's target (issue 55): the resident restore against a device-to-device
# cudaMemcpyAsync of the same bytes, on the card named.
tier_targets() {
  local json="$out/gpu_tier.json"
  [[ -s $json ]] || return 0
  python3 - "$json" "$smi" <<'EOF' 2>/dev/null || echo "  (cannot read $json)"
import json, sys
d = json.load(open(sys.argv[1]))
for f in d["figures"]:
    if f["name"] != "resident restore":
        continue
    for r in f["refs"]:
        if r["name"].startswith("cudaMemcpyAsync D2D"):
            x = r["ratio"]["median"]
            verdict = "met" if x >= 0.8 else "MISSED"
            print(f"  {f['name']}: {x:.2f}x a D2D cudaMemcpyAsync (target >= 0.8x: {verdict}) on {sys.argv[2]}")
EOF
}

# The dry run's check that every dependency came from the prepared folder (configure only).
dry_configure() {
  echo "== dry run: configure against $prefix only (system copies hidden)"
  mkdir -p "$build_dir" || die "cannot create $build_dir"
  rm -f "$build_dir/CMakeCache.txt"
  local log="$build_dir/gpu-check-configure.log" t0
  t0=$(date +%s)
  if ! cmake "${args[@]}" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "gpu_check --dry-run: FAILED: configure against the prepared folder failed ($log)"
    return 1
  fi
  grep -E "^-- (hsstore|Found|Checking for module)" "$log" | sed 's/^/   | /'
  echo "== configured in $(($(date +%s) - t0)) s; dependencies in CMakeCache.txt:"
  if ! check_cache_in_prefix; then
    echo "gpu_check --dry-run: FAILED: a dependency was found outside the prepared prefix"
    return 1
  fi
  echo "== the CUDA build configures against $deps_rel only"
}

# The dry run's stages: tests/gpu built against the CUDA runtime model (the same prefix, system
# copies still hidden) and run with one model device, through the GPU run's test stage.
dry_model_stages() {
  local model_dir="$build_dir-model"
  local -a model_args=("${args[@]}")
  model_args[3]="$model_dir"  # after -B
  model_args+=(-DHSS_CUDA_MODEL=ON -DHSS_CUDA_MODEL_TEST_DEVICES=1 -DHSS_BUILD_TOOLS=OFF)
  rm -f "$model_dir/CMakeCache.txt"
  run_stage model_configure 120 cmake "${model_args[@]}"
  record model_configure "$(result_of $stage_rc)" "$stage_time" "HSS_CUDA_MODEL=ON, deps from $deps_rel"
  ((stage_rc == 0)) || return
  run_stage model_build 900 cmake --build "$model_dir" -j "$jobs" --target hss_gpu_tests
  record model_build "$(result_of $stage_rc)" "$stage_time" "hss_gpu_tests against the model, -j $jobs"
  ((stage_rc == 0)) || return
  # The model's environment as ctest gives it (tests/CMakeLists.txt), with one device.
  stage_gpu_tests gpu_tests_model "$model_dir/tests/hss_gpu_tests" 600 \
    HSS_CUDA_MODEL_DEVICES=1 HSS_CUDA_MODEL_WATCHDOG_S=30 HSS_LOG_LEVEL=warn
}

print_summary() {
  local title=$1
  {
    echo
    if ((!dry)); then
      echo "== GPU benchmark figures (this run on $smi; ratio = hsstore throughput / reference, same run)"
      bench_table
      fp8_targets
      tier_targets
      [[ -s $logs/resources.summary ]] && cat "$logs/resources.summary"
      echo
    fi
    echo "== gpu_check$title: $(date -u '+%Y-%m-%d %H:%M UTC'), device: $smi"
    printf '  %-17s %-8s %6s  %s\n' stage result seconds detail
    local i
    for i in "${!stage_names[@]}"; do
      printf '  %-17s %-8s %6s  %s\n' "${stage_names[$i]}" "${stage_results[$i]}" \
        "${stage_seconds[$i]}" "${stage_details[$i]}"
    done
    echo "  total $(($(date +%s) - start)) s (budget $budget s); logs and table in $out"
    if ((verdict == 0)); then
      echo "gpu_check$title: PASS${not_run:+ ($not_run)}"
    else
      local IFS=';'
      echo "gpu_check$title: FAIL (${why[*]})"
    fi
  } | tee "$out/summary.txt"
}

# Sets verdict and why from the stages: a failure or timeout fails; NOT RUN (the budget ran out
# first) is reported, not a failure.
judge() {
  verdict=0
  why=()
  not_run=""
  local i n=0
  for i in "${!stage_results[@]}"; do
    case ${stage_results[$i]} in
      ok | absent) ;;
      "NOT RUN") n=$((n + 1)) ;;
      *)
        verdict=1
        why+=("${stage_names[$i]} ${stage_results[$i]}")
        ;;
    esac
  done
  ((n > 0)) && not_run="$n stages not run: the budget was spent"
  ((skip_total > 0)) && verdict=1 && why+=("$skip_total skipped")
}

cmd_run() {
  dry=$1
  local deps=$2
  build_dir=${build_dir_opt:-$repo/$([[ $dry == 1 ]] && echo build-gpu-dry || echo build-gpu)}
  [[ $build_dir == /* ]] || build_dir="$repo/$build_dir"
  deps_rel=${deps#"$repo"/}
  find_cuda_tools
  setup_prefix "$deps" "$build_dir"
  configure_args "$dry"
  if ((dry)); then
    dry_configure || return 1
  fi

  budget=${HSS_GPU_CHECK_BUDGET_S:-480}
  ((dry)) && budget=${HSS_GPU_CHECK_BUDGET_S:-1500}  # here: 2 shared cores build the model tree
  out=${OUT:-$build_dir/gpu-check-out}
  mkdir -p "$out" "$build_dir" || die "cannot create $out"
  logs="$out/logs"
  mkdir -p "$logs"
  # Everything printed from here on also lands in $out/gpu_check.log.
  exec 3>&1 4>&2
  exec > >(tee "$out/gpu_check.log") 2>&1
  local tee_pid=$!
  jobs=$(nproc 2>/dev/null || echo 16)
  skip_total=0 bench_figures=0 gpu_tests_passed=0 gpu_tests_skipped=0
  # The VM's memory grows as it is used: its MemAvailable at start is no limit for the pools.
  export HSS_POOL_MEMORY_CHECK=0
  count_gpus
  two_device_exclusion
  local mode=run
  ((dry)) && mode="run --dry-run"
  echo "gpu_check $mode: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $jobs cores, $gpus GPU(s), budget ${budget} s, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

  if ((dry)); then
    smi="the CUDA runtime model, one device (no GPU here)"
    dry_model_stages
    judge
    ((gpu_tests_passed == 0)) && verdict=1 && why+=("no tests/gpu test passed on the model")
    print_summary " --dry-run"
    exec 1>&3 2>&4 3>&- 4>&-
    wait "$tee_pid" 2>/dev/null
    return $verdict
  fi

  smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>&1) || smi="nvidia-smi failed: $smi"
  echo "device: $smi"

  # The most important figures first: tests, store and restore against cudaMemcpyAsync, batch
  # launches; then the sanitizers and the rest, as far as the budget goes.
  stage_configure
  if [[ ${stage_results[-1]} == ok ]]; then
    stage_build
  fi
  if [[ ${stage_results[-1]} == ok ]]; then
    stage_gpu_tests gpu_tests "$build_dir/tests/hss_gpu_tests" 120
    stage_bench gpu_store 45 gpu_store
    stage_bench gpu_retrieve 45 gpu_retrieve
    if "$build_dir/bench/hss-bench" --help 2>/dev/null | grep -q '^  gpu_batch:'; then
      stage_bench gpu_batch 30 gpu_batch
    else
      record gpu_batch absent 0 "hss-bench has no gpu_batch workload yet"
    fi
    stage_bench gpu_fp8 30 gpu_fp8
    if "$build_dir/bench/hss-bench" --help 2>/dev/null | grep -q '^  gpu_tier:'; then
      stage_bench gpu_tier 30 gpu_tier
    else
      record gpu_tier absent 0 "hss-bench has no gpu_tier workload"
    fi
    stage_sanitizer memcheck "${HSS_GPU_MEMCHECK_FILTER:-$memcheck_filter}" 90
    stage_bench gpu_store_mapped 25 gpu_store_mapped
    stage_bench gpu_small_overlap 30 gpu_small gpu_overlap
    local sfilter=${HSS_GPU_SANITIZE_FILTER:-*DeviceStoreDTypes*:*DeviceRestore*}
    stage_sanitizer racecheck "$sfilter" 30
    stage_sanitizer synccheck "$sfilter" 30
    stage_resources
    stage_python
  fi

  judge
  # A device was used when a GPU figure was measured, or the GPU tests ran and none skipped.
  if ((bench_figures == 0 && (gpu_tests_passed == 0 || gpu_tests_skipped > 0))); then
    verdict=1
    why+=("no CUDA device was used")
  fi
  print_summary ""
  # Let tee finish writing the log before the caller collects $out.
  exec 1>&3 2>&4 3>&- 4>&-
  wait "$tee_pid" 2>/dev/null
  return $verdict
}

# ---------------------------------------------------------------------------------------------

main() {
  local cmd=${1:-}
  [[ -n $cmd ]] || usage 2
  shift
  deps="$repo/.gpu-deps"
  dry_run=0
  build_dir_opt=""
  case $cmd in
    -h | --help | help) usage 0 ;;
    selftest)
      # ctest: prepare into WORKDIR/deps, then the dry run with its build in WORKDIR/build.
      work=${1:?selftest needs a work directory}
      command -v apt-get >/dev/null 2>&1 || {
        echo "gpu_check selftest: SKIPPED: no apt-get on this machine"
        exit 77
      }
      mkdir -p "$work" || die "cannot create $work"
      work=$(cd "$work" && pwd)
      (cmd_prepare "$work/deps") || exit 1
      build_dir_opt="$work/build"
      cmd_run 1 "$work/deps"
      exit $?
      ;;
    prepare | run) ;;
    *) usage 2 ;;
  esac
  while (($# > 0)); do
    case $1 in
      --deps) deps=${2:?--deps needs a directory}; shift ;;
      --build-dir) build_dir_opt=${2:?--build-dir needs a directory}; shift ;;
      --dry-run) dry_run=1 ;;
      -h | --help) usage 0 ;;
      *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
  done
  [[ $deps == /* ]] || deps="$repo/$deps"
  if [[ $cmd == prepare ]]; then
    cmd_prepare "$deps"
  else
    cmd_run "$dry_run" "$deps"
  fi
}

# One line, parsed whole before it runs: editing this file during a run cannot change the run.
main "$@"; exit $?
