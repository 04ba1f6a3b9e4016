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
- `Qwen4ExpTextModel` (`conversion/qwen4exp.py`, arch `qwen4exp`): everything above (it derives
  from `_LinearAttentionVReorderBase`, `_Qwen35MRopeMixin`, `no_mtp`), plus `modify_tensors`:
  the int64 PLE buffers (`layer_multipliers`, `ngram_heads_offsets`, `ngram_heads_vocab_sizes`)
  go to UINT64 array keys, not tensors; `ngram_embedding.shard_*` concatenated by index into
  `per_layer_token_embd.weight` (`_place_ple_shard`); `indexer.index_qk_proj` split into
  `indexer.q_proj` (first n_i*d_i rows) and `indexer.k_proj`; `ple.norm_{key,query,conv}` and
  `indexer.{q,k}_layernorm` stored as w + 1 (once); `ple.conv1d` squeezed; the inherited
  `norm.weight` rule also turns every `hc_norm.weight` into w + 1. `set_gguf_parameters`: the
  hyper-connection, indexer, compress-ratio and PLE keys. The installed gguf 0.19.0 lacks
  QWEN4EXP, so its qwen4exp-only names and keys are written by hand here, copied from the tree's
  `gguf-py/gguf/constants.py` (`MODEL_TENSORS[QWEN4EXP]`, `Keys.PerLayerEmbedding`,
  `Keys.HyperConnection`, `Keys.Attention.Indexer`) and `tensor_mapping.py`; the names it
  shares with qwen35moe come from qwen35moe's name map. One deliberate departure: the converter
  writes a layer's compress ratio only where `layer_types[i] == "full_attention"` (the released
  config's spelling), so on the fixture, whose config uses transformers' newer
  "qwen_sparse_attention", it would write 0 for every layer and leave no QSA ratio in the file;
  this script treats every non-linear layer as "full_attention", as the released config does.
Names come from `gguf.get_tensor_name_map`. Quantized types come from `gguf.quants.quantize`;
with --dequantized OUT the script also writes the same model with every quantized tensor
replaced by `gguf.quants.dequantize` of it (F32): the exact reference for the quantized file.

With --random-q4-k-m (benchmarks of a big synthetic checkpoint, where the layout matters and
the values do not) every matrix gets the type llama-quantize's Q4_K_M gives it (Q6_K: the LM
head, and `attn_v` / `ffn_down*` of the layers `use_more_bits` picks; Q4_K: the others whose
rows are whole superblocks; the router and 1-D tensors f32) holding random, well-scaled
blocks (Q4_K: d in [1e-4, 3e-4], dmin = 7.5 d and each group's min equal to its scale, so a
weight is d·sc·(q − 7.5); Q6_K: d in [1e-5, 3e-5]); the routed experts' values are not even
read (a `spindle synth --zero-experts` checkpoint converts in seconds). Not llama-quantize's
output: its quantization search is not run; only the file layout is Q4_K_M's.

Usage: gguf_from_fixture.py FIXTURE_DIR OUT.gguf --type bf16|f32|q8_0|q4_0
       [--experts-type q4_0] [--dequantized OUT_DEQ.gguf] [--split-max-tensors N]
       [--random-q4-k-m]
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


# Set by --random-q4-k-m: the routed experts' values are not read (random blocks replace them).
SKIP_EXPERT_VALUES = False


def read_safetensors(path, ints=None):
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
        if SKIP_EXPERT_VALUES and ".mlp.experts." in name and dt in ("BF16", "F16", "F32"):
            out[name] = np.broadcast_to(np.float32(0), info["shape"])
            continue
        if dt == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        elif dt == "I64" and ints is not None:
            ints[name] = [int(x) for x in np.frombuffer(raw, dtype="<i8")]
            continue
        else:
            continue
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def load_fixture(d):
    tensors, ints = {}, {}
    for f in sorted(d.glob("*.safetensors")):
        if f.name != "reference.safetensors":
            tensors.update(read_safetensors(f, ints))
    config = json.loads((d / "config.json").read_text())
    return tensors, ints, config.get("text_config", config), config


