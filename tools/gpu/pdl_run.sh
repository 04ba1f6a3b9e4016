#!/bin/bash
# On the GPU machine, from the folder pdl_prepare.sh filled: the programmatic-dependent-launch
# checks and figures in one run, stages skipped once the run passes BUDGET seconds (default 300):
#   1. fixtures' pdl_launches_equal_plain_launches (PDL on == off, bit for bit), then the GPU
#      tests $TESTS (default fixtures batch ops prefix sampling), logs in $OUT/tests.log;
#   2. `spindle bench --device cuda --quant q4` on the 40-layer 35B-A3B synth (--zero-experts,
#      written while the tests run) with SPINDLE_CUDA_PDL=0 and =1, JSON in $OUT;
#   3. the 8-layer cut (--layers 8): decode with PDL off, on, and on without the L2 weight
#      prefetch (SPINDLE_CUDA_L2_PREFETCH=0), twice; a per-kernel profile (SPINDLE_CUDA_PROFILE=1).
cd "$(dirname "$0")"
source ./env.sh
export SPINDLE_FIXTURES=$PWD/fixtures SPINDLE_CUDA_PTX_CACHE=/tmp/spindle-ptx RUST_LOG=warn
mkdir -p "$SPINDLE_CUDA_PTX_CACHE"
for f in *.xz; do [ -f "$f" ] && xz -d -f -T0 "$f"; done
chmod +x ./*-test spindle
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
left() { [ $(( $(date +%s) - T0 )) -lt "${BUDGET:-300}" ] || { el "over budget: skipping $*"; return 1; }; }
nvidia-smi -L
( ./spindle synth --shape qwen3.6-35b-a3b --layers ${LAYERS:-40} --zero-experts --out "$WORK/a3b" > "$WORK/synth.log" 2>&1
  echo "[t=$(( $(date +%s) - T0 ))s] synth rc=$? $(tail -1 "$WORK/synth.log" | cut -c1-120)" ) &
synth=$!
log=$OUT/tests.log
run_test() {  # name, timeout, args...
  local t=$1 limit=$2; shift 2
  el "== $t $*" | tee -a "$log"
  timeout "$limit" ./$t-test --include-ignored --test-threads=1 --nocapture "$@" >> "$log" 2>&1
  echo "rc=$?" | tee -a "$log"
}
run_test fixtures 240 pdl_launches
grep -E "PDL on|panicked" "$log" | cut -c1-200 | head -12
for t in ${TESTS:-fixtures batch}; do
  left "$t" && run_test "$t" 120 --skip pdl_launches
done
grep -E "test result|panicked|FAILED" "$log" | cut -c1-200
wait $synth
bench() {  # name, env, args...
  local name=$1 pdl=$2; shift 2
  el "bench $name PDL=$pdl"
  SPINDLE_CUDA_PDL=$pdl timeout 150 ./spindle bench --device cuda --json --model "$WORK/a3b" --quant q4 "$@" \
    > "$OUT/$name-pdl$pdl.json" 2> "$WORK/bench.err" || tail -3 "$WORK/bench.err"
}
if left "40-layer bench"; then
  bench a3b40 0 --prompt 2048 --context 512,8192 --gen 128 --runs 3
  bench a3b40 1 --prompt 2048 --context 512,8192 --gen 128 --runs 3
fi
for t in ${TESTS2:-ops prefix sampling}; do
  left "$t" && run_test "$t" 90
done
grep -E "test result|panicked|FAILED" "$log" | cut -c1-200 | tail -4
if left "8-layer A/B"; then
  # PDL off, on, on without the L2 weight prefetch; twice.
  for arm in 0:1 1:1 1:0 0:1 1:1 1:0; do
    SPINDLE_CUDA_PDL=${arm%:*} SPINDLE_CUDA_L2_PREFETCH=${arm#*:} timeout 60 ./spindle bench --device cuda --json \
      --model "$WORK/a3b" --quant q4 --layers 8 --prompt 512 --context 512 --gen 128 --runs 3 2>"$WORK/b8.err" |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print("8 layers PDL:prefetch='$arm' decode @512:", d["decode_by_context"][0]["decode"], "prefill", round(d["prefill_tokens_per_s"]))' ||
      tail -2 "$WORK/b8.err"
  done
fi
if left "profile"; then
  el "8-layer profile"
  SPINDLE_CUDA_PROFILE=1 timeout 60 ./spindle bench --device cuda --model "$WORK/a3b" --quant q4 --layers 8 \
    --prompt 512 --context 512 --gen 16 --runs 1 > "$OUT/profile8.log" 2>&1
  grep -A 24 "kernel time per" "$OUT/profile8.log" | cut -c1-110 | tail -26
fi
python3 - "$OUT" <<'PY'
import json, sys, glob, os
for path in sorted(glob.glob(os.path.join(sys.argv[1], "a3b40-*.json"))):
    try:
        d = json.load(open(path))
    except Exception as e:
        print(path, "unreadable:", e); continue
    print(os.path.basename(path), "prefill", d["prefill"], "decode", [(c["context"], c["decode"]) for c in d["decode_by_context"]])
PY
el done
