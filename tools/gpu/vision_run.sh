#!/bin/bash
# On the GPU machine, from the vision_prepare.sh folder: the tower's kernel tests and the
# vision fixture tests (logs in $OUT), vision_bench before (SIMT f32) and after (tensor cores)
# at the released tower shape, the time to first token of a chat with an image
# (features_run.sh PART=vision), and the embedded demo's tiny tower answering on CUDA.
# PARTS: any of tests bench ttft demo (default all four).
cd "$(dirname "$0")"
source ./env.sh
for f in *.xz; do [ -f "$f" ] && xz -d -f "$f"; done
chmod +x ./*-test ./vision_bench ./spindle 2>/dev/null
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
parts=${PARTS:-tests bench ttft demo}
if [[ " $parts " == *" tests "* ]]; then
  for t in tower vision; do
    el "== $t"
    SPINDLE_FIXTURES=$PWD/fixtures timeout ${TT:-150} ./$t-test --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
    rc=$?; echo "rc=$rc"; [ "$t" = tower ] && tower_rc=$rc
    grep -E "test result|panicked|FAILED|max\|Δ\||planes|GEMM \[|attention n|LayerNorm|vs reference" "$OUT/$t.log" | cut -c1-220 | head -${LINES_PER:-60}
  done
fi
if [[ " $parts " == *" bench "* ]]; then
  el "== vision_bench"
  timeout 200 ./vision_bench --runs ${RUNS:-7} 2>&1 | tee "$OUT/vision_bench.log"
fi
if [ "${tower_rc:-0}" != 0 ] && [ -z "${FORCE:-}" ]; then
  el "the tower's kernel tests failed: skipping TTFT and the demo (FORCE=1 runs them)"
  parts=${parts//ttft/}; parts=${parts//demo/}
fi
if [[ " $parts " == *" ttft "* ]]; then
  el "== TTFT (features_run.sh PART=vision)"
  LAYERS=${LAYERS:-40} PART=vision timeout 300 bash ./features_run.sh 2>&1 | tee "$OUT/ttft.log"
fi
if [[ " $parts " == *" demo "* ]]; then
  el "== the embedded demo's tiny tower on CUDA"
  timeout 120 ./spindle run --device cuda --image text/photo.jpg --max-tokens 8 "What is in this picture?" 2>&1 | tail -5
fi
el done
