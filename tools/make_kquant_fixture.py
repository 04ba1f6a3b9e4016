#!/usr/bin/env python3
"""Makes spindle's K-quant GGUF fixture: a tiny random-weight `qwen3_5_moe` checkpoint whose
every projection has rows of a multiple of 256 (the K-quant block), converted to a bf16 GGUF
by `tools/gguf_from_fixture.py` and quantized by llama.cpp's own `llama-quantize`
(`tools/llama_quantize.sh` builds it). Beside each quantized file it writes
`NAME.dequantized.json`: for every tensor its ggml type, dimensions and the SHA-256 of its
values as `gguf.quants.dequantize` gives them (f32, little-endian, ggml order), so the test
can check spindle's dequantization of the whole file bit for bit without a 14 MB f32 copy in
the repository (the test writes that copy itself and checks it against these sums).

Usage: make_kquant_fixture.py LLAMA_QUANTIZE OUT_DIR [--types Q4_K_M Q5_K_M] [--work DIR]
Needs: pip install gguf numpy (gguf 0.19.0 was used), models/demo's tokenizer files.
"""
import argparse
import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
NAME = "qwen35moe_k256"

# Every projection's input width (the GGUF row) is 256 or 512: hidden 256, experts' and the
# shared expert's intermediate 256, attention heads 2 x 128 and GDN value heads 4 x 64.
CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe",
    "dtype": "bfloat16",
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "full_attention_interval": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                        "mrope_section": [6, 5, 5]},
    "tie_word_embeddings": False,
    "eos_token_id": [4065, 4063],
}


def bf16(a):
    """Rounds to bf16 (nearest even), as the uint16 bit patterns."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, a in sorted(tensors.items()):
        raw = bf16(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def checkpoint(rng):
    """The Hugging Face tensors: projections N(0, 1/in), RMSNorm offsets (stored w, applied
    1 + w) small, the GDN's A_log, dt_bias and conv as a trained model's magnitudes."""
    c = CONFIG
    H, V, E = c["hidden_size"], c["vocab_size"], c["num_experts"]
    I, S = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    nq, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    hk, hv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    proj = lambda rows, cols: rng.standard_normal((rows, cols)) / np.sqrt(cols)
    norm = lambda n: rng.standard_normal(n) * 0.1
    t = {"model.embed_tokens.weight": rng.standard_normal((V, H)),
         "lm_head.weight": proj(V, H) * 4.0,
         "model.norm.weight": norm(H)}
    for l, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        if kind == "linear_attention":
            conv = 2 * nk * hk + nv * hv
            t[p + "linear_attn.in_proj_qkv.weight"] = proj(conv, H)
            t[p + "linear_attn.in_proj_z.weight"] = proj(nv * hv, H)
            t[p + "linear_attn.in_proj_a.weight"] = proj(nv, H)
            t[p + "linear_attn.in_proj_b.weight"] = proj(nv, H)
            t[p + "linear_attn.conv1d.weight"] = rng.standard_normal((conv, 1, c["linear_conv_kernel_dim"])) * 0.3
            t[p + "linear_attn.A_log"] = np.log(rng.uniform(1.0, 16.0, nv))
            t[p + "linear_attn.dt_bias"] = rng.uniform(0.5, 1.5, nv)
            t[p + "linear_attn.norm.weight"] = 1.0 + norm(hv)
            t[p + "linear_attn.out_proj.weight"] = proj(H, nv * hv)
        else:
            t[p + "self_attn.q_proj.weight"] = proj(2 * nq * hd, H)
            t[p + "self_attn.k_proj.weight"] = proj(nkv * hd, H)
            t[p + "self_attn.v_proj.weight"] = proj(nkv * hd, H)
            t[p + "self_attn.o_proj.weight"] = proj(H, nq * hd)
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "mlp.gate.weight"] = proj(E, H)
        t[p + "mlp.experts.gate_up_proj"] = rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)
        t[p + "mlp.experts.down_proj"] = rng.standard_normal((E, H, I)) / np.sqrt(I)
        t[p + "mlp.shared_expert.gate_proj.weight"] = proj(S, H)
        t[p + "mlp.shared_expert.up_proj.weight"] = proj(S, H)
        t[p + "mlp.shared_expert.down_proj.weight"] = proj(H, S)
        t[p + "mlp.shared_expert_gate.weight"] = proj(1, H)
    return {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}


def dequantized_tensors(path):
    """(name, ggml type name, ne, f32 values) for every tensor of a GGUF file."""
    out = []
    for t in gguf.GGUFReader(str(path)).tensors:
        ty = gguf.GGMLQuantizationType(t.tensor_type)
        values = gguf.quants.dequantize(np.asarray(t.data), ty).astype(np.float32, copy=False)
        ne = [int(n) for n in t.shape]
        assert values.size == int(np.prod(ne)), t.name
        out.append((t.name, ty.name, ne, np.ascontiguousarray(values).reshape(-1)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_quantize", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--types", nargs="+", default=["Q4_K_M"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/kquant-fixture"))
    args = ap.parse_args()

    hf = args.work / "hf"
    shutil.rmtree(args.work, ignore_errors=True)
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(ROOT / "models/demo" / f, hf / f)
    write_safetensors(hf / "model.safetensors", checkpoint(np.random.default_rng(18)))

    source = args.work / f"{NAME}.bf16.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/gguf_from_fixture.py"), str(hf), str(source),
                    "--type", "bf16"], check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for qtype in args.types:
        quantized = args.out / f"{NAME}.{qtype}.gguf"
        subprocess.run([str(args.llama_quantize), str(source), str(quantized), qtype], check=True,
                       stdout=subprocess.DEVNULL)
        tensors = dequantized_tensors(quantized)
        counts = {}
        for _, ty, _, _ in tensors:
            counts[ty] = counts.get(ty, 0) + 1
        print(f"{quantized}: {quantized.stat().st_size} bytes, tensor types {counts}")
        record = {
            "file": quantized.name,
            "made_by": "llama-quantize (llama.cpp vendored in PyPI llama-cpp-python 0.3.36) "
                       f"from {source.name} ({NAME}, tools/make_kquant_fixture.py), type {qtype}",
            "dequantized_by": "gguf.quants.dequantize (PyPI gguf 0.19.0)",
            "tensors": [{"name": n, "type": ty, "ne": ne,
                         "sha256_f32": hashlib.sha256(v.astype("<f4").tobytes()).hexdigest()}
                        for n, ty, ne, v in tensors],
        }
        rows = ",\n".join("  " + json.dumps(t) for t in record.pop("tensors"))
        text = json.dumps(record, indent=1)[:-2] + ',\n "tensors": [\n' + rows + "\n ]\n}"
        (args.out / f"{NAME}.{qtype}.dequantized.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
