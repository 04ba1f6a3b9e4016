#!/bin/bash
# On the GPU machine, from the batch_prepare.sh folder (NEW=1): the batched-decode work's checks
# and figures on the full 40-layer 35B-A3B q4 (`--zero-experts`) in one run, the checkpoint
# written while the GPU tests run:
#   1. GPU tests $TESTS (default: batch ops fixtures), logs in $OUT;
#   2. batch_decode at B=1,16,64 for each of MATVEC_ROWS (default 128,32: the decode-only
#      steps' matvec limit) x GROUP_LAUNCH (default 1,0: decode matvecs of more than 8 rows as
#      one launch or one per group), then a per-kernel profile of B=16,64 (no graphs);
#   3. `spindle serve --parallel 64` + `spindle bench --serve --clients 1,16,64` (PART=serve of
#      batch_run.sh; SKIP_BENCH_BATCH= (empty) also runs `spindle bench --batch`).
cd "$(dirname "$0")"
source ./env.sh
for f in *.xz; do [ -f "$f" ] && xz -d -f "$f"; done
chmod +x ./*-test batch_decode spindle 2>/dev/null
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi -L
( ./spindle synth --shape qwen3.6-35b-a3b --layers 40 --zero-experts --out "$WORK/a3b" > "$WORK/synth.log" 2>&1
  echo "[t=$(( $(date +%s) - T0 ))s] synth rc=$?" ) &
synth=$!
PART=tests TESTS="${TESTS:-batch ops fixtures}" TT=${TT:-120} LINES_PER=${LINES_PER:-12} bash batch_run.sh
wait $synth
el "40-layer checkpoint ready"
PART=bench LAYERS=40 ZERO_EXPERTS=1 BATCHES=${BATCHES:-1,16,64} MATVEC_ROWS=${MATVEC_ROWS:-128,32} \
  GROUP_LAUNCH=${GROUP_LAUNCH:-1,0} BT=${BT:-240} PROFILE_BATCHES=${PROFILE_BATCHES:-16,64} PT=${PT:-120} \
  PROFILE_STEPS=4 bash batch_run.sh
PART=serve LAYERS=40 ZERO_EXPERTS=1 SKIP_BENCH_BATCH=${SKIP_BENCH_BATCH-1} bash batch_run.sh
el "all done"
