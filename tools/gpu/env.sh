# Sourced by the GPU scripts: every path they use comes from the environment, with a default
# found at run time or relative to the scripts' folder (no machine paths written in).
#   OUT        logs and results (default: <scripts folder>/out)
#   WORK       scratch: synthetic checkpoints, bench JSON, temporary text (default:
#              <scripts folder>/work; the full benches write about 60 GB there)
#   CUDA_HOME  a CUDA toolkit, for libnvrtc (kernels compile at run time) and ptxas/ncu
#              (default: the one whose nvcc or ptxas is on PATH, else the usual install
#              folder if present); without one, libnvrtc must be on the loader path already
#              (e.g. NVRTC_LIB_DIR: a folder holding libnvrtc.so.13, as tests/nvrtc/run.sh
#              unpacks from the nvidia-cuda-nvrtc wheel)
#   NCU, PTXAS the profiler and assembler (default: found on PATH or under CUDA_HOME)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$here/out}"
WORK="${WORK:-$here/work}"
mkdir -p "$OUT" "$WORK"

find_cuda_home() {
    local tool dir
    for tool in nvcc ptxas ncu; do
        if dir="$(command -v "$tool" 2>/dev/null)"; then
            dir="$(cd "$(dirname "$(readlink -f "$dir")")/.." && pwd)"
            [ -d "$dir/lib64" ] && { echo "$dir"; return 0; }
        fi
    done
    for dir in /usr/local/cuda /opt/cuda; do
        [ -d "$dir/lib64" ] && { echo "$dir"; return 0; }
    done
    return 1
}

if [ -z "${CUDA_HOME:-}" ]; then
    CUDA_HOME="$(find_cuda_home || true)"
fi
if [ -n "$CUDA_HOME" ]; then
    export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "${NVRTC_LIB_DIR:-}" ]; then
    export LD_LIBRARY_PATH="$NVRTC_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PTXAS="${PTXAS:-$(command -v ptxas 2>/dev/null || { [ -n "$CUDA_HOME" ] && [ -x "$CUDA_HOME/bin/ptxas" ] && echo "$CUDA_HOME/bin/ptxas"; } || true)}"
export OUT WORK CUDA_HOME PTXAS
