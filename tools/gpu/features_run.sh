#!/bin/bash
# On the GPU machine, from the batch_prepare.sh folder (NEW=1, plus FP8 pairs in fp8/ made by
# `cargo run --release -p spindle-model --example fp8_checkpoint -- fixtures/F fp8/F-fp8 fp8/F-deq`):
# PART=tests|formats|prefix|constrained|vision|all (default all; vision only by name).
# tests: the GPU tests TESTS (default prefix sampling batch fixtures masks), logs in $OUT;
# formats: GGUF (bf16 against the fixture's reference, Q8_0 against its dequantized copy) and
#   block FP8 (against its dequantized copy) through `spindle logits --device cuda`;
# SERVE_ENV: environment for the servers (e.g. SPINDLE_CUDA_SKINNY_GEMM=1 for an A/B).
# prefix: `spindle serve` on the 35B-A3B shape (LAYERS, default 40, experts zero) at q4 with
#   the prefix cache, then tools/prefix_cache_bench.py ttft (PREFIX_WORDS, default 3980) and
#   agent (PREFIX_ARGS: more serve options, e.g. --prefix-cache-interval N); the same ttft
#   against --no-prefix-cache for the cold time without snapshots;
# constrained: `spindle bench --batch 1,16 --json-schema nested.schema.json` on that model;
# vision: that model served (it carries the released vision tower: synth writes it), the time
#   to first token of a chat without and with one image (text/photo.jpg, 500x375, and a
#   generated 1024x1024 PNG) through `spindle bench --serve URL --image FILE`.
cd "$(dirname "$0")"
source ./env.sh
for f in *.xz; do [ -f "$f" ] && xz -d -f "$f"; done
chmod +x ./*-test spindle 2>/dev/null
part=${PART:-all}
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
exe=./spindle
if [ "$part" = tests ] || [ "$part" = all ]; then
  for t in ${TESTS:-prefix sampling batch fixtures masks}; do
    [ -x ./$t-test ] || continue
    el "== $t"
    SPINDLE_FIXTURES=$PWD/fixtures timeout ${TT:-200} ./$t-test --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
    echo "rc=$?"
    grep -E "test result|panicked|FAILED|restored|vs CPU|max\|Δ\||differ" "$OUT/$t.log" | cut -c1-200 | head -"${LINES_PER:-12}"
  done
fi
if [ "$part" = formats ] || [ "$part" = all ]; then
  g=fixtures/gguf
  gzip -dc $g/qwen3_5_moe_fused.q8_0.dequantized.gguf.gz > "$WORK/q8deq.gguf" 2>/dev/null
  logits() { "$exe" logits --device cuda --decode 4 "$@" 2>&1 | grep -vE "^\s*$" | tail -4; }
  for pair in "qwen3_5_moe.bf16.gguf qwen3_5_moe" "qwen3_5_dense.bf16-00001-of-00003.gguf qwen3_5_dense" "qwen3_next_moe.bf16.gguf qwen3_next_moe"; do
    set -- $pair
    el "GGUF $1 on CUDA vs the fixture's reference"
    logits --model $g/$1 --tokens-from fixtures/$2/reference.safetensors --compare fixtures/$2/reference.safetensors --out "$WORK/g.st"
  done
  el "GGUF q8_0 on CUDA vs its dequantized copy on CUDA"
  logits --model "$WORK/q8deq.gguf" --tokens 1,2,3,4,5,6,7,8 --out "$WORK/q8deq.st"
  logits --model $g/qwen3_5_moe_fused.q8_0.gguf --tokens-from "$WORK/q8deq.st" --compare "$WORK/q8deq.st" --out "$WORK/q8.st"
  for f in fp8/*-fp8; do
    base=${f%-fp8}
    el "FP8 $f on CUDA vs its dequantized copy on CUDA"
    logits --model $base-deq --tokens 1,2,3,4,5,6,7,8 --out "$WORK/deq.st"
    logits --model $f --tokens-from "$WORK/deq.st" --compare "$WORK/deq.st" --out "$WORK/fp8.st"
  done
fi
model="$WORK/a3b"
prepare_model() {
  [ -d "$model" ] || { el "synth a3b ${LAYERS:-40} layers"; "$exe" synth --shape qwen3.6-35b-a3b --layers ${LAYERS:-40} --zero-experts --out "$model" > /dev/null 2> "$WORK/synth.err" || tail -3 "$WORK/synth.err"; }
  gzip -dc text/tokenizer.json.gz > "$model/tokenizer.json"
  cp text/chat_template.jinja "$model/"
  printf '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n' > "$model/tokenizer_config.json"
}
serve() {  # serve PORT EXTRA...: starts a server in the background, waits for /health
  local port=$1; shift
  env ${SERVE_ENV:-} RUST_LOG=${SERVE_LOG:-warn} "$exe" serve --model "$model" --device cuda --quant q4 --parallel 16 --port $port "$@" > "$OUT/serve-$port.log" 2>&1 &
  for _ in $(seq 1 360); do curl -sf http://127.0.0.1:$port/health > /dev/null && return; sleep 0.5; done
  echo "server on $port did not start"; tail -5 "$OUT/serve-$port.log"
}
if [ "$part" = prefix ] || [ "$part" = all ]; then
  prepare_model
  el "serve with the prefix cache; ttft and agent"
  serve 8391 ${PREFIX_ARGS:-}; cached=$!
  timeout 240 python3 prefix_cache_bench.py http://127.0.0.1:8391 ttft --prefix-words ${PREFIX_WORDS:-3980} --runs 3 2>&1 | tee "$OUT/prefix_ttft.log"
  timeout 240 python3 prefix_cache_bench.py http://127.0.0.1:8391 agent --system-words 1990 2>&1 | tail -2 | tee "$OUT/prefix_agent.log"
  curl -s http://127.0.0.1:8391/metrics | grep -E "^spindle_prefix_cache" | head -8
  kill $cached; wait $cached 2>/dev/null
  el "serve --no-prefix-cache; ttft"
  serve 8392 --no-prefix-cache; cold=$!
  timeout 240 python3 prefix_cache_bench.py http://127.0.0.1:8392 ttft --prefix-words ${PREFIX_WORDS:-3980} --runs 2 2>&1 | tail -1 | tee "$OUT/prefix_ttft_off.log"
  kill $cold; wait $cold 2>/dev/null
fi
if [ "$part" = constrained ] || [ "$part" = all ]; then
  prepare_model
  el "bench --batch 1,16 --json-schema"
  RUST_LOG=warn timeout 300 "$exe" bench --model "$model" --device cuda --quant q4 --batch ${BATCHES:-1,16} --gen 32 --runs 2 --json-schema nested.schema.json 2>&1 | tee "$OUT/constrained.log" | tail -12
fi
if [ "$part" = vision ]; then
  prepare_model
  python3 - "$WORK/square.png" <<'PY'
import struct, sys, zlib
w = h = 1024
raw = bytearray()
for y in range(h):
    raw.append(0)  # filter: none
    for x in range(w):
        raw += bytes(((x * 7 + y * 3) & 255, (x ^ y) & 255, (x * y) & 255))
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
open(sys.argv[1], "wb").write(png + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))
PY
  el "serve with the vision tower; TTFT without and with an image"
  serve 8393 --no-prefix-cache; s=$!
  for img in "" text/photo.jpg "$WORK/square.png"; do
    "$exe" bench --serve http://127.0.0.1:8393 --clients 1 --requests 3 --prompt-words 20 --max-tokens 16 ${img:+--image $img} 2>&1 | tail -1 | sed "s|^|${img:-text only}: |"
  done
  kill $s; wait $s 2>/dev/null
fi
el done