QWEN4EXP = "qwen4exp"
# constants.py TENSOR_NAMES for the qwen4exp-only tensors (tensor_mapping.py gives the HF names).
QWEN4EXP_NAMES = {
    "attn_hyper_connection.hc_norm": "hc_attn_norm",
    "attn_hyper_connection.input_mix_weight_down": "hc_attn_down",
    "attn_hyper_connection.input_mix_weight_up": "hc_attn_up",
    "attn_hyper_connection.block_inject_weight": "hc_attn_inject",
    "mlp_hyper_connection.hc_norm": "hc_ffn_norm",
    "mlp_hyper_connection.input_mix_weight_down": "hc_ffn_down",
    "mlp_hyper_connection.input_mix_weight_up": "hc_ffn_up",
    "mlp_hyper_connection.block_inject_weight": "hc_ffn_inject",
    "self_attn.indexer.q_layernorm": "indexer.q_norm",
    "self_attn.indexer.k_layernorm": "indexer.k_norm",
    "ple.key_proj": "ple_key",
    "ple.value_proj": "ple_value",
    "ple.norm_key": "ple_norm_key",
    "ple.norm_query": "ple_norm_query",
    "ple.norm_conv": "ple_norm_conv",
    "ple.conv1d": "ple_conv1d",
}
QWEN4EXP_HEAD = {
    "model.hyper_connection_mixer.hc_norm.weight": "output_hc_norm.weight",
    "model.hyper_connection_mixer.input_mix_weight_down.weight": "output_hc_down.weight",
    "model.hyper_connection_mixer.input_mix_weight_up.weight": "output_hc_up.weight",
}


