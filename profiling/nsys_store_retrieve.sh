#!/usr/bin/env bash
# Profiles the store/retrieve benchmarks with Nsight Systems: CUDA API, kernels, memcpys and the
# NVTX ranges of domain "hss". Reading the timeline: profiling/README.md.
#
#   profiling/nsys_store_retrieve.sh [BUILD_DIR] [WORKLOAD...]
#
# BUILD_DIR defaults to build-gpu (cmake --preset gpu); workloads default to
# "gpu_store gpu_retrieve" (--quick). Output: $OUT_DIR/hss_store_retrieve.nsys-rep plus a text
# summary (nvtx, kernel and memcpy statistics) next to it. OUT_DIR defaults to $OUT or ./gpu-out.
set -uo pipefail

build_dir=${1:-build-gpu}
shift || true
workloads=("$@")
[[ ${#workloads[@]} -eq 0 ]] && workloads=(gpu_store gpu_retrieve)
out_dir=${OUT_DIR:-${OUT:-./gpu-out}}
mkdir -p "$out_dir"

bench="$build_dir/bench/hss-bench"
if [[ ! -x $bench ]]; then
  echo "no $bench: configure and build first (cmake --preset gpu && cmake --build build-gpu)" >&2
  exit 2
fi
if ! command -v nsys >/dev/null 2>&1; then
  echo "nsys (Nsight Systems) is not on PATH; install it or add /usr/local/cuda/bin" >&2
  exit 2
fi

report="$out_dir/hss_store_retrieve"
# --cuda-memory-usage shows the staging buffers; osrt would add noise from the bench's threads.
nsys profile \
  --trace=cuda,nvtx \
  --cuda-memory-usage=true \
  --force-overwrite=true \
  --output="$report" \
  "$bench" "${workloads[@]}" --quick
rc=$?
echo "nsys profile exit code: $rc"
[[ $rc -ne 0 ]] && exit $rc

nsys stats --force-export=true \
  --report nvtx_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum \
  "$report.nsys-rep" | tee "$report.summary.txt"
echo "timeline: $report.nsys-rep (open in nsys-ui); summary: $report.summary.txt"
