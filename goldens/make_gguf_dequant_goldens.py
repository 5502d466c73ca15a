#!/usr/bin/env python3
"""Dequantization goldens: random GGUF blocks of each type Weft expands itself, and gguf-py's
reference float32 expansion of them.

Usage (from the repo root): .venv/bin/python goldens/make_gguf_dequant_goldens.py

Writes goldens/gguf/dequant/<TYPE>.bin: the raw blocks, and <TYPE>.f32: gguf-py's
`gguf.quants.dequantize` output as little-endian float32. Half-precision scale fields are
replaced by finite values so no block holds NaN/inf. Deterministic (seeded).
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parent / "gguf" / "dequant"
# byte offsets of f16 scale fields inside each block
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
N_BLOCKS = 24


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261129)
    for qtype, fields in HALF_FIELDS.items():
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint8)
        for at in fields:
            halves = rng.uniform(-0.05, 0.05, size=N_BLOCKS).astype(np.float16)
            raw[:, at:at + 2] = halves.view(np.uint8).reshape(N_BLOCKS, 2)
        values = dequantize(raw.reshape(-1), qtype).astype("<f4")
        assert values.size == N_BLOCKS * block_elems and np.isfinite(values).all()
        (OUT / f"{qtype.name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{qtype.name}.f32").write_bytes(values.tobytes())
        print(qtype.name, N_BLOCKS, "blocks")


if __name__ == "__main__":
    main()
