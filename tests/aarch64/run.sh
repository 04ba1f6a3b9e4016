#!/usr/bin/env bash
# The CPU kernels and engine on aarch64 (the NEON path) under qemu-user: every kernel path
# against the scalar reference, and the engine's fixture tests against transformers.
# Installs what it needs: the Rust aarch64 standard library, a cross linker and qemu-user.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi
if ! command -v aarch64-linux-gnu-gcc > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CARGO_TARGET_DIR=target/aarch64
cargo test --release --target "$target" -p spindle-kernels -p spindle-cpu
