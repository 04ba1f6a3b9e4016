#!/bin/bash
# Nsight Compute on the decode kernels of an 8-layer 35B-A3B q4 synth (paths: env.sh; NCU the
# profiler, default: ncu on PATH, under CUDA_HOME, or in an Nsight Compute install).
cd "$(dirname "$0")"
source ./env.sh
B="$WORK/models"; mkdir -p "$B"
timeout 120 ./spindle synth --shape qwen3.6-35b-a3b --layers 8 --zero-experts --out "$B/a3b" > /dev/null 2>&1
if [ -z "${NCU:-}" ]; then
  NCU=$(command -v ncu 2>/dev/null || ls "${CUDA_HOME:-/nonexistent}"/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
fi
NCU=${NCU:-ncu}
echo "ncu: $NCU"
SPINDLE_CUDA_NO_GRAPHS=1 timeout 400 "$NCU" --clock-control none --kernel-name regex:"gdn_decode_heads|decode_moe_down_q4|decode_moe_gate_up_q4|decode_matvec_q4_t1|decode_matvec_bf16_t1" --launch-skip 150 --launch-count 10 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis ./spindle bench --device cuda --model "$B/a3b" --quant q4 --prompt 16 --context 64 --gen 16 --runs 1 > "$OUT/ncu.txt" 2>&1
echo "rc=$?"
grep -E "^  [a-z_0-9]+\(|decode_matvec|decode_moe|gdn_decode_heads|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Dynamic Shared|Grid Size|L2 Hit|OPT|Stall|stall" "$OUT/ncu.txt" | grep -v "^\s*$" | cut -c1-170 | head -150
