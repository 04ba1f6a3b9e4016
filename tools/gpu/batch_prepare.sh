#!/usr/bin/env bash
# Builds the batched-step work for a GPU machine into DIR (default .device-carry): the GPU test
# binaries of spindle-cuda (batch, decode_tc, sampling, fixtures, ops, kernels, qwen4, gdn_chunked) and of
# spindle-runtime's masks_cuda (constrained decoding, as masks-test), the
# batch_decode example, the spindle CLI with CUDA (NEW=1; `spindle-old` is kept if present),
# each xz-compressed (the carry limit is 64 MiB), the fixtures and the GPU scripts.
# On the GPU machine: `bash DIR/batch_run.sh` (PART=tests|bench|ab|all).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release -p spindle-cuda --tests --examples
cargo test --release -p spindle-cuda --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"] and m["target"]["name"] in ("batch", "decode_tc", "sampling", "fixtures", "ops", "kernels", "qwen4", "gdn_chunked", "prefix", "vision"):
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        objcopy --strip-debug "$dir/$name-test"
    done
# Constrained decoding on the GPU (the runtime's masks_cuda test, on the embedded demo model).
cargo test --release -p spindle-runtime --features cuda --test masks_cuda --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "masks_cuda":
        print(m["executable"])' |
    while read -r exe; do
        cp "$exe" "$dir/masks-test"
        objcopy --strip-debug "$dir/masks-test"
    done
cp "$CARGO_TARGET_DIR/release/examples/batch_decode" "$dir/batch_decode"
objcopy --strip-debug "$dir/batch_decode"
if [ "${NEW:-0}" = 1 ]; then
    cargo build --release -p spindle-cli --features cuda
    cp "$CARGO_TARGET_DIR/release/spindle" "$dir/spindle"
    objcopy --strip-debug "$dir/spindle"
fi
for f in "$dir"/*-test "$dir"/batch_decode "$dir"/spindle "$dir"/spindle-old; do
    [ -f "$f" ] && xz -T2 -6 -f "$f"
done
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_next_moe qwen3_5_dense qwen3_5_moe qwen3_5_moe_fused qwen4_exp qwen3_5_dense_vision qwen3_5_moe_vision; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
# The real Qwen tokenizer and chat template, for serving a synthetic checkpoint (PART=serve).
mkdir -p "$dir/text"
cp "${SPINDLE_FIXTURES:-fixtures}/tokenizer/tokenizer.json.gz" "$dir/text/"
cp "${SPINDLE_FIXTURES:-fixtures}/chat/qwen3_6_chat_template.jinja" "$dir/text/chat_template.jinja"
cp "${SPINDLE_FIXTURES:-fixtures}/vision_preprocess/photo.jpg" "$dir/text/"  # PART=vision
cp -r "${SPINDLE_FIXTURES:-fixtures}/gguf" "$dir/fixtures/"
cp tools/prefix_cache_bench.py docs/benchmarks/nested.schema.json "$dir/"
cp tools/gpu/*.sh "$dir/"
du -sh "$dir"
