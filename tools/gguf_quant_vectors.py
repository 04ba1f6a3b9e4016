#!/usr/bin/env python3
"""Writes test vectors for spindle's ggml dequantizers: `OUT.gguf` holds one tensor per type
(Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16, BF16) of random blocks (random code bytes, scales drawn as
f16 in a sane range), and `OUT_REF.gguf` the same tensors as F32 dequantized by the `gguf`
package's `gguf.quants.dequantize` (gguf 0.19.0), the reference the Rust dequantizers must
match exactly.

Usage: gguf_quant_vectors.py OUT.gguf OUT_REF.gguf
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

rng = np.random.default_rng(18)
ROWS, COLS = 3, 512


def random_blocks(ty):
    block, size = gguf.GGML_QUANT_SIZES[ty]
    n = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    f16 = lambda k: rng.uniform(-2, 2, size=(n, k)).astype(np.float16).view(np.uint8)
    if ty in (T.Q8_0, T.Q4_0):
        raw[:, 0:2] = f16(1)
    elif ty in (T.Q4_K, T.Q5_K):
        raw[:, 0:4] = f16(2)  # d and dmin
    elif ty == T.Q6_K:
        raw[:, 208:210] = f16(1)
    return raw.reshape(ROWS, COLS // block * size)


def main():
    out, ref = sys.argv[1], sys.argv[2]
    wq = gguf.GGUFWriter(out, "quant_vectors")
    wr = gguf.GGUFWriter(ref, "quant_vectors")
    for ty in [T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K]:
        q = random_blocks(ty)
        wq.add_tensor(ty.name.lower(), q, raw_dtype=ty)
        wr.add_tensor(ty.name.lower(), gguf.quants.dequantize(q, ty).astype(np.float32))
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    wq.add_tensor("f16", x.astype(np.float16))
    wr.add_tensor("f16", x.astype(np.float16).astype(np.float32))
    b = gguf.quants.quantize(x, T.BF16)
    wq.add_tensor("bf16", b, raw_dtype=T.BF16)
    wr.add_tensor("bf16", gguf.quants.dequantize(b, T.BF16).astype(np.float32))
    for w in (wq, wr):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    main()