def qwen4exp_tensor(name, t, bid, h, ple):
    """`Qwen4ExpTextModel.modify_tensors`: the (name, array) pairs it writes for `name`, or
    None when the tensor takes the inherited path."""
    if name in QWEN4EXP_HEAD:
        return [(QWEN4EXP_HEAD[name], t + 1 if name.endswith("hc_norm.weight") else t)]
    if ".ngram_embedding.shard_" in name:
        idx = int(name.rpartition(".shard_")[2].partition(".")[0])
        ple["shards"][idx] = t
        ple["row_dim"] = int(t.shape[-1])
        if len(ple["shards"]) < h["split_ngram_parts"]:
            return []
        table = np.concatenate([ple["shards"][i] for i in sorted(ple["shards"])], axis=0)
        return [("per_layer_token_embd.weight", table)]
    if ".indexer.index_qk_proj.weight" in name:
        n_q = h["indexer_n_heads"] * h["indexer_head_dim"]
        return [(f"blk.{bid}.indexer.q_proj.weight", t[:n_q]),
                (f"blk.{bid}.indexer.k_proj.weight", t[n_q:])]
    base = name[len(f"model.layers.{bid}."):].rpartition(".weight")[0] if bid is not None else None
    if base not in QWEN4EXP_NAMES:
        return None
    gname = f"blk.{bid}.{QWEN4EXP_NAMES[base]}.weight"
    if base.endswith(("norm_key", "norm_query", "norm_conv", "q_layernorm", "k_layernorm", "hc_norm")):
        # the explicit Gemma rule for PLE/indexer norms; the inherited norm.weight rule for hc_norm
        return [(gname, t + 1)]
    if base == "ple.conv1d":
        return [(gname, t.squeeze())]
    return [(gname, t)]


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
    ap.add_argument("--random-q4-k-m", action="store_true",
                    help="random blocks in the types of llama-quantize's Q4_K_M (benchmarks only)")
    args = ap.parse_args()
    global SKIP_EXPERT_VALUES
    SKIP_EXPERT_VALUES = args.random_q4_k_m
    rng = np.random.default_rng(0x5eed)

    tensors, ints, h, top = load_fixture(args.fixture)
    mt = h["model_type"]
    is_q4 = mt in ("qwen4_exp", "qwen4_exp_text")
    if is_q4:
        # names shared with Qwen3.5-MoE come from its map; the rest from QWEN4EXP_NAMES
        mt = "qwen3_5_moe_text"
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
    ple = {"shards": {}, "row_dim": None}
    for name, t in sorted(items.items()):
        parts = name.split(".")
        bid = int(parts[2]) if name.startswith("model.layers.") else None
        if is_q4:
            done = qwen4exp_tensor(name, t, bid, h, ple)
            if done is not None:
                out.extend(done)
                continue
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
        an = QWEN4EXP if is_q4 else gguf.MODEL_ARCH_NAMES[arch]
        w = gguf.GGUFWriter(str(path), an,
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
        if is_q4:
            write_qwen4exp_keys(w, an, {**top, **h}, ints, ple["row_dim"])
        for gname, t in out:
            if args.random_q4_k_m and t.ndim >= 2 and "ffn_gate_inp" not in gname and "conv1d" not in gname:
                ty = q4_k_m_type(gname, n_layers)
                if ty is not None and t.shape[-1] % 256 == 0:
                    w.add_tensor(gname, random_k_blocks(t.shape, ty, rng), raw_dtype=ty)
                    continue
            t = np.ascontiguousarray(t, dtype=np.float32)
            is_expert = "_exps." in gname
            ty = TYPES[args.experts_type] if (is_expert and args.experts_type) else TYPES[args.type]
            keep_f32 = (t.ndim < 2 or "ffn_gate_inp" in gname or "conv1d" in gname
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


def q4_k_m_type(gname, n_layers):
    """llama-quantize's Q4_K_M pick for a matrix: Q6_K for the LM head and for attn_v /
    ffn_down* of the layers use_more_bits selects, Q4_K otherwise."""
    if gname == "output.weight":
        return T.Q6_K
    if gname.startswith("blk.") and (".attn_v." in gname or ".ffn_down" in gname):
        i = int(gname.split(".")[1])
        more = i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2
        return T.Q6_K if more else T.Q4_K
    return T.Q4_K


def random_k_blocks(shape, ty, rng):
    """Random Q4_K / Q6_K blocks for a matrix of `shape`, as uint8 rows of blocks."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    nb = rows * cols // 256
    size = 144 if ty == T.Q4_K else 210
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if ty == T.Q4_K:
        d = rng.uniform(1e-4, 3e-4, nb).astype(np.float16)
        b[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
        b[:, 2:4] = (d.astype(np.float32) * 7.5).astype(np.float16).view(np.uint8).reshape(nb, 2)
        # Mins equal to scales: the packed mins (bytes 4..8 of the 12) copy the scales' bytes,
        # and the high nibbles of bytes 8..12 their low nibbles.
        b[:, 8:12] = b[:, 4:8]
        low = b[:, 12:16] & 0x0F
        b[:, 12:16] = low | (low << 4)
    else:
        d = rng.uniform(1e-5, 3e-5, nb).astype(np.float16)
        b[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(*shape[:-1], cols // 256 * size)


def write_qwen4exp_keys(w, an, h, ints, ple_row_dim):
    """`Qwen4ExpTextModel.set_gguf_parameters` (keys from the tree's constants.py); `h` is the
    text config over the top-level one, as the converter's hparams are."""
    u32 = gguf.GGUFValueType.UINT32
    u64 = gguf.GGUFValueType.UINT64
    arr = gguf.GGUFValueType.ARRAY
    w.add_uint32(f"{an}.hyper_connection.count", h["hc_count"])
    w.add_uint32(f"{an}.hyper_connection.low_rank", h["hc_lowrank"])
    w.add_uint32(f"{an}.attention.indexer.head_count", h["indexer_n_heads"])
    w.add_uint32(f"{an}.attention.indexer.key_length", h["indexer_head_dim"])
    w.add_uint32(f"{an}.attention.indexer.top_k", h["indexer_budget"])
    ratio = h["indexer_compress_ratio"]
    # see the docstring: every non-linear layer counts as "full_attention"
    w.add_key_value(f"{an}.attention.compress_ratios",
                    [ratio if t != "linear_attention" else 0 for t in h["layer_types"]], arr, sub_type=u32)
    ple_layers = [i - 1 for i in h.get("ple_layer_ids", [])]
    if not ple_layers:
        return
    w.add_key_value(f"{an}.ple.layers", ple_layers, arr, sub_type=u32)
    w.add_uint32(f"{an}.ple.ngram_size", h["ngram_size"])
    w.add_uint32(f"{an}.ple.heads_per_ngram", h["heads_per_ngram"])
    w.add_uint32(f"{an}.ple.conv_kernel", h["ple_conv_kernel_size"])
    eos = h.get("eos_token_id")
    w.add_uint32(f"{an}.ple.eos_token_id", int(eos[-1] if isinstance(eos, list) else eos))
    if h.get("image_token_id") is not None:
        w.add_uint32(f"{an}.ple.image_token_id", int(h["image_token_id"]))
    if ple_row_dim is not None:
        w.add_uint32(f"{an}.embedding_length_per_layer_input", ple_row_dim)

    def constant(suffix):  # _read_hash_constants: the first tensor with that suffix
        for name in ints:
            if name.endswith(suffix):
                return ints[name]
        raise SystemExit(f"PLE constant {suffix!r} missing from the checkpoint")

    w.add_key_value(f"{an}.ple.layer_multipliers", constant("ple_embedding.layer_multipliers"), arr, sub_type=u64)
    w.add_key_value(f"{an}.ple.head_offsets", constant("ple_embedding.ngram_heads_offsets"), arr, sub_type=u64)
    w.add_key_value(f"{an}.ple.head_vocab_sizes", constant("ple_embedding.ngram_heads_vocab_sizes"), arr, sub_type=u64)


if __name__ == "__main__":
    main()
