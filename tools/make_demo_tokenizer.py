"""Builds the embedded demo model's tokenizer: the Qwen3.5/3.6 byte-level BPE tokenizer
(fixtures/tokenizer/tokenizer.json, unpacked from its .gz by the tests) cut down to its first RANKS ranks, with the same
pre-tokenizer and the same 33 special tokens renumbered after the ranks. The result encodes any
text (byte-level), just in more tokens than the full vocabulary would.

    python3 tools/make_demo_tokenizer.py fixtures/tokenizer/tokenizer.json models/demo
"""
import json
import os
import sys

RANKS = 4096 - 33  # ranks kept, so that ranks + specials = 4096

src, out = sys.argv[1], sys.argv[2]
tok = json.load(open(src, encoding="utf-8"))
model = tok["model"]
vocab = {t: i for t, i in model["vocab"].items() if i < RANKS}
merges = [m for m in model["merges"] if m[0] in vocab and m[1] in vocab and (m[0] + m[1]) in vocab]
model["vocab"] = vocab
model["merges"] = merges
old_to_new = {}
for i, added in enumerate(tok["added_tokens"]):
    old_to_new[added["id"]] = RANKS + i
    added["id"] = RANKS + i
os.makedirs(out, exist_ok=True)
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
special = {a["content"]: a["id"] for a in tok["added_tokens"]}
config = {
    "tokenizer_class": "Qwen2Tokenizer",
    "model_max_length": 8192,
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "add_bos_token": False,
    "added_tokens_decoder": {str(a["id"]): {"content": a["content"], "special": True} for a in tok["added_tokens"]},
}
json.dump(config, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
print(f"{len(vocab)} ranks, {len(merges)} merges, specials {special['<|endoftext|>']}..{max(special.values())}")
print(f"<|im_end|> = {special['<|im_end|>']}, <|endoftext|> = {special['<|endoftext|>']}")
