"""The fixture model: a tiny, deterministic .slm for fast tests of everything downstream
(validator, CPU engine, GPU kernels). `python -m webslm.fixture OUT.slm` writes it.

Shape: 2 layers, 4 query heads, 2 KV heads (GQA), head_dim 12, hidden 48, ffn 72, vocab 300
(297 tokens: the embedding has 3 padding rows), context 64, q/k/v biases, untied output,
partial rotary (rotary_dim 8 < head_dim 12), adjacent-pair RoPE, position_offset 0.
48 and 72 are not multiples of 32 or 64, so every quantized row ends in a partial block.

Every tensor kind of format v1 appears, each q8/q4 kind with both block sizes and both scale
types somewhere (`ENCODINGS` below is this table as data):

    tensor               shape     encoding   zero     block  scale   tail (real elements of the last block)
    token_embd           300x48    q8         -        32     f16     16
    output_norm          48        f32
    output               300x48    q4         min      32     f16     16
    blk.0.attn_norm      48        f32
    blk.0.attn_q         48x48     q4         offset   32     f16     16
    blk.0.attn_k         24x48     q4         min      64     f32     48
    blk.0.attn_v         24x48     q8         -        64     f32     48
    blk.0.attn_output    48x48     f16
    blk.0.ffn_norm       48        f16
    blk.0.ffn_gate       72x48     q4         min      32     f32     16
    blk.0.ffn_up         72x48     q4         offset   64     f16     48
    blk.0.ffn_down       48x72     q8         -        32     f16     8
    blk.0.attn_q.bias    48        f32
    blk.0.attn_k.bias    24        f16
    blk.0.attn_v.bias    24        f32
    blk.1.attn_norm      48        f16
    blk.1.attn_q         48x48     q8         -        32     f32     16
    blk.1.attn_k         24x48     q4         offset   32     f32     16
    blk.1.attn_v         24x48     q4         min      32     f16     16
    blk.1.attn_output    48x48     f32
    blk.1.ffn_norm       48        f32
    blk.1.ffn_gate       72x48     q8         -        64     f16     48
    blk.1.ffn_up         72x48     q4         min      64     f16     48
    blk.1.ffn_down       48x72     q4         offset   64     f32     8
    blk.1.attn_q.bias    48        f16
    blk.1.attn_k.bias    24        f32
    blk.1.attn_v.bias    24        f16

Weights are seeded normals at realistic scales (embeddings 0.5, projections 1/sqrt(fan_in),
norm weights 1 +- 0.1, biases 0.1). Rows 1-4 of every matrix are adversarial for the codecs:
a constant row (zero range: q4 "min" scale 0), a row of the tensor's largest magnitude with
random signs (every code at an extreme), alternating signs with a magnitude ramp, and a row
whose only large value sits in the partial last block (the tail).

Tokenizer: GPT-2 byte-level BPE; ids 0-255 are the bytes 0-255 as GPT-2's byte-to-unicode
mapping spells them, then one token per merge (`MERGES`), then <|endoftext|>, <|im_start|>,
<|im_end|>. Chat template: ChatML. Nothing here depends on the platform: the file's sha256 is
pinned in tests/test_fixture.py.
"""
from __future__ import annotations

import hashlib
import sys
import zlib

import numpy as np

from .artifact import format as fmt
from .artifact.quant import encode_f16, encode_f32, quantize_q4, quantize_q8
from .artifact.writer import TensorRecord, canonical_json, quant_descriptor, write_slm
from .semantic.tokenizer import bytes_to_unicode

SEED = 20261130
GENERATOR = "webslm.fixture v1"     # not the package version: the pinned sha256 must not move with releases

ARCHITECTURE = {
    "family": "llama",
    "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 12,
    "hidden": 48, "ffn": 72, "vocab": 300, "context_length": 64,
    "norm_eps": 1e-05, "tied_output": False, "qkv_bias": True,
    "rope": {"base": 10000.0, "rotary_dim": 8, "convention": "adjacent-pair",
             "position_offset": 0, "scaling": None},
}

