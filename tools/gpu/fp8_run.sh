#!/usr/bin/env bash
# On the GPU machine, from the folder tools/gpu/fp8_prepare.sh fills (fp8-test, spindle with
# CUDA, fp8_checkpoint, xz-compressed): the FP8 GPU tests (crates/cuda/tests/fp8.rs) on the
# repository's fixtures, then the FP8 targets of issue 18: an 8-layer 35B-A3B synth
# (--zero-experts: sparse expert files) in bf16, its block-FP8 form ([128, 128] blocks, made by
# fp8_checkpoint), and `spindle bench --device cuda` of bf16, FP8 (as stored) and q4, medians
# of 3 runs, then bf16 and FP8 loaded with 4 of the 8 layers (the per-layer cost). PART=tests|bench|all (default all). Logs in $OUT.
set -u
here=$(pwd)
export SPINDLE_FIXTURES=${SPINDLE_FIXTURES:-$(cd .. && pwd)/fixtures}
export SPINDLE_CUDA_PTX_CACHE=/tmp/spindle-ptx
mkdir -p "$SPINDLE_CUDA_PTX_CACHE" "${OUT:=/tmp/out}"
for f in *.xz; do [ -f "$f" ] && xz -d -f -T0 "$f"; done
chmod +x fp8-test spindle fp8_checkpoint 2>/dev/null
el() { echo "== $(date +%T) $*"; }
part=${PART:-all}
if [ "$part" = tests ] || [ "$part" = all ]; then
  el "fp8 GPU tests"
  timeout ${TEST_S:-150} ./fp8-test --ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.log" | grep -E "^(test |fp8|qwen|thread|  left|  right|test result)|max\|Δ|KL|rel err|panicked" | cut -c1-400
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  W=/tmp/fp8-bench
  rm -rf "$W"; mkdir -p "$W"
  el "synth 35B-A3B, 8 layers, zero experts"
  ./spindle synth --shape qwen3.6-35b-a3b --layers 8 --zero-experts --no-vision --out "$W/bf16" > /dev/null 2> "$W/synth.err" || tail -3 "$W/synth.err"
  el "fp8_checkpoint [128, 128]"
  ./fp8_checkpoint "$W/bf16" "$W/fp8" - 128 128 || exit 1
  du -sh --apparent-size "$W/bf16" "$W/fp8"; du -sh "$W/bf16" "$W/fp8"
  # The 4-layer loads of the same checkpoints give the per-layer cost (the LM head, bf16 in
  # FP8 releases too, is a large share of an 8-layer step).
  for run in "bf16 --quant bf16" "fp8" "bf16_l4 --quant bf16 --layers 4" "fp8_l4 --layers 4" "q4 --quant q4"; do
    set -- $run
    name=$1; shift
    model=$W/bf16; case $name in fp8*) model=$W/fp8;; esac
    el "bench $name"
    RUST_LOG=warn timeout ${BENCH_S:-90} ./spindle bench --device cuda --json --model "$model" "$@" \
      --prompt 2048 --gen 128 --runs 3 --probe-mib 256 > "$W/bench.json" 2> "$W/bench.err"
    echo "{\"run\": \"$name\", \"result\": $(cat "$W/bench.json" || echo null)}" | tee -a "$OUT/bench.jsonl"
    (echo "== $name"; cat "$W/bench.err") >> "$OUT/bench.err"; tail -2 "$W/bench.err"
  done
  el done
fi
