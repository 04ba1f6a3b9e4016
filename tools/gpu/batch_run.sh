#!/bin/bash
# On the GPU machine, from the batch_prepare.sh folder: PART=tests|bench|serve|ab|all (default all).
# tests: batch (batched vs solo), decode_tc (tensor-core decode matvec vs dp4a, bit for bit),
#   fixtures, ops, kernels, qwen4, gdn_chunked (logs in $OUT);
# bench: an 8-layer 35B-A3B-shaped checkpoint (LAYERS=40 ZERO_EXPERTS=1: the full model), then
#   batch_decode at q4 (B=1,16,64; MATVEC_ROWS=128,32 and GROUP_LAUNCH=1,0 measure each
#   combination of the batched-step matvec limit and one launch for all row groups or one each;
#   TC_ROWS=64,16,0: the fewest rows of a Q8/Q4 decode matvec on the tensor cores, 0 none);
# serve: `spindle bench --batch` and `spindle serve` + `spindle bench --serve` (clients
#   $CLIENTS, default 1,16,64) on that checkpoint at q4, with the real tokenizer and template
#   (LAYERS=40 ZERO_EXPERTS=1: the full model; STATE_MEMORY=BYTES: serve --state-memory);
# ab: ab.sh spindle-old spindle (logits byte-compare and batch-1 bench).
cd "$(dirname "$0")"
source ./env.sh
for f in *.xz; do [ -f "$f" ] && xz -d -f "$f"; done
chmod +x ./*-test batch_decode spindle spindle-old 2>/dev/null
part=${PART:-all}
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
if [ "$part" = tests ] || [ "$part" = all ]; then
  for t in ${TESTS:-batch decode_tc fixtures ops kernels qwen4 gdn_chunked}; do
    [ -x ./$t-test ] || continue
    el "== $t"
    SPINDLE_FIXTURES=$PWD/fixtures timeout ${TT:-240} ./$t-test --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
    echo "rc=$?"
    grep -E "test result|panicked|FAILED|batched vs solo|vs CPU|max\|Δ\||differ" "$OUT/$t.log" | cut -c1-200 | head -"${LINES_PER:-40}"
  done
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  el "synth a3b ${LAYERS:-8} layers"
  exe=./spindle; [ -x "$exe" ] || exe=./spindle-old
  [ -d "$WORK/a3b" ] || "$exe" synth --shape qwen3.6-35b-a3b --layers ${LAYERS:-8} ${ZERO_EXPERTS:+--zero-experts} --out "$WORK/a3b" > /dev/null 2> "$WORK/synth.err" || tail -3 "$WORK/synth.err"
  el "batch_decode q4"
  RUST_LOG=warn timeout ${BT:-400} ./batch_decode "$WORK/a3b" --quant q4 --batch ${BATCHES:-1,16,64} --context 512 --steps 32 --runs 3 ${MATVEC_ROWS:+--matvec-rows $MATVEC_ROWS} ${GROUP_LAUNCH:+--group-launch $GROUP_LAUNCH} ${TC_ROWS:+--tc-decode-rows $TC_ROWS} 2>&1 | tee "$OUT/batch_decode.log"
fi
if [ -n "${PROFILE_BATCHES:-}" ]; then
  el "batch_decode q4, per-kernel profile (no graphs; the engine's default settings)"
  SPINDLE_CUDA_PROFILE=1 RUST_LOG=warn timeout ${PT:-300} ./batch_decode "$WORK/a3b" --quant q4 --batch $PROFILE_BATCHES --context 512 --steps ${PROFILE_STEPS:-8} --runs 1 2>&1 | tee "$OUT/batch_profile.log" | grep -v "decode_argmax"
fi
if [ "$part" = serve ] || [ "$part" = all ]; then
  exe=./spindle
  [ -d "$WORK/a3b" ] || { el "synth a3b ${LAYERS:-8} layers"; "$exe" synth --shape qwen3.6-35b-a3b --layers ${LAYERS:-8} ${ZERO_EXPERTS:+--zero-experts} --out "$WORK/a3b" > /dev/null 2> "$WORK/synth.err" || tail -3 "$WORK/synth.err"; }
  gzip -dc text/tokenizer.json.gz > "$WORK/a3b/tokenizer.json"
  cp text/chat_template.jinja "$WORK/a3b/"
  printf '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n' > "$WORK/a3b/tokenizer_config.json"
  el "bench --batch"
  [ -n "${SKIP_BENCH_BATCH:-}" ] || RUST_LOG=warn timeout 300 "$exe" bench --model "$WORK/a3b" --device cuda --quant q4 --batch ${BATCHES:-1,16,64} --gen 32 --runs 3 2>&1 | tee "$OUT/bench_batch.log"
  el "serve + bench --serve"
  RUST_LOG=warn "$exe" serve --model "$WORK/a3b" --device cuda --quant q4 --parallel ${PARALLEL:-64} ${STATE_MEMORY:+--state-memory $STATE_MEMORY} --queue 256 --port 8391 > "$OUT/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8391/health > /dev/null && break; sleep 0.5; done
  timeout 300 "$exe" bench --serve http://127.0.0.1:8391 --clients ${CLIENTS:-1,16,64} --prompt-words 200 --max-tokens 128 --requests ${REQUESTS:-2} 2>&1 | tee "$OUT/bench_serve.log"
  curl -s http://127.0.0.1:8391/metrics | grep -E "^spindle_(batch_size|running|waiting|batch_steps|preemptions)" | head -20
  kill $server; wait $server 2>/dev/null
fi
if [ "$part" = ab ] || [ "$part" = all ]; then
  el "ab"
  [ -x ./spindle-old ] && [ -x ./spindle ] && bash ab.sh "$PWD/spindle-old" "$PWD/spindle" 2>&1 | tee "$OUT/ab.log"
fi
el done
