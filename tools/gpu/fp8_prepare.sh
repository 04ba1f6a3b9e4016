#!/usr/bin/env bash
# Builds the FP8 GPU work into DIR (default .device-carry-fp8): the spindle-cuda fp8 test
# binary, the spindle CLI with CUDA and the fp8_checkpoint example, stripped and xz-compressed,
# and fp8_run.sh. On the GPU machine: `cd DIR && bash fp8_run.sh` (the fixtures are read from
# the repository copy beside DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry-fp8}
mkdir -p "$dir"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
exe=$(cargo test --release -p spindle-cuda --test fp8 --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "fp8":
        print(m["executable"])')
cp "$exe" "$dir/fp8-test"
cargo build --release -p spindle-cli --features cuda
cp "$CARGO_TARGET_DIR/release/spindle" "$dir/spindle"
cargo build --release -p spindle-model --example fp8_checkpoint
cp "$CARGO_TARGET_DIR/release/examples/fp8_checkpoint" "$dir/fp8_checkpoint"
for f in fp8-test spindle fp8_checkpoint; do
    objcopy --strip-debug "$dir/$f"
    xz -T2 -6 -f "$dir/$f"
done
cp tools/gpu/fp8_run.sh "$dir/"
du -sh "$dir"
