#!/usr/bin/env bash
# The device check: configure for sm_90, build, run the `gpu` tests and the GPU benchmarks, print
# ptxas resource usage of the kernels and a short table last. Budget: under 8 minutes on a
# 16-core machine with one H200 (each stage has its own timeout, capped so the stages together
# stay under 420 s; nvidia-smi and the summary add seconds).
#
#   bench/gpu_check.sh            # from the repository root
#
# Output directory: $OUT_DIR, else $OUT, else ./gpu-out (gpu.json, one log per stage).
set -uo pipefail

cd "$(dirname "$0")/.."
out_dir=${OUT_DIR:-${OUT:-./gpu-out}}
mkdir -p "$out_dir"
start=$(date +%s)
total_budget=420
declare -a stage_names=() stage_codes=()

remaining() { echo $((total_budget - ($(date +%s) - start))); }

# run_stage NAME TIMEOUT_S CMD...: runs with a timeout capped by what is left of the budget,
# logs to $out_dir/NAME.log, records the exit code.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  if ((left < 10)); then
    echo "== $name: skipped, total time budget spent"
    stage_names+=("$name")
    stage_codes+=("skipped")
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$out_dir/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out_dir/$name.log"
  echo "== $name: exit code $rc ($(($(date +%s) - start)) s elapsed)"
  stage_names+=("$name")
  stage_codes+=("$rc")
  return 0
}

nproc_use=$(nproc 2>/dev/null || echo 16)

# CMake < 3.26 does not know nvcc's C++20 flag (CMAKE_CUDA_STANDARD 20 fails to configure);
# defining it is harmless where CMake knows it.
run_stage configure 90 cmake --preset gpu \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
run_stage build 240 cmake --build build-gpu -j "$nproc_use" --target hss_gpu_tests hss-bench
run_stage gpu_tests 90 ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 60
run_stage gpu_bench 120 build-gpu/bench/hss-bench gpu_store gpu_retrieve --json "$out_dir/gpu.json"

# ptxas resource usage of the hot kernels (sm_90): spills and local memory must be 0.
ptxas_log="$out_dir/ptxas.log"
run_stage ptxas 90 bash -c '
  for cu in kernels/*.cu; do
    nvcc -std=c++20 --expt-relaxed-constexpr -O3 -Iinclude -Isrc -Ikernels -arch=sm_90 \
      -Xptxas -v -c "$cu" -o /dev/null || exit 1
  done'

echo
echo "== nvidia-smi"
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 || echo "nvidia-smi unavailable"
echo
echo "== ptxas -v (sm_90), hsstore kernels"
grep -A3 "Compiling entry function '_ZN3hss" "$ptxas_log" |
  grep -E "entry function|spill|Used" |
  sed -E "s/Compiling entry function '[^']*(gather_cast_kernel|restore_gather_kernel)(ILNS0_8ElemTypeE([0-9])ELS3_([0-9])E)?[^']*'/\1<\3,\4>/"
echo "spill/lmem lines that are not zero (expect none):"
grep -A3 "Compiling entry function '_ZN3hss" "$ptxas_log" |
  grep -E "spill|lmem|stack frame" |
  grep -vE "^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads$" || echo "  none"

echo
echo "== stages"
for i in "${!stage_names[@]}"; do printf "  %-10s %s\n" "${stage_names[$i]}" "${stage_codes[$i]}"; done
echo "  total      $(($(date +%s) - start)) s"
echo
echo "== GPU benchmark table (measured in this run; $out_dir/gpu.json)"
if [[ -s $out_dir/gpu_bench.log ]]; then
  # The bench prints its table last; show everything from its header on.
  awk '/^hss-bench /{p=1} p' "$out_dir/gpu_bench.log"
else
  echo "  no benchmark output (see the stage codes above)"
fi

for code in "${stage_codes[@]}"; do
  [[ $code != 0 ]] && exit 1
done
exit 0
