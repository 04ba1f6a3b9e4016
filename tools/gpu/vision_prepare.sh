#!/usr/bin/env bash
# Builds the vision-tower GPU work into DIR (default .device-carry-vis): the `tower` and `vision`
# GPU test binaries of spindle-cuda, the vision_bench example and the spindle CLI with CUDA,
# stripped and xz-compressed, the fixtures those tests read, the text files PART=vision of
# features_run.sh needs, and the GPU scripts. On the GPU machine: `bash DIR/vision_run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry-vis}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release -p spindle-cuda --test tower --test vision --example vision_bench
cargo test --release -p spindle-cuda --test tower --test vision --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("tower", "vision"):
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        objcopy --strip-debug "$dir/$name-test"
    done
cp "$CARGO_TARGET_DIR/release/examples/vision_bench" "$dir/vision_bench"
objcopy --strip-debug "$dir/vision_bench"
cargo build --release -p spindle-cli --features cuda
cp "$CARGO_TARGET_DIR/release/spindle" "$dir/spindle"
objcopy --strip-debug "$dir/spindle"
for f in "$dir"/*-test "$dir"/vision_bench "$dir"/spindle; do
    xz -T2 -6 -f "$f"
done
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_5_dense_vision qwen3_5_moe_vision qwen3_next_moe; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
mkdir -p "$dir/text"
cp "${SPINDLE_FIXTURES:-fixtures}/tokenizer/tokenizer.json.gz" "$dir/text/"
cp "${SPINDLE_FIXTURES:-fixtures}/chat/qwen3_6_chat_template.jinja" "$dir/text/chat_template.jinja"
cp "${SPINDLE_FIXTURES:-fixtures}/vision_preprocess/photo.jpg" "$dir/text/"
cp tools/gpu/env.sh tools/gpu/features_run.sh tools/gpu/vision_run.sh "$dir/"
du -sh "$dir"
