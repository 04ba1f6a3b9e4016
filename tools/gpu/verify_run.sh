#!/usr/bin/env bash
# On the GPU machine, from the folder verify_prepare.sh filled: every *-test binary there
# (--include-ignored, one thread), each under TT seconds (default 150), logs in $OUT, then
# vision_bench on a 1024x1024 image (BENCH=0 skips it).
cd "$(dirname "$0")"
export SPINDLE_FIXTURES=$PWD/fixtures SPINDLE_CUDA_PTX_CACHE=/tmp/spindle-ptx
mkdir -p "$SPINDLE_CUDA_PTX_CACHE" "${OUT:=/tmp/out}"
for f in *.xz; do [ -f "$f" ] && xz -d -f -T0 "$f"; done
chmod +x ./*-test vision_bench 2>/dev/null
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
for t in ${TESTS:-$(ls *-test | sed 's/-test$//')}; do
  el "== $t"
  timeout ${TT:-150} ./$t-test --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
  echo "rc=$?"
  grep -E "test result|panicked|FAILED" "$OUT/$t.log" | cut -c1-240 | head -8
done
if [ "${BENCH:-1}" = 1 ]; then
  el "== vision_bench"
  timeout 120 ./vision_bench --runs 5 2>&1 | tail -12
fi
el done
