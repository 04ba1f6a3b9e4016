#!/bin/bash
# Prefill (and a short decode) with the tensor-core GEMMs against the SIMT GEMMs
# (SPINDLE_CUDA_TENSOR_CORES=0), side by side in one run, on synth models of the real shapes.
# Usage (from the prepare.sh folder): bash bench_prefill.sh [a3b|27b|both]
# Paths (logs, scratch, CUDA) come from env.sh.
cd "$(dirname "$0")"
source ./env.sh
B="$WORK/models"; mkdir -p "$B"
one() { # label env model quant
  local label=$1 envv=$2 model=$3 quant=$4
  env $envv RUST_LOG=warn timeout ${BT:-240} ./spindle bench --device cuda --json --model "$model" --quant $quant \
    --prompt ${PROMPT:-2048} --context 512 --gen ${GEN:-32} --runs ${RUNS:-2} > "$WORK/b.json" 2> "$WORK/b.err"
  echo "$label $quant rc=$? $(python3 -c "
import json;d=json.load(open('$WORK/b.json'));print('prefill tok/s',d['prefill'],'decode',[(c['context'],c['decode']) for c in d['decode_by_context']])" 2>&1 | tail -1)"
  (echo "== $label $quant"; cat "$WORK/b.json") >> "$OUT/bench_prefill.jsonl"
}
pair() { # model quant
  one "tensor-cores" "SPINDLE_CUDA_TENSOR_CORES=1" $1 $2
  one "simt        " "SPINDLE_CUDA_TENSOR_CORES=0" $1 $2
}
which=${1:-a3b}
if [ "$which" != 27b ]; then
  [ -d "$B/a3b" ] || timeout 200 ./spindle synth --shape qwen3.6-35b-a3b --zero-experts --out "$B/a3b" > /dev/null 2>&1
  pair "$B/a3b" q4; pair "$B/a3b" bf16
fi
if [ "$which" != a3b ]; then
  [ -d "$B/d27" ] || timeout 200 ./spindle synth --shape qwen3.6-27b --out "$B/d27" > /dev/null 2>&1
  pair "$B/d27" q4
fi
