#!/usr/bin/env bash
# Builds the programmatic-dependent-launch checks for a GPU machine into DIR (default
# .device-carry-pdl): the spindle CLI with CUDA and the GPU test binaries $TESTS (default
# fixtures batch ops prefix sampling), stripped and xz-compressed, with the fixtures they read
# and tools/gpu/pdl_run.sh. On the GPU machine: `bash DIR/pdl_run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry-pdl}
tests=${TESTS:-fixtures batch ops prefix sampling}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
args=()
for t in $tests; do args+=(--test "$t"); done
cargo build --release -p spindle-cli --features cuda
cargo test --release -p spindle-cuda "${args[@]}" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
want = sys.argv[1].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' "$tests" |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        strip "$dir/$name-test"
    done
cp "$CARGO_TARGET_DIR/release/spindle" "$dir/spindle"
strip "$dir/spindle"
for f in "$dir"/*-test "$dir"/spindle; do xz -T2 -6 -f "$f"; done
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_next_moe qwen3_5_dense qwen3_5_moe qwen3_5_moe_fused qwen4_exp; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
cp tools/gpu/pdl_run.sh tools/gpu/env.sh "$dir/"
du -sh "$dir"
