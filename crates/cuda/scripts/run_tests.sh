#!/bin/bash
# Every GPU test binary prepare.sh copied (`*-test`), then ptxas's register report of the
# tensor-core GEMM when kernels.ptx is there. Logs to $OUT/<name>.log.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for t in ./*-test; do
  name=$(basename $t -test)
  echo "== $name"
  SPINDLE_FIXTURES=$PWD/fixtures timeout ${TT:-240} $t --ignored --test-threads=1 --nocapture > $OUT/$name.log 2>&1
  echo "rc=$?"
  grep -E "test result|panicked|FAILED|vs CPU|max\|Δ\||differ" $OUT/$name.log | cut -c1-240 | head -${LINES_PER:-40}
done
if [ -f kernels.ptx ]; then
  /usr/local/cuda/bin/ptxas -arch=sm_90 -v kernels.ptx -o /dev/null 2>&1 | grep -A1 -E "tgemm|gdn_chunk|tg_prep" | grep -E "Function|registers|spill" | head -20
fi
