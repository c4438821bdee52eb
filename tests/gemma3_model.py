"""A tiny Gemma 3 artifact for tests: its architecture, a small "gemma" SentencePiece tokenizer
(specials, Gemma-style added tokens, the 256 byte tokens, a few merged pieces) and a writer
taking weights (transformers' in tests/test_gemma3_cpu.py; seeded normals by default), with the
matrices stored as f32, f16 or q8 (tests/test_gpu_gemma3_native.py runs each on the GPU)."""
from __future__ import annotations

import hashlib

import numpy as np

from webslm.artifact import format as fmt
from webslm.artifact.quant import encode_f16, encode_f32, quantize_q8
from webslm.artifact.writer import TensorRecord, quant_descriptor, write_slm
from webslm.convert.gguf_tokenizer import GEMMA3_CHAT_TEMPLATE, merges_from_vocabulary

LAYER_TYPES = ["sliding", "full", "sliding"]
QUERY_PRE_ATTN_SCALAR = 24
ARCHITECTURE = {
    "family": "gemma3", "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32,
    "hidden": 64, "ffn": 96, "vocab": 300, "context_length": 64, "norm_eps": 1e-06,
    "tied_output": True, "qkv_bias": False,
    "rope": {"base": 1000000.0, "rotary_dim": 32, "convention": "rotate-half", "position_offset": 0,
             "scaling": None},
    "gemma3": {"embedding_scale": 64 ** 0.5, "norm_weight_offset": 1.0, "activation": "gelu-tanh",
               "attention_scale": QUERY_PRE_ATTN_SCALAR ** -0.5, "sliding_window": 8,
               "layer_types": LAYER_TYPES, "local_rope_base": 10000.0},
}

# A small SentencePiece vocabulary: specials, Gemma-style added tokens, the 256 byte tokens,
# and a few pieces whose merges merges_from_vocabulary recovers.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
ADDED = ["\n", "\n\n", "\t"]
PIECES = ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "bc", "abc", "\u2581\u2581", "ca", "\u2581c", "cab"]
TOKENS = SPECIALS + ADDED + [f"<0x{b:02X}>" for b in range(256)] + PIECES


def tokenizer_section() -> dict:
    return {
        "model": "bpe", "byte_level": False, "byte_fallback": True, "pre_tokenizer": "gemma",
        "tokens": TOKENS, "merges": merges_from_vocabulary(TOKENS),
        "special_tokens": [{"id": i, "content": t} for i, t in enumerate(SPECIALS)],
        "added_tokens": [{"id": TOKENS.index(t), "content": t} for t in ADDED],
        "bos_id": 2, "eos_ids": [1, 5], "pad_id": 0, "unk_id": 3, "add_bos": True, "add_eos": False,
    }


def manifest() -> dict:
    return {
        "format": fmt.FORMAT_NAME, "version": fmt.VERSION, "architecture": ARCHITECTURE,
        "tokenizer": tokenizer_section(),
        "chat_template": {"format": "jinja", "template": GEMMA3_CHAT_TEMPLATE},
        "generation": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.0,
                       "repetition_penalty": 1.0, "max_new_tokens": 32},
        "source": {"format": "fixture", "file": "tests/test_gemma3_cpu.py",
                   "sha256": hashlib.sha256(b"tiny gemma3 v1").hexdigest(), "converter": "tests",
                   "notes": ["transformers' random Gemma3 init; not a language model"]},
    }




def random_weights(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * (0.5 if len(shape) == 1 else 0.2)).astype(np.float32)
            for name, shape in fmt.required_tensors(ARCHITECTURE).items()}


MATRIX_ENCODINGS = ("f32", "f16", "q8")      # what the GPU reads (the K-quants are another branch's)


def write(path, weights: dict[str, np.ndarray] | None = None, matrices: str = "f32") -> str:
    """The artifact, matrices (the embedding included) stored as `matrices` (f32, f16 or q8,
    block 32), vectors f32; returns its sha256."""
    weights = random_weights() if weights is None else weights
    records = []
    for name, shape in fmt.required_tensors(ARCHITECTURE).items():
        w = weights[name].reshape(-1, shape[-1]).astype(np.float32)
        if len(shape) == 1 or matrices == "f32":
            records.append(TensorRecord(name, shape, "f32", None, encode_f32(w)))
        elif matrices == "f16":
            records.append(TensorRecord(name, shape, "f16", None, encode_f16(w)))
        elif matrices == "q8":
            records.append(TensorRecord(name, shape, "q8", quant_descriptor("q8", shape[1], 32, "none"),
                                        quantize_q8(w, 32)))
        else:
            raise ValueError(f"matrices must be one of {MATRIX_ENCODINGS}, not {matrices!r}")
    return write_slm(path, manifest(), records)
