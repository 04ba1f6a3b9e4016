#!/bin/bash
# spindle run / serve on CUDA against the CPU, on the embedded demo model.
cd "$(dirname "$0")"
P="Write one sentence about spinning wheels."
./spindle run --max-tokens 48 --temperature 0 "$P" > /tmp/cpu.txt 2>/tmp/cpu.err
./spindle run --device cuda --max-tokens 48 --temperature 0 "$P" > /tmp/gpu.txt 2>/tmp/gpu.err
echo "rc=$? cpu $(wc -c < /tmp/cpu.txt) bytes, cuda $(wc -c < /tmp/gpu.txt) bytes"
if cmp -s /tmp/cpu.txt /tmp/gpu.txt; then echo "run: CUDA text == CPU text (greedy, 48 tokens)"; else echo "run: DIFFER"; head -c 300 /tmp/cpu.txt; echo; head -c 300 /tmp/gpu.txt; echo; tail -3 /tmp/gpu.err; fi
./spindle run --device cuda --quant q4 --max-tokens 16 --temperature 0 "$P" > /tmp/gq4.txt 2>/tmp/gq4.err; echo "run q4 rc=$? $(head -c 120 /tmp/gq4.txt | tr '\n' ' ')"
./spindle serve --device cuda --port 18080 > /tmp/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf localhost:18080/health > /dev/null && break; sleep 0.5; done
curl -s localhost:18080/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Write one sentence about spinning wheels."}],"max_tokens":48,"temperature":0}' > /tmp/chat.json
python3 -c "
import json;d=json.load(open('/tmp/chat.json'));c=d['choices'][0]['message']['content'];print('serve:',repr(c[:120]),d.get('usage'))
cpu=open('/tmp/cpu.txt').read().strip();print('serve content == run CPU text:', c.strip()==cpu)" 2>&1 | tail -3
curl -sN localhost:18080/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"stream":true}' | head -c 300; echo
kill -TERM $SP; wait $SP; echo "serve exit $?"; tail -2 /tmp/serve.log | cut -c1-200