# name -> (encoding, q4 zero or None, block_elements or None, scale_type or None)
ENCODINGS: dict[str, tuple[str, str | None, int | None, str | None]] = {
    "token_embd": ("q8", None, 32, "f16"),
    "output_norm": ("f32", None, None, None),
    "output": ("q4", "min", 32, "f16"),
    "blk.0.attn_norm": ("f32", None, None, None),
    "blk.0.attn_q": ("q4", "offset", 32, "f16"),
    "blk.0.attn_k": ("q4", "min", 64, "f32"),
    "blk.0.attn_v": ("q8", None, 64, "f32"),
    "blk.0.attn_output": ("f16", None, None, None),
    "blk.0.ffn_norm": ("f16", None, None, None),
    "blk.0.ffn_gate": ("q4", "min", 32, "f32"),
    "blk.0.ffn_up": ("q4", "offset", 64, "f16"),
    "blk.0.ffn_down": ("q8", None, 32, "f16"),
    "blk.0.attn_q.bias": ("f32", None, None, None),
    "blk.0.attn_k.bias": ("f16", None, None, None),
    "blk.0.attn_v.bias": ("f32", None, None, None),
    "blk.1.attn_norm": ("f16", None, None, None),
    "blk.1.attn_q": ("q8", None, 32, "f32"),
    "blk.1.attn_k": ("q4", "offset", 32, "f32"),
    "blk.1.attn_v": ("q4", "min", 32, "f16"),
    "blk.1.attn_output": ("f32", None, None, None),
    "blk.1.ffn_norm": ("f32", None, None, None),
    "blk.1.ffn_gate": ("q8", None, 64, "f16"),
    "blk.1.ffn_up": ("q4", "min", 64, "f16"),
    "blk.1.ffn_down": ("q4", "offset", 64, "f32"),
    "blk.1.attn_q.bias": ("f16", None, None, None),
    "blk.1.attn_k.bias": ("f32", None, None, None),
    "blk.1.attn_v.bias": ("f16", None, None, None),
}

# Merges in priority order, GPT-2 spelling (Ġ = space, Ċ = newline). Each side is a byte or an
# earlier merge's result; they cover common English, the ChatML roles, a digit pair, a
# doubled newline and a two-byte UTF-8 character (é = C3 A9 = "Ã©").
MERGES = [
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "r e", "a t", "e n",
    "in g", "Ġ s", "Ġ w", "o u", "i s", "Ġ o", "Ġ c", "Ġ i", "e s", "o r",
    "Ġ h", "s t", "Ġa n", "Ġan d", "u s", "us er", "a s", "as s", "ass is", "assis t",
    "a n", "an t", "assist ant", "s y", "sy st", "e m", "syst em", "Ċ Ċ", "1 2", "Ã ©",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Deliberately not transformers' defaults, so a reader that ignores a field shows it.
GENERATION = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
              "repetition_penalty": 1.1, "max_new_tokens": 32}


def fixture_tokenizer() -> dict:
    """The manifest's tokenizer section."""
    byte_map = bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    for merge in MERGES:
        left, right = merge.split(" ")
        if left not in tokens or right not in tokens or left + right in tokens:
            raise ValueError(f"fixture merge {merge!r} must join two existing tokens into a new one")
        tokens.append(left + right)
    specials = [{"id": len(tokens) + i, "content": s} for i, s in enumerate(SPECIAL_TOKENS)]
    tokens += SPECIAL_TOKENS
    index = {t: i for i, t in enumerate(tokens)}
    return {
        "model": "bpe", "byte_level": True, "byte_fallback": False, "pre_tokenizer": "gpt2",
        "tokens": tokens, "merges": list(MERGES), "special_tokens": specials,
        "bos_id": index["<|endoftext|>"], "eos_ids": [index["<|im_end|>"], index["<|endoftext|>"]],
        "pad_id": None, "unk_id": None, "add_bos": False, "add_eos": False,
    }


