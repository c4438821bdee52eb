"""Random GGUF blocks (adversarial ones included) and a small .slm holding every q5 and
super-block tensor kind, for tests/test_kquant.py and the validator corpus.

`gguf_blocks(qtype, rows, nblocks, rng)` makes raw GGUF rows: every code byte random, and the
f16 scale fields drawn from ordinary values and the extremes (the largest finite f16, the
smallest subnormal, signed zeros, negative values), with some blocks at the extreme codes
(all bits set, all clear) and K sub-scales at 0 and 63 (Q6_K's at -128 and 127).

`kquant_slm()` is a 1-layer llama-family model (hidden 256: K rows need whole 256-blocks)
whose matrices are written from such blocks through the converter's own block splitter.
"""
from __future__ import annotations

import hashlib

import numpy as np
from gguf import GGMLQuantizationType as GT

from webslm import fixture
from webslm.artifact import format as fmt
from webslm.artifact.quant import encode_f32
from webslm.artifact.writer import TensorRecord, quant_descriptor, write_slm
from webslm.convert.gguf_blocks import FIELDS, LOSSLESS, split_blocks

F16_MAX = np.float16(65504.0)
F16_TINY = np.float16(2.0 ** -24)          # the smallest positive subnormal
SPECIAL_SCALES = np.array([F16_MAX, -F16_MAX, F16_TINY, -F16_TINY, 0.0, -0.0, 1.0, -1.0,
                           np.float16(6.1035e-05), np.float16(-3.0e-3)], np.float16)


def gguf_blocks(qtype, rows: int, nblocks: int, rng: np.random.Generator,
                adversarial: bool = True) -> np.ndarray:
    """Raw GGUF rows [rows, nblocks * block bytes] (uint8) of `qtype`, finite scales."""
    _, _, _, size = LOSSLESS[qtype]
    blocks = rng.integers(0, 256, (rows, nblocks, size), dtype=np.uint8)
    at = 0
    for name, length in FIELDS[qtype]:
        field = blocks[:, :, at:at + length]
        if name in ("d", "m"):                         # f16 scale / min
            values = (rng.standard_normal((rows, nblocks)) * 0.02).astype(np.float16)
            if adversarial:
                pick = rng.random((rows, nblocks)) < 0.3
                values[pick] = rng.choice(SPECIAL_SCALES, pick.sum())
            field[...] = values.astype("<f2").view(np.uint8).reshape(rows, nblocks, 2)
        elif adversarial and name in ("qs", "ql", "qh"):
            field[0, 0] = 0xFF                           # every code at its maximum
            if nblocks > 1:
                field[0, 1] = 0x00                       # every code at its minimum
        elif adversarial and name == "scales":
            field[0, 0] = 0xFF                           # K: sub-scales and mins 63; Q6_K: -1
            if nblocks > 1:
                field[0, 1] = 0x00
            if qtype == GT.Q6_K and rows > 1:
                field[1, 0] = np.array([127, 128] * 8, np.uint8)   # int8 127 and -128
        at += length
    return blocks.reshape(rows, nblocks * size)


ARCHITECTURE = {
    "family": "llama",
    "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 128,
    "hidden": 256, "ffn": 512, "vocab": 300, "context_length": 64,
    "norm_eps": 1e-06, "tied_output": True, "qkv_bias": False,
    "rope": {"base": 10000.0, "rotary_dim": 128, "convention": "rotate-half",
             "position_offset": 0, "scaling": None},
}

# every q5 and super-block kind, each once, plus Q8_0 for the embedding
GGUF_TYPES = {
    "token_embd": GT.Q8_0,
    "blk.0.attn_q": GT.Q4_K,
    "blk.0.attn_k": GT.Q5_K,
    "blk.0.attn_v": GT.Q6_K,
    "blk.0.attn_output": GT.Q5_0,
    "blk.0.ffn_gate": GT.Q5_1,
    "blk.0.ffn_up": GT.Q4_K,
    "blk.0.ffn_down": GT.Q6_K,
}


def kquant_records(seed: int = 7) -> tuple[list[TensorRecord], dict[str, np.ndarray]]:
    """The model's tensors, and the raw GGUF rows each quantized one was split from."""
    rng = np.random.default_rng(seed)
    records, raw = [], {}
    for name, shape in fmt.required_tensors(ARCHITECTURE).items():
        if len(shape) == 1:
            records.append(TensorRecord(name, shape, "f32", None,
                                        encode_f32((1 + 0.1 * rng.standard_normal((1, shape[0]))).astype(np.float32))))
            continue
        qtype = GGUF_TYPES[name]
        _, _, block, _ = LOSSLESS[qtype]
        raw[name] = gguf_blocks(qtype, shape[0], shape[1] // block, rng)
        encoding, zero, parts = split_blocks(qtype, raw[name])
        records.append(TensorRecord(name, shape, encoding, quant_descriptor(encoding, shape[1], block, zero), parts))
    return records, raw


def kquant_manifest() -> dict:
    return {
        "format": fmt.FORMAT_NAME, "version": fmt.VERSION, "architecture": ARCHITECTURE,
        "tokenizer": fixture.fixture_tokenizer(),
        "chat_template": {"format": "jinja", "template": fixture.CHAT_TEMPLATE},
        "generation": dict(fixture.GENERATION),
        "source": {"format": "fixture", "file": "tests/kquant_model.py",
                   "sha256": hashlib.sha256(b"kquant_model v1").hexdigest(),
                   "converter": "tests/kquant_model.py", "notes": ["random GGUF blocks; not a language model"]},
    }


def kquant_slm(path) -> str:
    records, _ = kquant_records()
    return write_slm(path, kquant_manifest(), records)
