#!/bin/bash
# Every GPU test binary prepare.sh copied (`*-test`), then ptxas's register report of the
# tensor-core GEMM when kernels.ptx is there. Logs to $OUT/<name>.log (paths: env.sh).
cd "$(dirname "$0")"
source ./env.sh
if [ -f spindle_path.txt ]; then  # where the CLI test looks for the binary
  mkdir -p "$(dirname "$(cat spindle_path.txt)")" && ln -sf "$PWD/spindle" "$(cat spindle_path.txt)"
fi
for t in ./*-test; do
  name=$(basename $t -test)
  echo "== $name"
  SPINDLE_FIXTURES=$PWD/fixtures timeout ${TT:-240} $t --include-ignored --test-threads=1 --nocapture > "$OUT/$name.log" 2>&1
  echo "rc=$?"
  grep -E "test result|panicked|FAILED|vs CPU|max\|Δ\||differ|^test " "$OUT/$name.log" | cut -c1-240 | head -"${LINES_PER:-40}"
done
if [ -f kernels.ptx ] && [ -n "$PTXAS" ]; then
  "$PTXAS" -arch=sm_90 -v kernels.ptx -o /dev/null 2>&1 | grep -A1 -E "gemm_tensor|gdn_chunk" | grep -E "Function|registers|spill" | head -20
fi
