#!/usr/bin/env python3
"""Writes a GGUF file from a spindle fixture (a small Hugging Face checkpoint), laid out as
llama.cpp's converter lays out these architectures, for spindle's GGUF tests.

The converter (`convert_hf_to_gguf.py`, `conversion/qwen.py` in the llama.cpp tree carried by
PyPI's `llama-cpp-python` sdist 0.3.36) needs torch, which this machine and CI lack, so this
script applies the same transforms with numpy, following:
- `Qwen3NextModel.modify_tensors`: A_log -> -exp(A_log) (`ssm_a`), dt_bias -> `ssm_dt.bias`,
  conv1d squeezed, every `*norm.weight` but `linear_attn.norm.weight` stored as w + 1,
  `in_proj_qkvz` (qwen3next) split into `attn_qkv` + `attn_gate`;
- `_LinearAttentionVReorderBase.modify_tensors` (qwen35, qwen35moe, when key heads < value
  heads): the value heads reordered from grouped-by-key-head to tiled in `in_proj_qkv`'s V
  rows, `in_proj_z`, `in_proj_a`/`in_proj_b`, `A_log`, `dt_bias`, the conv's V channels and
  `out_proj`'s columns;
- `Qwen2MoeModel.modify_tensors`: per-expert tensors stacked into `ffn_{gate,up,down}_exps`,
  fused `gate_up_proj` split into gate and up;
- `TextModel.set_gguf_parameters`, `Qwen2MoeModel.set_gguf_parameters`,
  `Qwen3NextModel.set_gguf_parameters`, `_Qwen35MRopeMixin`: the metadata keys.
Names come from `gguf.get_tensor_name_map`. Quantized types come from `gguf.quants.quantize`;
with --dequantized OUT the script also writes the same model with every quantized tensor
replaced by `gguf.quants.dequantize` of it (F32): the exact reference for the quantized file.

Usage: gguf_from_fixture.py FIXTURE_DIR OUT.gguf --type bf16|f32|q8_0|q4_0
       [--experts-type q4_0] [--dequantized OUT_DEQ.gguf] [--split-max-tensors N]
Needs: pip install gguf numpy (gguf 0.19.0 was used).
"""
import argparse
import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

TYPES = {"f32": T.F32, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}