def _adversarial_rows(w: np.ndarray, rng: np.random.Generator) -> None:
    """Overwrite rows 1-4 of a matrix with the codec edge cases the module docstring lists."""
    rows, cols = w.shape
    peak = float(np.abs(w).max())
    w[1] = 0.37 * peak                                                  # constant: zero range
    w[2] = peak * np.where(rng.random(cols) < 0.5, -1.0, 1.0)           # every element at max |w|
    w[3] = np.where(np.arange(cols) % 2 == 0, 1.0, -1.0) * np.linspace(0.05, 1.0, cols) * peak
    w[4] = 0.01 * rng.standard_normal(cols)                             # small everywhere ...
    w[4, cols - 1] = 1.5 * peak                                         # ... but one spike in the tail block


def fixture_weights() -> dict[str, np.ndarray]:
    """Every tensor's float32 values before encoding, in table order. Each tensor has its own
    generator (seeded with SEED and the name's CRC-32), so adding a tensor moves no other."""
    weights = {}
    for name, shape in fmt.required_tensors(ARCHITECTURE).items():
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
        if len(shape) == 1:
            if name.endswith(".bias"):
                w = 0.1 * rng.standard_normal(shape)
            else:
                w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            scale = 0.5 if name == "token_embd" else 1.0 / np.sqrt(shape[1])
            w = scale * rng.standard_normal(shape)
            _adversarial_rows(w, rng)
        weights[name] = w.astype(np.float32)
    return weights


def _record(name: str, w: np.ndarray) -> TensorRecord:
    encoding, zero, block, scale_type = ENCODINGS[name]
    rows = w.reshape(1, -1) if w.ndim == 1 else w
    if encoding == "f32":
        return TensorRecord(name, w.shape, "f32", None, encode_f32(rows))
    if encoding == "f16":
        return TensorRecord(name, w.shape, "f16", None, encode_f16(rows))
    if encoding == "q8":
        return TensorRecord(name, w.shape, "q8", quant_descriptor("q8", w.shape[1], block, "none", scale_type),
                            quantize_q8(w, block, scale_type))
    return TensorRecord(name, w.shape, "q4", quant_descriptor("q4", w.shape[1], block, zero, scale_type),
                        quantize_q4(w, block, zero, scale_type))


def fixture_manifest() -> dict:
    # The recipe's hash stands in for a source file's: it changes exactly when the fixture does.
    recipe = hashlib.sha256(canonical_json({"generator": GENERATOR, "seed": SEED, "architecture": ARCHITECTURE,
                                            "encodings": ENCODINGS, "merges": MERGES})).hexdigest()
    return {
        "format": fmt.FORMAT_NAME, "version": fmt.VERSION,
        "architecture": ARCHITECTURE, "tokenizer": fixture_tokenizer(),
        "chat_template": {"format": "jinja", "template": CHAT_TEMPLATE},
        "generation": dict(GENERATION),
        "source": {"format": "fixture", "file": "webslm/fixture.py", "sha256": recipe,
                   "converter": GENERATOR,
                   "notes": ["seeded random weights for tests; not a language model"]},
    }


def make_fixture(path) -> str:
    """Write the fixture to `path` (a file path or a binary file object); return its sha256."""
    if set(ENCODINGS) != set(fmt.required_tensors(ARCHITECTURE)):
        raise ValueError("fixture ENCODINGS must name exactly the architecture's tensors")
    records = [_record(name, w) for name, w in fixture_weights().items()]
    return write_slm(path, fixture_manifest(), records)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m webslm.fixture OUT.slm", file=sys.stderr)
        return 2
    print(f"{argv[0]}: sha256 {make_fixture(argv[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
