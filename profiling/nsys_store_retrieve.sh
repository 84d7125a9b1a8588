#!/usr/bin/env bash
# Profiles the store/retrieve benchmarks with Nsight Systems: CUDA API, kernels, memcpys and the
# NVTX ranges of domain "hss". Reading the timeline: profiling/README.md.
#
#   profiling/nsys_store_retrieve.sh [BUILD_DIR] [WORKLOAD...]
#
# BUILD_DIR defaults to build-gpu (cmake --preset gpu); workloads default to
# "gpu_store gpu_retrieve" (--quick). Output: $OUT_DIR/hss_store_retrieve.nsys-rep plus a text
# summary (nvtx, kernel and memcpy statistics) next to it. OUT_DIR defaults to $OUT or ./gpu-out.
# Without nsys it says so and exits 0 (nothing profiled).
set -uo pipefail

build_dir=${1:-build-gpu}
shift || true
workloads=("$@")
[[ ${#workloads[@]} -eq 0 ]] && workloads=(gpu_store gpu_retrieve)
out_dir=${OUT_DIR:-${OUT:-./gpu-out}}

# nsys first: without it there is nothing this script can do, and that is not an error of the
# build (the GPU machines lent to this project have ncu but no nsys; profiling/README.md has an
# ncu recipe for the two kernels).
nsys_bin=$(command -v nsys || true)
if [[ -z $nsys_bin ]]; then
  for candidate in /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems-*/bin/nsys; do
    [[ -x $candidate ]] && nsys_bin=$candidate && break
  done
fi
if [[ -z $nsys_bin ]]; then
  echo "nsys_store_retrieve.sh: this profile needs Nsight Systems (nsys), which is not installed on"
  echo "this machine (not on PATH, not in /usr/local/cuda/bin or /opt/nvidia/nsight-systems)."
  echo "Nothing was profiled. Install Nsight Systems to get the timeline; the kernels alone can be"
  echo "profiled with ncu (profiling/README.md, 'Kernels with ncu')."
  exit 0
fi

bench="$build_dir/bench/hss-bench"
if [[ ! -x $bench ]]; then
  echo "no $bench: configure and build first (cmake --preset gpu && cmake --build build-gpu)" >&2
  exit 2
fi

mkdir -p "$out_dir"
report="$out_dir/hss_store_retrieve"
# --cuda-memory-usage shows the staging buffers; osrt would add noise from the bench's threads.
"$nsys_bin" profile \
  --trace=cuda,nvtx \
  --cuda-memory-usage=true \
  --force-overwrite=true \
  --output="$report" \
  "$bench" "${workloads[@]}" --quick
rc=$?
echo "nsys profile exit code: $rc"
[[ $rc -ne 0 ]] && exit $rc

"$nsys_bin" stats --force-export=true \
  --report nvtx_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum \
  "$report.nsys-rep" | tee "$report.summary.txt"
echo "timeline: $report.nsys-rep (open in nsys-ui); summary: $report.summary.txt"