def read_safetensors(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        dt = info["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        else:
            continue
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def load_fixture(d):
    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        if f.name != "reference.safetensors":
            tensors.update(read_safetensors(f))
    config = json.loads((d / "config.json").read_text())
    return tensors, config.get("text_config", config), config


def reorder_v_heads(t, dim, nk, per_k, head_dim):
    # _LinearAttentionVReorderBase._reorder_v_heads: grouped -> tiled.
    shape = list(t.shape)
    dim = dim % len(shape)
    new_shape = shape[:dim] + [nk, per_k, head_dim] + shape[dim + 1:]
    t = t.reshape(new_shape)
    perm = list(range(len(new_shape)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return np.ascontiguousarray(t.transpose(perm)).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="bf16", choices=TYPES)
    ap.add_argument("--experts-type", choices=TYPES)
    ap.add_argument("--dequantized", type=Path)
    ap.add_argument("--split-max-tensors", type=int, default=0,
                    help="write a split set (NAME-00001-of-0000N.gguf) of at most this many tensors per file")
    args = ap.parse_args()

    tensors, h, top = load_fixture(args.fixture)
    mt = h["model_type"]
    arch = {"qwen3_5_moe_text": gguf.MODEL_ARCH.QWEN35MOE, "qwen3_5_moe": gguf.MODEL_ARCH.QWEN35MOE,
            "qwen3_5_text": gguf.MODEL_ARCH.QWEN35, "qwen3_5": gguf.MODEL_ARCH.QWEN35,
            "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT}[mt]
    n_layers = h["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(arch, n_layers)
    nk, nv = h["linear_num_key_heads"], h["linear_num_value_heads"]
    hk, hv = h["linear_key_head_dim"], h["linear_value_head_dim"]
    per_k = nv // nk
    reorder = arch != gguf.MODEL_ARCH.QWEN3NEXT and nk != nv

    # Strip the VLM prefix, as the converter does for the text model.
    items = {}
    for name, t in tensors.items():
        if name.startswith("model.visual.") or name.startswith("mtp."):
            continue
        items[name.replace("model.language_model.", "model.")] = t

    out = []  # (gguf name, array)
    experts = {}
    for name, t in sorted(items.items()):
        parts = name.split(".")
        bid = int(parts[2]) if name.startswith("model.layers.") else None
        # _LinearAttentionVReorderBase
        if reorder and "linear_attn." in name:
            if ".in_proj_qkv." in name:
                q = 2 * hk * nk
                t = np.concatenate([t[:q], reorder_v_heads(t[q:], 0, nk, per_k, hv)], axis=0)
            elif ".in_proj_z." in name:
                t = reorder_v_heads(t, 0, nk, per_k, hv)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                t = reorder_v_heads(t, 0, nk, per_k, 1)
            elif ".A_log" in name or ".dt_bias" in name:
                t = reorder_v_heads(t[:, None], 0, nk, per_k, 1)[:, 0]
            elif ".conv1d" in name:
                d = t.squeeze()
                qk = hk * nk * 2
                t = np.concatenate([d[:qk], reorder_v_heads(d[qk:], 0, nk, per_k, hv)], axis=0)
            elif ".out_proj." in name:
                t = reorder_v_heads(t, 1, nk, per_k, hv)
        # Qwen3NextModel
        if name.endswith(".A_log"):
            t = -np.exp(t)
        elif name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if "in_proj_qkvz.weight" in name:
            split = [hk, hk, per_k * hv, per_k * hv]
            d = t.T.reshape(-1, nk, sum(split))
            q, k, v, z = np.split(d, np.cumsum(split)[:-1], axis=-1)
            flat = lambda x: x.reshape(t.shape[1], -1)
            qkv = np.concatenate([flat(q), flat(k), flat(v)], axis=-1).T
            out.append((f"blk.{bid}.attn_qkv.weight", qkv))
            out.append((f"blk.{bid}.attn_gate.weight", flat(z).T))
            continue
        # Qwen2MoeModel
        if name.endswith("mlp.experts.down_proj"):
            out.append((f"blk.{bid}.ffn_down_exps.weight", t))
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            n_ff = t.shape[-2] // 2
            out.append((f"blk.{bid}.ffn_gate_exps.weight", t[..., :n_ff, :]))
            out.append((f"blk.{bid}.ffn_up_exps.weight", t[..., n_ff:, :]))
            continue
        if ".mlp.experts." in name:
            experts.setdefault(bid, {})[name] = t
            continue
        suffix = ".bias" if name.endswith(".bias") else ".weight"
        base = name[: -len(suffix)] if name.endswith(suffix) else name
        mapped = tmap.get_name(base)
        if mapped is None:
            raise SystemExit(f"no GGUF name for {name}")
        out.append((mapped + (suffix if name.endswith((".weight", ".bias")) else ""), t))
    for bid, d in experts.items():
        n_exp = h["num_experts"]
        for w in ["down_proj", "gate_proj", "up_proj"]:
            stacked = np.stack([d[f"model.layers.{bid}.mlp.experts.{e}.{w}.weight"] for e in range(n_exp)])
            gname = {"down_proj": "ffn_down_exps", "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps"}[w]
            out.append((f"blk.{bid}.{gname}.weight", stacked))

    def write(path, dequantize):
        w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch],
                            split_max_tensors=0 if dequantize else args.split_max_tensors)
        w.add_block_count(n_layers)
        w.add_context_length(h.get("max_position_embeddings", 4096))
        w.add_embedding_length(h["hidden_size"])
        if "intermediate_size" in h:
            w.add_feed_forward_length(h["intermediate_size"])
        w.add_head_count(h["num_attention_heads"])
        w.add_head_count_kv(h["num_key_value_heads"])
        rope = h.get("rope_parameters", {})
        w.add_rope_freq_base(rope.get("rope_theta", h.get("rope_theta", 10000.0)))
        w.add_layer_norm_rms_eps(h["rms_norm_eps"])
        if "num_experts" in h:
            w.add_expert_count(h["num_experts"])
            w.add_expert_used_count(h["num_experts_per_tok"])
        w.add_key_length(h["head_dim"])
        w.add_value_length(h["head_dim"])
        if "moe_intermediate_size" in h:
            w.add_expert_feed_forward_length(h["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in h:
            w.add_expert_shared_feed_forward_length(h["shared_expert_intermediate_size"])
        w.add_ssm_conv_kernel(h["linear_conv_kernel_dim"])
        w.add_ssm_state_size(hk)
        w.add_ssm_group_count(nk)
        w.add_ssm_time_step_rank(nv)
        w.add_ssm_inner_size(hv * nv)
        # Written by key: PyPI's gguf 0.19.0 predates these writer helpers.
        an = gguf.MODEL_ARCH_NAMES[arch]
        w.add_array(f"{an}.attention.recurrent_layers", [t == "linear_attention" for t in h["layer_types"]])
        w.add_uint32(f"{an}.full_attention_interval", h.get("full_attention_interval", 4))
        partial = rope.get("partial_rotary_factor", h.get("partial_rotary_factor", 0.25))
        w.add_rope_dimension_count(int(h["head_dim"] * partial))
        if arch != gguf.MODEL_ARCH.QWEN3NEXT:
            w.add_rope_dimension_sections([11, 11, 10, 0])
        eos = h.get("eos_token_id", top.get("eos_token_id"))
        if isinstance(eos, list):
            eos = eos[0]
        if eos is not None:
            w.add_eos_token_id(eos)
        for gname, t in out:
            t = np.ascontiguousarray(t, dtype=np.float32)
            is_expert = "_exps." in gname
            ty = TYPES[args.experts_type] if (is_expert and args.experts_type) else TYPES[args.type]
            keep_f32 = (t.ndim < 2 or "ffn_gate_inp" in gname or "ssm_conv1d" in gname
                        or (ty not in (T.F32, T.BF16) and t.shape[-1] % 32 != 0))
            if keep_f32 or ty == T.F32:
                w.add_tensor(gname, t)
                continue
            q = gguf.quants.quantize(t, ty)
            if dequantize and ty != T.BF16:
                w.add_tensor(gname, gguf.quants.dequantize(q, ty).astype(np.float32))
            else:
                w.add_tensor(gname, q, raw_dtype=ty)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write(args.out, False)
    if args.dequantized:
        write(args.dequantized, True)


if __name__ == "__main__":
    main()
