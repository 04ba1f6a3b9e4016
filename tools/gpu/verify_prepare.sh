#!/usr/bin/env bash
# Builds the GPU test binaries of spindle-cuda that check a merged tree (TESTS, default
# fixtures batch ops fp8 vision tower prefix sampling) and the vision_bench example into DIR
# (default .device-carry-lead), stripped and xz-compressed, with the fixtures they read and
# tools/gpu/verify_run.sh. On the GPU machine: `bash DIR/verify_run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry-lead}
tests=${TESTS:-fixtures batch ops fp8 vision tower prefix sampling}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
args=()
for t in $tests; do args+=(--test "$t"); done
cargo build --release -p spindle-cuda "${args[@]}" --example vision_bench
cargo test --release -p spindle-cuda "${args[@]}" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
want = sys.argv[1].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' "$tests" |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        objcopy --strip-debug "$dir/$name-test"
    done
cp "$CARGO_TARGET_DIR/release/examples/vision_bench" "$dir/vision_bench"
objcopy --strip-debug "$dir/vision_bench"
for f in "$dir"/*-test "$dir"/vision_bench; do xz -T2 -6 -f "$f"; done
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_next_moe qwen3_5_dense qwen3_5_moe qwen3_5_moe_fused qwen4_exp qwen3_5_dense_vision qwen3_5_moe_vision; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
cp tools/gpu/verify_run.sh "$dir/"
du -sh "$dir"
