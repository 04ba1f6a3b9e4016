#!/bin/bash
# Final device run (from the prepare.sh folder): every GPU test, CLI run/serve on CUDA, and
# the full-size benches of the README. PART=tests|a3b|27b|all (default all) picks a part.
# Paths (logs, scratch, CUDA) come from env.sh.
cd "$(dirname "$0")"
source ./env.sh
PART=${PART:-all}
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
if [ $PART = tests ] || [ $PART = all ]; then
  el "GPU tests"; bash run_tests.sh
  el "CLI on CUDA"; timeout 120 ./cli-cuda.sh 2>&1 | tail -8
fi
B="$WORK/models"; mkdir -p "$B"
bench() { # name extra...
  local name=$1; shift
  el "bench $name: $*"
  RUST_LOG=warn timeout ${BT:-200} ./spindle bench --device cuda --json "$@" > "$WORK/b.json" 2> "$WORK/b.err"
  echo "rc=$? $(python3 -c "
import json;d=json.load(open('$WORK/b.json'));print('prefill',d['prefill'],'decode',[(c['context'],c['decode'],round(c['roofline_fraction'],3)) for c in d['decode_by_context']],'wbytes',d['weight_bytes_per_token'],'bw',round(d['measured_bandwidth_bytes_per_s']/1e12,3),'rss',d['peak_rss_bytes'])" 2>&1 | tail -1)"
  tail -3 "$WORK/b.err" | cut -c1-200
  (echo "== $name"; cat "$WORK/b.json") >> "$OUT/bench.jsonl"; (echo "== $name"; cat "$WORK/b.err") >> "$OUT/bench.err"
}
if [ $PART = a3b ] || [ $PART = all ]; then
  el "synth a3b 40 layers, zero experts"
  timeout 200 ./spindle synth --shape qwen3.6-35b-a3b --zero-experts --out "$B/a3b" > /dev/null 2> "$WORK/s.err"; tail -1 "$WORK/s.err"
  bench a3b40_q4 --model "$B/a3b" --quant q4 --prompt 2048 --context 512,8192 --gen 128 --runs 3
  bench a3b40_bf16 --model "$B/a3b" --quant bf16 --prompt 2048 --context 512,8192 --gen 128 --runs 3
  SPINDLE_CUDA_TENSOR_CORES=0 bench a3b40_q4_simt --model "$B/a3b" --quant q4 --prompt 2048 --context 512 --gen 16 --runs 3
  SPINDLE_CUDA_PROFILE=1 bench a3b40_q4_profile --model "$B/a3b" --quant q4 --prompt 2048 --context 512 --gen 8 --runs 1
  grep -A12 "kernel time per prefill" "$WORK/b.err"
  rm -rf "$B/a3b"
fi
if [ $PART = 27b ] || [ $PART = all ]; then
  el "synth 27b 64 layers"
  timeout 200 ./spindle synth --shape qwen3.6-27b --out "$B/d27" > /dev/null 2> "$WORK/s.err"; tail -1 "$WORK/s.err"; df -h "$WORK" | tail -1
  BT=300 bench d27_64_q4 --model "$B/d27" --quant q4 --prompt 2048 --context 512,8192 --gen 64 --runs 3
  SPINDLE_CUDA_TENSOR_CORES=0 bench d27_64_q4_simt --model "$B/d27" --quant q4 --prompt 2048 --context 512 --gen 8 --runs 1
fi
el done
