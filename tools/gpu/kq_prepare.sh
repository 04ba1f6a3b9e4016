#!/usr/bin/env bash
# Builds the GGUF K-quant work (issue 18) for a GPU machine into DIR (default
# .device-carry-kq): the GPU test binaries of spindle-cuda `gguf` and `fixtures`, the spindle
# CLI with CUDA, each stripped and xz-compressed, the fixtures they read, the gguf wheel (pure
# Python; the machine's Python lacks it) and the scripts that make the benchmark GGUF.
# On the GPU machine: `bash DIR/kq_run.sh` (TESTS, LAYERS, RUNS in the environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry-kq}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release -p spindle-cli --features cuda
cargo test --release -p spindle-cuda --test gguf --test fixtures --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gguf", "fixtures"):
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        objcopy --strip-debug "$dir/$name-test"
    done
cp "$CARGO_TARGET_DIR/release/spindle" "$dir/spindle"
objcopy --strip-debug "$dir/spindle"
for f in "$dir"/*-test "$dir"/spindle; do xz -T2 -6 -f "$f"; done
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_next_moe qwen3_5_dense qwen3_5_moe qwen3_5_moe_fused qwen4_exp; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
mkdir -p "$dir/fixtures/gguf/llama_cpp"
cp fixtures/gguf/llama_cpp/qwen35moe_k256.Q4_K_M.gguf fixtures/gguf/llama_cpp/qwen35moe_k256.Q5_K_M.gguf \
    "$dir/fixtures/gguf/llama_cpp/"
cp fixtures/gguf/qwen3_5_moe_fused.q8_0.gguf "$dir/fixtures/gguf/"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$dir" gguf==0.19.0
cp tools/gguf_from_fixture.py tools/gpu/kq_run.sh "$dir/"
du -sh "$dir"
