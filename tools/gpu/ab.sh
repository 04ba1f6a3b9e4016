#!/bin/bash
# A/B check of two spindle binaries on one GPU in one run (from the prepare.sh folder):
#   bash ab.sh OLD NEW [logits|bench|all]
# logits: `spindle logits --device cuda` of both on every fixture (greedy, 6 decode steps,
#         bf16 and q4), compared byte for byte (cmp): a refactor must not change one bit.
# bench:  a synthetic 35B-A3B-shaped checkpoint (LAYERS layers, default 8), then
#         `spindle bench --device cuda` of OLD and NEW alternated (q4 and bf16), and the
#         median prefill / decode of each with NEW/OLD as a ratio.
cd "$(dirname "$0")"
source ./env.sh
old=$1 new=$2 part=${3:-all}
[ -x "$old" ] && [ -x "$new" ] || { echo "usage: ab.sh OLD NEW [logits|bench|all]"; exit 2; }
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }

if [ "$part" = logits ] || [ "$part" = all ]; then
  el "logits A/B"
  for f in fixtures/*/; do
    name=$(basename "$f")
    [ -f "$f/reference.safetensors" ] || continue
    for q in bf16 q4; do
      for bin in old new; do
        exe=$old; [ $bin = new ] && exe=$new
        RUST_LOG=warn "$exe" logits --device cuda --model "$f" --quant $q \
          --tokens-from "$f/reference.safetensors" --decode 6 \
          --out "$WORK/$name-$q-$bin.safetensors" > /dev/null 2> "$WORK/logits.err" ||
          { echo "$name $q $bin failed: $(tail -2 "$WORK/logits.err")"; }
      done
      if cmp -s "$WORK/$name-$q-old.safetensors" "$WORK/$name-$q-new.safetensors"; then
        echo "$name $q: identical"
      else
        echo "$name $q: DIFFER"
      fi
    done
  done
fi

if [ "$part" = bench ] || [ "$part" = all ]; then
  layers=${LAYERS:-8}
  el "synth a3b, $layers layers"
  [ -d "$WORK/a3b" ] || "$new" synth --shape qwen3.6-35b-a3b --layers "$layers" --out "$WORK/a3b" > /dev/null 2> "$WORK/synth.err" ||
    { tail -3 "$WORK/synth.err"; exit 1; }
  for q in q4 bf16; do
    for round in 1 2; do
      for bin in old new; do
        exe=$old; [ $bin = new ] && exe=$new
        el "bench $q $bin round $round"
        RUST_LOG=warn timeout 300 "$exe" bench --device cuda --json --model "$WORK/a3b" --quant $q \
          --prompt 2048 --context 512 --gen 128 --runs 3 > "$WORK/b-$q-$bin-$round.json" 2> "$WORK/b.err" ||
          tail -3 "$WORK/b.err"
      done
    done
  done
  python3 - "$WORK" <<'EOF'
import json, sys, glob, os, statistics
work = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(work, "b-*.json")):
    q, bin_, _ = os.path.basename(path)[2:-5].split("-")
    try:
        d = json.load(open(path))
    except Exception as e:
        print(path, "unreadable:", e); continue
    prefill = d["prefill"]["median"] if isinstance(d["prefill"], dict) else d["prefill"]
    dec = d["decode_by_context"][0]["decode"]
    decode = dec["median"] if isinstance(dec, dict) else dec
    rows.setdefault((q, bin_), []).append((prefill, decode))
for q in ("q4", "bf16"):
    if (q, "old") not in rows or (q, "new") not in rows:
        continue
    o = rows[(q, "old")]; n = rows[(q, "new")]
    op = statistics.median(p for p, _ in o); od = statistics.median(d for _, d in o)
    np_ = statistics.median(p for p, _ in n); nd = statistics.median(d for _, d in n)
    print(f"{q}: prefill old {op:.1f} new {np_:.1f} (x{np_/op:.3f}); decode old {od:.1f} new {nd:.1f} (x{nd/od:.3f}); runs old {o} new {n}")
EOF
  rm -rf "$WORK/a3b"
fi
el done
