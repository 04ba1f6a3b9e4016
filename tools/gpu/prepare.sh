#!/usr/bin/env bash
# Builds what a GPU machine needs into DIR (default .device-carry, git-ignored): the spindle
# binary with the CUDA backend, every GPU test binary of spindle-cuda, the fixtures and these
# scripts.
# Then, on the GPU machine, from DIR: `bash run_final.sh` (fixtures, run/serve, benches),
# `bash ncu.sh` (Nsight Compute on the decode kernels); env.sh says where they write.
# Fixtures come from $SPINDLE_FIXTURES (default: the repository's fixtures/).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.device-carry}
mkdir -p "$dir"
# The CUDA build has its own target directory, so target/release/spindle stays the CPU build
# the Python tests and the README's examples run.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release -p spindle-cli --features cuda
# Every GPU test binary of the crate (fixtures, kernels, ...) as DIR/<name>-test.
cargo test --release -p spindle-cuda --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"] and m["target"]["name"] != "nvrtc":
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
        cp "$exe" "$dir/$name-test"
        objcopy --strip-debug "$dir/$name-test"
    done
# The CLI's --device test starts the spindle binary at the path it was built with: the GPU
# machine links that path to DIR/spindle (run_tests.sh).
exe=$(cargo test --release -p spindle-cli --features cuda --test device --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "device":
        print(m["executable"])')
cp "$exe" "$dir/cli-device-test"
objcopy --strip-debug "$dir/cli-device-test"
target=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
echo "$target/release/spindle" > "$dir/spindle_path.txt"
cp "$target/release/spindle" "$dir/spindle"
objcopy --strip-debug "$dir/spindle"
rm -rf "$dir/fixtures" && mkdir -p "$dir/fixtures"
for f in qwen3_next_moe qwen3_5_dense qwen3_5_moe qwen3_5_moe_fused qwen4_exp qwen3_5_dense_vision qwen3_5_moe_vision; do
    cp -r "${SPINDLE_FIXTURES:-fixtures}/$f" "$dir/fixtures/"
done
cp tools/gpu/*.sh "$dir/"
du -sh "$dir"
