#!/bin/bash
# spindle run / serve on CUDA against the CPU, on the embedded demo model (scratch text in
# $WORK, see env.sh).
cd "$(dirname "$0")"
source ./env.sh
T="$WORK/cli"; mkdir -p "$T"
P="Write one sentence about spinning wheels."
./spindle run --max-tokens 48 --temperature 0 "$P" > "$T/cpu.txt" 2>"$T/cpu.err"
./spindle run --device cuda --max-tokens 48 --temperature 0 "$P" > "$T/gpu.txt" 2>"$T/gpu.err"
echo "rc=$? cpu $(wc -c < "$T/cpu.txt") bytes, cuda $(wc -c < "$T/gpu.txt") bytes"
if cmp -s "$T/cpu.txt" "$T/gpu.txt"; then echo "run: CUDA text == CPU text (greedy, 48 tokens)"; else echo "run: DIFFER"; head -c 300 "$T/cpu.txt"; echo; head -c 300 "$T/gpu.txt"; echo; tail -3 "$T/gpu.err"; fi
./spindle run --device cuda --quant q4 --max-tokens 16 --temperature 0 "$P" > "$T/gq4.txt" 2>"$T/gq4.err"; echo "run q4 rc=$? $(head -c 120 "$T/gq4.txt" | tr '\n' ' ')"
./spindle serve --device cuda --port 18080 > "$T/serve.log" 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf localhost:18080/health > /dev/null && break; sleep 0.5; done
curl -s localhost:18080/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Write one sentence about spinning wheels."}],"max_tokens":48,"temperature":0}' > "$T/chat.json"
python3 -c "
import json;d=json.load(open('$T/chat.json'));c=d['choices'][0]['message']['content'];print('serve:',repr(c[:120]),d.get('usage'))
cpu=open('$T/cpu.txt').read().strip();print('serve content == run CPU text:', c.strip()==cpu)" 2>&1 | tail -3
curl -sN localhost:18080/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"stream":true}' | head -c 300; echo
kill -TERM $SP; wait $SP; echo "serve exit $?"; tail -2 "$T/serve.log" | cut -c1-200
