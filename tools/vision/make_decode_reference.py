"""Reference for spindle-vision's whole `prepare` path and its JPEG decoder, from
transformers 5.17.0 (Qwen2VLImageProcessor, torchvision backend) and Pillow.

Writes to OUT_DIR:
- `rgba.png`: a 75x100 RGBA PNG (LCG pixels, seed 7, alpha random) saved by Pillow;
  `rgba.resized.u8`: the processor's resized image [224, 320, 3] recovered from its
  `pixel_values` (u8 = round(x * 127.5 + 127.5), exact for x = (u8 - 127.5) / 127.5);
- `photo.jpg`: a smooth 64x96 RGB image saved by Pillow as JPEG (quality 85, 4:2:0);
  `photo.pil.u8`: Pillow's decoding of it [64, 96, 3].
- `cases.json`: sizes, grids and versions.

Usage: python make_decode_reference.py OUT_DIR
"""
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor


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
    proc = Qwen2VLImageProcessor(
        size={"longest_edge": 16777216, "shortest_edge": 65536}, patch_size=16,
        temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    rgba = np.frombuffer(lcg_bytes(7, 75 * 100 * 4), dtype=np.uint8).reshape(75, 100, 4)
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    (out / "rgba.png").write_bytes(buf.getvalue())
    img = Image.open(io.BytesIO(buf.getvalue()))
    res = proc(images=[img], return_tensors="np")
    pv, (t, gh, gw) = res["pixel_values"], res["image_grid_thw"][0]
    x = pv.reshape(gh // 2, gw // 2, 2, 2, 3, 2, 16, 16)[:, :, :, :, :, 0]
    # [bh, bw, ih, iw, C, py, px] -> [bh, ih, py, bw, iw, px, C] = [H, W, 3]
    x = x.transpose(0, 2, 5, 1, 3, 6, 4).reshape(gh * 16, gw * 16, 3)
    u8 = np.rint(x.astype(np.float64) * 127.5 + 127.5)
    assert np.abs(u8 - (x * 127.5 + 127.5)).max() < 1e-3
    (out / "rgba.resized.u8").write_bytes(u8.astype(np.uint8).tobytes())
    yy, xx = np.mgrid[0:64, 0:96]
    smooth = np.stack([
        128 + 100 * np.sin(xx / 9.0) * np.cos(yy / 7.0),
        128 + 90 * np.cos((xx + yy) / 11.0),
        (xx * 2 + yy) % 256,
    ], axis=-1).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(smooth, "RGB").save(buf, format="JPEG", quality=85, subsampling=2)
    (out / "photo.jpg").write_bytes(buf.getvalue())
    dec = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    (out / "photo.pil.u8").write_bytes(dec.tobytes())
    meta = {"transformers": transformers.__version__, "pillow": PIL.__version__,
            "rgba": {"in": [75, 100], "grid": [int(t), int(gh), int(gw)], "resized": [int(gh) * 16, int(gw) * 16]},
            "photo": {"size": [64, 96]}}
    (out / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
