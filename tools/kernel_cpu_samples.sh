#!/bin/bash
# CPU time a decode spends in the matmul kernels, as perf samples (999 Hz, all threads): on a
# shared machine the wall clock shows the other jobs, while a process's own samples of a kernel
# move by a few percent between runs. Needs `perf` (cpu-clock is enough: no hardware counters).
#
#   tools/kernel_cpu_samples.sh LABEL MODEL SPINDLE [ENV=VALUE...]
#
# runs `SPINDLE bench --model MODEL --experts resident --prompt 16 --gen 256 --runs 1` and
# prints its decode tok/s and the samples of the Q8/Q4 decode kernels (the per-row `dot_q4` of
# 88c09aa, or the int8 panel kernels).
set -euo pipefail
label=$1 model=$2 bin=$3
shift 3
data=$(mktemp /tmp/kernel-samples.XXXXXX)
trap 'rm -f "$data"' EXIT
decode=$(env "$@" perf record -q -F 999 -o "$data" "$bin" bench --model "$model" \
    --experts resident --prompt 16 --gen 256 --runs 1 2>&1 | awk '/^decode /{print $2}')
samples=$(perf report -i "$data" -n --no-children --sort symbol 2>/dev/null |
    awk '/avx512::dot_q4$|avx512::dot_q4 |q_panel_direct|gemm_q_panel/ {s += $2} END {print s}')
echo "$label load=$(cut -d' ' -f1 /proc/loadavg) decode=${decode} tok/s kernel_samples=${samples}"
