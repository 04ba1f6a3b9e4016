#!/bin/bash
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=/tmp/m; mkdir -p $B
timeout 120 ./spindle synth --shape qwen3.6-35b-a3b --layers 8 --zero-experts --out $B/a3b > /dev/null 2>&1
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
echo "ncu: $NCU"
SPINDLE_CUDA_NO_GRAPHS=1 timeout 400 $NCU --clock-control none --kernel-name regex:"gdn_step|dmoe_down_q4|dmoe_gate_up_q4|dmv_q4_t1|dmv_bf16_t1" --launch-skip 150 --launch-count 10 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis ./spindle bench --device cuda --model $B/a3b --quant q4 --prompt 16 --context 64 --gen 16 --runs 1 > $OUT/ncu.txt 2>&1
echo "rc=$?"
grep -E "^  [a-z_0-9]+\(|dmv|dmoe|gdn_step|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Dynamic Shared|Grid Size|L2 Hit|OPT|Stall|stall" $OUT/ncu.txt | grep -v "^\s*$" | cut -c1-170 | head -150
