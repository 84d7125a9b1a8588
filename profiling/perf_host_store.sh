#!/usr/bin/env bash
# Where a host store's time goes (issue 22): perf samples (cpu-clock: VMs often expose no hardware
# counters) of hss-store-loop storing 16K x 4096 float32 rows, then the share of the samples in
# the copy loops against everything else hsstore does per store (keys, plan, index, segments,
# publish), and the same for the retrieve. Callgrind instruction counts, which a loaded machine
# does not disturb, with CALLGRIND=1.
#
#   profiling/perf_host_store.sh [BUILD_DIR] [ITERATIONS]
#
# BUILD_DIR defaults to build-host (cmake --preset host && cmake --build build-host
# --target hss-store-loop). Output under $OUT_DIR (default ./perf-out).
set -euo pipefail
build_dir=${1:-build-host}
iterations=${2:-30}
out_dir=${OUT_DIR:-./perf-out}
loop="$build_dir/bench/hss-store-loop"
[[ -x $loop ]] || { echo "no $loop: cmake --build $build_dir --target hss-store-loop" >&2; exit 2; }
command -v perf > /dev/null || { echo "perf is not installed (linux-perf)" >&2; exit 2; }
mkdir -p "$out_dir"
for mode in store retrieve; do
  data="$out_dir/$mode.perf.data"
  perf record -q -e cpu-clock -F 4000 -o "$data" -- "$loop" "$mode" "$iterations"
  report="$out_dir/$mode.txt"
  perf report -i "$data" --no-children --sort dso,symbol --stdio 2> /dev/null | grep '%' > "$report"
  # Copy loops: ours (host_copy.cpp) and glibc's memcpy; setup (page faults, memset of the
  # inputs) is in the kernel and libc's memset; the rest of the loop binary is hsstore's own work.
  awk -v mode="$mode" '
    { pct = $1; sub("%", "", pct); line = $0 }
    line ~ /stream_copy_|widen_|__memmove|__memcpy/ { copy += pct; next }
    line ~ /hss-store-loop/ && line ~ /hss::/ { own += pct; next }
    { other += pct }
    END { printf "%s: copy loops %.2f%%, hsstore bookkeeping %.2f%%, setup and the rest %.2f%% ", mode, copy, own, other;
          printf "(bookkeeping / copy = %.2f%%)\n", (copy > 0 ? 100 * own / copy : 0) }' "$report"
done
if [[ ${CALLGRIND:-0} == 1 ]] && command -v valgrind > /dev/null; then
  # Streaming forced so the copy is our loop (calibration under valgrind means nothing).
  HSS_STREAM_THRESHOLD_KB=8192 valgrind --tool=callgrind --callgrind-out-file="$out_dir/store.callgrind" \
    --toggle-collect='hss::HiddenStateStore::store_hidden_states*' "$loop" store 3 > /dev/null 2>&1
  callgrind_annotate "$out_dir/store.callgrind" 2> /dev/null | sed -n '/file:function/,$p' | head -15
fi
