#!/usr/bin/env bash
# Builds llama.cpp's `llama-quantize` (CPU only) from the llama.cpp tree vendored in PyPI's
# llama-cpp-python 0.3.36 sdist, for tools/make_kquant_fixture.py (the K-quant GGUF fixtures in
# fixtures/gguf/llama_cpp/; see the README, GGUF).
# Idempotent: reuses the download, the source and the build; prints only the binary's path on
# stdout (the build's output goes to stderr), so `$(tools/llama_quantize.sh)` is the binary.
# Usage: tools/llama_quantize.sh [WORK_DIR]   (default /tmp/llq; needs python3 + pip, a C++ compiler)
set -euo pipefail
WORK=${1:-/tmp/llq}
VERSION=0.3.36
SRC_PARENT=${LLAMA_SRC_PARENT:-/tmp/llsrc}
SRC=$SRC_PARENT/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$WORK/build
mkdir -p "$WORK" "$SRC_PARENT"

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  (cd "$SRC_PARENT" && pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . >&2 \
     && tar xzf "llama_cpp_python-$VERSION.tar.gz")
fi

if ! command -v cmake >/dev/null; then
  if [ ! -x "$WORK/venv/bin/cmake" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q cmake >&2
  fi
  export PATH="$WORK/venv/bin:$PATH"
fi

if [ ! -f "$BUILD/Makefile" ]; then
  cmake -S "$SRC" -B "$BUILD" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
fi
nice -n 10 make -C "$BUILD" -j"${JOBS:-2}" llama-quantize >&2
echo "$BUILD/bin/llama-quantize"
