#!/usr/bin/env python3
"""Runs llama.cpp's own `convert_hf_to_gguf.py` on a spindle fixture, for checking spindle's GGUF
mapping against files the real converter writes (spindle's `tools/gguf_from_fixture.py`
re-implements its transforms with numpy, for machines without torch).

The fixtures carry token ids only (no tokenizer files), so every `_set_vocab_*` helper of the
converter writes no vocabulary: the GGUF then holds the weights and the model metadata, as the
files in `fixtures/gguf/` do.

Usage: llama_convert.py LLAMA_CPP_DIR FIXTURE_DIR OUT.gguf [converter options, e.g. --outtype bf16]
Needs torch, numpy and the llama.cpp tree (convert_hf_to_gguf.py, conversion/, gguf-py/).
"""
import runpy
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    tree, fixture, out, *options = sys.argv[1:]
    tree = Path(tree)
    sys.path.insert(0, str(tree / "gguf-py"))
    sys.path.insert(0, str(tree))
    import conversion.base as base

    for name in dir(base.TextModel):
        if name.startswith("_set_vocab_"):
            setattr(base.TextModel, name, lambda self, *a, **k: None)
    sys.argv = [str(tree / "convert_hf_to_gguf.py"), fixture, "--outfile", out, *options]
    runpy.run_path(str(tree / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
