#!/usr/bin/env bash
# On the GPU machine, from the folder kq_prepare.sh filled (issue 18: GGUF K-quants on CUDA),
# in one run:
#   1. in the background, a LAYERS-layer (default 8) 35B-A3B synth (`--zero-experts`) and its
#      GGUF with random blocks in Q4_K_M's types (`gguf_from_fixture.py --random-q4-k-m`);
#   2. the GPU tests $TESTS (default: gguf, and fixtures' quantized-weights test), logs in $OUT;
#   3. `spindle bench --device cuda` on that GGUF as stored (Q4_K / Q6_K blocks) and re-encoded
#      with `--quant q4` (the same values), prefill 2k, decode at 512, medians of RUNS (3).
cd "$(dirname "$0")"
export SPINDLE_FIXTURES=$PWD/fixtures SPINDLE_CUDA_PTX_CACHE=/tmp/spindle-ptx
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/kqwork}
mkdir -p "$SPINDLE_CUDA_PTX_CACHE" "$OUT" "$WORK"
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
for f in *.xz; do [ -f "$f" ] && xz -d -f -T0 "$f"; done
chmod +x ./*-test spindle
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site gguf-*.whl
( ./spindle synth --shape qwen3.6-35b-a3b --layers "${LAYERS:-8}" --zero-experts --no-vision --out "$WORK/a3b" &&
  PYTHONPATH=/tmp/site python3 gguf_from_fixture.py "$WORK/a3b" "$WORK/a3b.gguf" --random-q4-k-m
  echo "[t=$(( $(date +%s) - T0 ))s] gguf rc=$?" ) > "$OUT/make.log" 2>&1 &
make=$!
for t in ${TESTS:-gguf fixtures:quantized_weights_match_cpu_engine}; do
  name=${t%%:*}; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
  el "== $t"
  timeout "${TT:-200}" ./$name-test $filter --include-ignored --test-threads=1 --nocapture > "$OUT/$name.log" 2>&1
  echo "rc=$?"
  grep -E "test result|panicked|FAILED|worst|vs CPU|graphs vs|GPU vs CPU" "$OUT/$name.log" | cut -c1-400 | head -40
done
wait $make
tail -2 "$OUT/make.log"
ls -la "$WORK"
for q in blocks bf16 q4; do
  el "== bench $q"
  args=(); [ "$q" = q4 ] && args=(--quant q4)
  # Without --quant the engine keeps the blocks only when bf16 would not fit: force each way.
  blocks=0; [ "$q" = blocks ] && blocks=1
  SPINDLE_CUDA_GGUF_BLOCKS=$blocks timeout "${BT:-150}" ./spindle bench --device cuda --json --model "$WORK/a3b.gguf" "${args[@]}" \
    --prompt 2048 --context 512 --gen 128 --runs "${RUNS:-3}" > "$OUT/bench-$q.json" 2> "$OUT/bench-$q.log"
  echo "rc=$?"; tail -3 "$OUT/bench-$q.log"; cat "$OUT/bench-$q.json" | head -c 3000; echo
done
el done
