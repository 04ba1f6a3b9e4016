"""Reference outputs of torchvision's uint8 bicubic antialiased resize (what transformers'
Qwen2VLImageProcessor runs) for spindle-vision's resize test.

Inputs are made by a 31-bit LCG (state = state * 1103515245 + 12345 mod 2^31, byte = state >> 16
& 255, seeded per case) so the Rust test regenerates them; only the outputs are stored:
`fixtures/vision_resize/{name}.u8` (raw [h, w, 3] bytes) and `cases.json`.

Usage: python make_resize_reference.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
import torchvision
from torchvision.transforms.v2 import functional as tvF
from torchvision.transforms import InterpolationMode

CASES = [
    # name, seed, (h, w) in, (h, w) out
    ("down_both", 1, (123, 217), (64, 96)),
    ("up_both", 2, (50, 70), (96, 128)),
    ("up_h_down_w", 3, (40, 150), (64, 96)),
    ("down_w_only", 4, (64, 100), (64, 64)),
    ("smart_375x500", 5, (375, 500), (384, 512)),
    ("big_down", 6, (700, 333), (96, 64)),
]


def lcg_bytes(seed, n):
    state = seed
    out = bytearray(n)
    for i in range(n):
        state = (state * 1103515245 + 12345) % (1 << 31)
        out[i] = (state >> 16) & 255
    return bytes(out)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "call": "tvF.resize(uint8 [3,h,w], [h_out, w_out], InterpolationMode.BICUBIC, antialias=True)",
        "input": "LCG bytes, [h, w, 3] row-major: state = (state * 1103515245 + 12345) % 2**31 from state = seed, byte = (state >> 16) & 255",
        "cases": [],
    }
    for name, seed, (h, w), (ho, wo) in CASES:
        data = lcg_bytes(seed, h * w * 3)
        img = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(h, w, 3).permute(2, 0, 1)
        img = img.contiguous()
        res = tvF.resize(img, [ho, wo], interpolation=InterpolationMode.BICUBIC, antialias=True)
        assert res.dtype == torch.uint8
        (out / f"{name}.u8").write_bytes(res.permute(1, 2, 0).contiguous().numpy().tobytes())
        meta["cases"].append({"name": name, "seed": seed, "in": [h, w], "out": [ho, wo]})
    (out / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
