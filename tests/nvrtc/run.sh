#!/usr/bin/env bash
# Compiles every CUDA kernel with NVRTC and checks each PTX entry's parameter list against its
# Rust declaration (crates/cuda/tests/nvrtc.rs). Needs no GPU and no CUDA toolkit: libnvrtc
# comes from the `nvidia-cuda-nvrtc` wheel on PyPI (CUDA 13, the line cudarc's `cuda-13000`
# feature loads), downloaded once into target/nvrtc/ and found through LD_LIBRARY_PATH.
# Usage: bash tests/nvrtc/run.sh [extra cargo test args]
# Env: NVRTC_WHEEL_VERSION (default 13.0.88), NVRTC_DIR (default target/nvrtc), or
#      NVRTC_LIB_DIR: a directory that already holds libnvrtc.so.13 (skips the download).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version="${NVRTC_WHEEL_VERSION:-13.0.88}"
dir="${NVRTC_DIR:-$root/target/nvrtc}"
lib="${NVRTC_LIB_DIR:-$dir/nvidia/cu13/lib}"

if [[ ! -e "$lib/libnvrtc.so.13" ]]; then
    if [[ -n "${NVRTC_LIB_DIR:-}" ]]; then
        echo "run.sh: NVRTC_LIB_DIR=$NVRTC_LIB_DIR holds no libnvrtc.so.13" >&2
        exit 2
    fi
    mkdir -p "$dir"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --dest "$dir" "nvidia-cuda-nvrtc==$version"
    wheel="$(ls "$dir"/nvidia_cuda_nvrtc-"$version"-*.whl | head -n 1)"
    # A wheel is a zip; python3 unpacks it where unzip may be missing.
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$dir"
    rm -f "$wheel"
    if [[ ! -e "$lib/libnvrtc.so.13" ]]; then
        echo "run.sh: the nvidia-cuda-nvrtc $version wheel has no nvidia/cu13/lib/libnvrtc.so.13" >&2
        exit 2
    fi
fi

cd "$root"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec cargo test --release -p spindle-cuda --test nvrtc "$@" -- --include-ignored
