"""Write a .slm artifact with RANDOM weights of a given shape, fast, for GPU speed benchmarks.

    .venv/bin/python bench/synthetic_model.py --shape llama1b --out /tmp/llama1b-synthetic.slm
    .venv/bin/python bench/synthetic_model.py --shape smollm2 --out /tmp/smollm2-synthetic.slm
    .venv/bin/python bench/synthetic_model.py --shape tiny --out /tmp/tiny.slm   # tests
    .venv/bin/python bench/synthetic_model.py --shape llama1b --encoding q4k_m --out /tmp/llama1b-q4km.slm

Shapes (`SHAPES`):
    llama1b   Llama-3.2-1B: 16 layers, hidden 2048, ffn 8192, 32 heads / 8 KV heads, head_dim 64,
              vocab 128256, context 131072, RoPE base 500000, tied output
    llama8b   Llama-3.1-8B: 32 layers, hidden 4096, ffn 14336, 32 heads / 8 KV heads, head_dim 128,
              vocab 128256 (output tied here; separate in the real model, same bytes a token)
    smollm2   SmolLM2-135M: 30 layers, hidden 576, ffn 1536, 9 heads / 3 KV heads, head_dim 64,
              vocab 49152, context 8192, RoPE base 100000, tied output
    tiny      2 layers, hidden 48, ffn 80, 4 heads / 2 KV heads, head_dim 12, vocab 320, context 64:
              48 and 80 are not multiples of 32, so every quantized row ends in a partial block
    stacked   2 layers, hidden 128, ffn 256, 4 heads / 2 KV heads, head_dim 32, vocab 384, context
              320: the smallest test shape the planner stacks (q|k|v and gate|up one matrix each),
              so the fully fused decode step runs; past 256 positions attention takes two passes
    kquant    2 layers, hidden 256, ffn 512, 4 heads / 2 KV heads, head_dim 64, vocab 384, context
              64: the smallest test shape whose rows hold whole 256-element super-blocks
    qwen2     stacked with q/k/v projection biases (Qwen2-style; f32, normal with std 0.5)
    wide_heads  2 layers, hidden 256, ffn 512, 1 head / 1 KV head, head_dim 256 (Gemma 3's), vocab
              384, context 8192: attention at Gemma's head_dim in a model small enough for lavapipe
    gemma3_270m  Gemma 3 270M: 18 layers (sliding window 512, every 6th global), hidden 640, ffn 2048,
              4 heads / 1 KV head, head_dim 256, vocab 262144, context 32768, family gemma3

Encodings (`--encoding`, SCHEMES):
    q4      (default) those of the converted SmolLM2-135M-Instruct (Q4_1 GGUF) artifact: every
            layer matrix q4 (block 32, zero "min", f16 scales and mins), token_embd q8 (block 32,
            f16 scales), norm vectors f32, output tied to the embedding
    q4k_m   llama.cpp's Q4_K_M mix: layer matrices q4k, attn_v and ffn_down q6k in the layers
            llama.cpp gives more bits (the first and last eighth, and every third in between:
            its use_more_bits), token_embd q6k (it is also the tied output, which llama.cpp
            keeps in Q6_K); norms f32. Rows must hold whole 256-element super-blocks
    kmix    every encoding the kernels read, for tests: attn_q q4k, attn_k q5k, attn_v q6k,
            attn_output q5 "offset" (block 32), ffn_gate q5 "min" (block 64, f32 scales),
            ffn_up q4k, ffn_down q8; token_embd q6k
    kmix_layers  encodings mixed ACROSS layers, as the real Gemma 3 270M Q4_K_M GGUF mixes them
            (its hidden 640 is no multiple of 256, so llama.cpp falls back to Q5_0 / Q8_0):
            attn_q, attn_k q5 "offset" (Q5_0), attn_output q4k, and in the layers llama.cpp
            gives more bits (use_more_bits) attn_v q8 and ffn_down q6k, in the others q5
            "offset" and q4k; ffn_gate and ffn_up q5 "offset", but q8 in the more-bits layers
            (a step beyond the GGUF: so that the stacked gate|up mat-vec differs across layers
            too); token_embd q8. With 2 layers, layer 1 is a more-bits layer and layer 0 not.
The K-quant parts are made like the others (random codes and high bits); sub-scales are
random in 32..63 (q6k: either sign) and the mins are set so that each sub-block decodes to
values around zero with the same standard deviation as the q4 weights. RoPE is "rotate-half" with scaling null: format v1
has no RoPE scaling, so llama1b lacks Llama 3's llama3 frequency scaling (irrelevant to speed;
stated in the manifest's source.notes).

Weights are made directly in the encoded form, never quantized from floats: codes are random
bytes (q8: every int8 -128..127; q4: two uniform nibbles per byte) with the padding codes past
`cols` zeroed as the validator requires; per-block scales are small positive f16 and q4 mins
are -7.5 x scale (jittered), so a q4 block decodes to roughly uniform values around zero with
standard deviation ~ 1/sqrt(cols), q8 embeddings to ~ 2/sqrt(hidden). Norm weights 1 +- 0.05.
Each tensor has its own generator (SEED, CRC-32 of the name): the file is a pure function of
(shape, seed, context length), and adding a tensor moves no other.

Memory stays bounded: webslm.artifact.writer.write_slm needs every tensor's sha256 before the
payload (the table precedes it), so it reads each tensor's parts twice (once to hash, once to
write). The parts given to it are a lazy mapping that generates a tensor's parts on first access
and keeps only the most recent tensor, so the writer's two passes generate each tensor twice
and at most one tensor (llama1b's embedding: 279 MB) is held at a time.

Tokenizer: the fixture's byte-level BPE (webslm.fixture: 256 byte tokens, 40 merges, ChatML
specials <|endoftext|> <|im_start|> <|im_end|>, ChatML template) followed by placeholder tokens
so that every id below vocab has a token (the format allows len(tokens) < vocab, but sampling
from random logits reaches every id and the stream decoder needs a token for each): placeholder
i is "Ġ" + a lowercase pseudo-word, so random output decodes to space-separated words.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import os
import pathlib
import resource
import sys
import time
import zlib
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if importlib.util.find_spec("webslm") is None:   # a checkout without the package installed
    sys.path.insert(0, str(ROOT / "py"))

from webslm import fixture  # noqa: E402
from webslm.artifact import format as fmt  # noqa: E402
from webslm.artifact.writer import TensorRecord, canonical_json, quant_descriptor, write_slm  # noqa: E402

GENERATOR = "webslm.synthetic v1"
SEED = 20261201
BLOCK = 32

SHAPES = {
    "llama1b": {"n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "head_dim": 64, "hidden": 2048,
                "ffn": 8192, "vocab": 128256, "context_length": 131072, "rope_base": 500000.0,
                "notes": ["Llama-3.2-1B's shape; its llama3 RoPE scaling (factor 32, low 1, high 4, "
                          "original 8192) is dropped: format v1 has no RoPE scaling"]},
    "llama8b": {"n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "hidden": 4096,
                "ffn": 14336, "vocab": 128256, "context_length": 131072, "rope_base": 500000.0,
                "notes": ["Llama-3.1-8B's shape (the bandwidth regime: ~4.4 GB of q4 layers a token); its "
                          "output matrix is separate, here tied to the embedding: the same bytes a token"]},
    "smollm2": {"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "hidden": 576,
                "ffn": 1536, "vocab": 49152, "context_length": 8192, "rope_base": 100000.0,
                "notes": ["SmolLM2-135M's shape"]},
    "tiny": {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 12, "hidden": 48,
             "ffn": 80, "vocab": 320, "context_length": 64, "rope_base": 10000.0,
             "notes": ["a tiny shape for tests; rows end in partial blocks"]},
    "kquant": {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 64, "hidden": 256,
               "ffn": 512, "vocab": 384, "context_length": 64, "rope_base": 10000.0,
               "notes": ["a tiny shape for tests whose rows hold whole 256-element super-blocks"]},
    "stacked": {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "hidden": 128,
                "ffn": 256, "vocab": 384, "context_length": 320, "rope_base": 10000.0,
                "notes": ["a tiny shape for tests that the planner stacks: every q/k/v and gate/up part "
                          "is a whole number of 256-byte units and the decode outputs lie back to back"]},
    "wide_heads": {"n_layers": 2, "n_heads": 1, "n_kv_heads": 1, "head_dim": 256, "hidden": 256,
                   "ffn": 512, "vocab": 384, "context_length": 8192, "rope_base": 10000.0,
                   "notes": ["a small test shape with Gemma 3's head_dim 256"]},
}
# Gemma 3 270M's shape (family gemma3: sliding window 512 with every 6th layer global, local
# RoPE base 1e4, GeGLU, q/k norms, post norms, 262k-row tied embedding); norm_weight_offset 0,
# as the GGUF converter writes it (llama.cpp stores 1 + w).
SHAPES["gemma3_270m"] = {
    "n_layers": 18, "n_heads": 4, "n_kv_heads": 1, "head_dim": 256, "hidden": 640, "ffn": 2048,
    "vocab": 262144, "context_length": 32768, "rope_base": 1000000.0,
    "gemma3": {"embedding_scale": 640 ** 0.5, "norm_weight_offset": 0.0, "activation": "gelu-tanh",
               "attention_scale": 256 ** -0.5, "sliding_window": 512,
               "layer_types": ["full" if (i + 1) % 6 == 0 else "sliding" for i in range(18)],
               "local_rope_base": 10000.0},
    "notes": ["Gemma 3 270M's shape and layer pattern, q4/q8 encodings like the other shapes"]}
# Qwen2-style: the stacked shape with q/k/v projection biases (f32, random normal).
SHAPES["qwen2"] = {**SHAPES["stacked"], "qkv_bias": True,
                   "notes": ["the stacked test shape with Qwen2's q/k/v projection biases"]}


def architecture(shape: str, context_length: int | None = None) -> dict:
    s = SHAPES[shape]
    gemma = {"gemma3": s["gemma3"]} if "gemma3" in s else {}
    return {
        "family": "gemma3" if gemma else "llama", **gemma,
        "n_layers": s["n_layers"], "n_heads": s["n_heads"], "n_kv_heads": s["n_kv_heads"],
        "head_dim": s["head_dim"], "hidden": s["hidden"], "ffn": s["ffn"], "vocab": s["vocab"],
        "context_length": context_length or s["context_length"],
        "norm_eps": 1e-05, "tied_output": True, "qkv_bias": s.get("qkv_bias", False),
        "rope": {"base": s["rope_base"], "rotary_dim": s["head_dim"], "convention": "rotate-half",
                 "position_offset": 0, "scaling": None},
    }


# -- tokenizer -----------------------------------------------------------------------------------

def _pseudo_words():
    """'aaa', 'aab', ..., 'zzz', 'aaaa', ...: lowercase words of 3 letters and more, in order."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for length in itertools.count(3):
        for word in itertools.product(letters, repeat=length):
            yield "".join(word)


def tokenizer(vocab: int) -> dict:
    """The fixture's tokenizer padded with placeholder tokens to exactly `vocab` tokens."""
    t = fixture.fixture_tokenizer()
    tokens = list(t["tokens"])
    if len(tokens) > vocab:
        raise ValueError(f"vocab {vocab} is smaller than the base tokenizer ({len(tokens)} tokens)")
    taken = set(tokens)
    words = _pseudo_words()
    while len(tokens) < vocab:
        token = "\u0120" + next(words)          # "Ġ" + word: decodes to " word"
        if token not in taken:
            taken.add(token)
            tokens.append(token)
    return dict(t, tokens=tokens)


# -- weights -------------------------------------------------------------------------------------

class Form(NamedTuple):
    """How a tensor is encoded: encoding, zero kind, block, scale type."""
    encoding: str
    zero: str = "none"
    block: int | None = None
    scale_type: str = "f16"


F32, Q8, Q4 = Form("f32"), Form("q8", "none", BLOCK), Form("q4", "min", BLOCK)
Q4K, Q5K, Q6K = Form("q4k", "scaled-min", 256), Form("q5k", "scaled-min", 256), Form("q6k", "offset", 256)
SCHEMES = ("q4", "q4k_m", "kmix", "kmix_layers")
Q5_0 = Form("q5", "offset", 32)


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the layers its Q4_K_M gives Q6_K attn_v and ffn_down."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def encoding(name: str, scheme: str = "q4", n_layers: int = 1) -> Form:
    """A tensor's Form under `scheme` (the module docstring)."""
    if name.endswith("_norm") or name.endswith(".bias"):
        return F32
    if scheme == "q4":
        return Q8 if name == "token_embd" else Q4
    if name == "token_embd":
        return Q8 if scheme == "kmix_layers" else Q6K
    layer = int(name.split(".")[1])
    kind = name.split(".")[2]
    if scheme == "q4k_m":
        return Q6K if kind in ("attn_v", "ffn_down") and more_bits(layer, n_layers) else Q4K
    if scheme == "kmix":
        return {"attn_q": Q4K, "attn_k": Q5K, "attn_v": Q6K, "attn_output": Form("q5", "offset", 32),
                "ffn_gate": Form("q5", "min", 64, "f32"), "ffn_up": Q4K,
                "ffn_down": Q8}[kind]
    if scheme == "kmix_layers":
        more = more_bits(layer, n_layers)
        return {"attn_q": Q5_0, "attn_k": Q5_0, "attn_v": Q8 if more else Q5_0, "attn_output": Q4K,
                "ffn_gate": Q8 if more else Q5_0, "ffn_up": Q8 if more else Q5_0,
                "ffn_down": Q6K if more else Q4K}[kind]
    raise ValueError(f"no encoding scheme {scheme!r}; known: {SCHEMES}")


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n uniformly random bytes, fast (the bit generator's raw 64-bit output)."""
    return rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n]


def _jitter(rng: np.random.Generator, shape: tuple[int, int], spread: float) -> np.ndarray:
    """float32 uniform in [1 - spread, 1 + spread)."""
    return (1.0 - spread) + (2.0 * spread) * rng.random(shape, dtype=np.float32)


# Standard deviation of uniform codes: int8 -128..127, 0..15, 0..31, 0..63.
CODE_STD = {"q8": 73.9, "q4": 4.61, "q5": 9.23, "q4k": 4.61, "q5k": 9.23, "q6k": 18.47}


def packed_parts(rng: np.random.Generator, form: Form, rows: int, cols: int, sigma: float) -> dict:
    """q5 and super-block parts whose values are around zero with standard deviation ~ sigma."""
    enc, block = form.encoding, form.block
    blocks = rows * (cols // block)
    parts = {"codes": _random_bytes(rng, rows * cols // 2)}
    if enc in ("q5", "q5k", "q6k"):
        parts["high_bits"] = _random_bytes(rng, rows * cols * (2 if enc == "q6k" else 1) // 8)
    middle = {"q5": 15.5, "q4k": 7.5, "q5k": 15.5}.get(enc)        # the mean code the zero cancels
    if enc == "q5":
        scale = (sigma / CODE_STD[enc]) * _jitter(rng, (blocks,), 0.25)
        parts["scales"] = scale.astype(fmt_dtype(form.scale_type))
        if form.zero == "min":
            parts["mins"] = (-middle * scale * _jitter(rng, (blocks,), 0.1)).astype(fmt_dtype(form.scale_type))
        return parts
    subs = rows * cols // fmt.SUB_BLOCK_ELEMENTS[enc]
    sub_scales = rng.integers(32, 64, subs).astype(np.int16)           # mean 47.5
    d = (sigma / (CODE_STD[enc] * 47.5)) * _jitter(rng, (blocks,), 0.25)
    parts["scales"] = d.astype("<f2")
    if enc == "q6k":
        parts["sub_scales"] = (sub_scales * rng.choice(np.array([-1, 1], np.int16), subs)).astype(np.int8)
        return parts
    # dmin = d * middle and a sub-min within 2 of the sub-scale: dmin m ~ d sc middle, the mean
    # of (d sc) c, so a sub-block decodes to values around zero
    parts["mins"] = (d * middle).astype("<f2")
    parts["sub_scales"] = sub_scales.astype(np.uint8)
    parts["sub_mins"] = np.clip(sub_scales + rng.integers(-2, 3, subs), 0, 63).astype(np.uint8)
    return parts


def fmt_dtype(scale_type: str) -> str:
    return "<f2" if scale_type == "f16" else "<f4"


def make_parts(name: str, shape: tuple[int, ...], seed: int, scheme: str = "q4",
               n_layers: int = 1) -> dict[str, memoryview]:
    """A tensor's encoded parts, generated directly (see the module docstring)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    form = encoding(name, scheme, n_layers)
    enc, zero = form.encoding, form.zero
    if enc == "f32" and name.endswith(".bias"):          # Qwen2's biases: large next to q, k, v
        w = (0.5 * rng.standard_normal(shape[0])).astype("<f4")
        return {"data": memoryview(w.view(np.uint8))}
    if enc == "f32":
        w = (1.0 + 0.05 * rng.standard_normal(shape[0])).astype("<f4")
        return {"data": memoryview(w.view(np.uint8))}
    rows, cols = shape
    sigma = (2.0 if name == "token_embd" else 1.0) / cols ** 0.5
    if enc not in ("q8", "q4"):
        parts = packed_parts(rng, form, rows, cols, sigma)
        expected = fmt.part_lengths(enc, zero, rows, cols, form.block, 2 if form.scale_type == "f16" else 4)
        out = {k: memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8)) for k, v in parts.items()}
        assert {k: len(v) for k, v in out.items()} == expected, (name, expected)
        return out
    blocks = fmt.blocks_per_row(cols, BLOCK)
    stride = fmt.row_stride(enc, cols, BLOCK)
    codes = _random_bytes(rng, rows * stride).reshape(rows, stride)
    if enc == "q8":
        codes[:, cols:] = 0                                 # padding codes of the last block
        sigma = 2.0 / cols ** 0.5                           # element std of the decoded embedding
        scales = (sigma / 73.9) * _jitter(rng, (rows, blocks), 0.25)     # std of uniform int8: 73.9
        parts = {"codes": codes, "scales": scales.astype("<f2")}
    else:
        first = cols // 2                                   # q4: element k is nibble k % 2 of byte k // 2
        if cols % 2:
            codes[:, first] &= 0x0F
            codes[:, first + 1:] = 0
        else:
            codes[:, first:] = 0
        sigma = 1.0 / cols ** 0.5
        scale = (sigma / 4.61) * _jitter(rng, (rows, blocks), 0.25)       # std of uniform 0..15: 4.61
        mins = -7.5 * scale * _jitter(rng, (rows, blocks), 0.1)
        parts = {"codes": codes, "scales": scale.astype("<f2"), "mins": mins.astype("<f2")}
    expected = fmt.part_lengths(enc, zero, rows, cols, BLOCK, scale_bytes=2)
    out = {k: memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8)) for k, v in parts.items()}
    assert {k: len(v) for k, v in out.items()} == expected, (name, expected)
    return out


class _LastTensor:
    """Keeps the parts of the most recently generated tensor only."""

    def __init__(self, seed: int, scheme: str = "q4", n_layers: int = 1):
        self.seed, self.scheme, self.n_layers, self.name, self.parts = seed, scheme, n_layers, None, None

    def get(self, name: str, shape: tuple[int, ...]) -> dict[str, memoryview]:
        if name != self.name:
            self.name, self.parts = None, None               # free the previous tensor first
            self.parts = make_parts(name, shape, self.seed, self.scheme, self.n_layers)
            self.name = name
        return self.parts


class LazyParts(Mapping):
    """A TensorRecord's parts, generated on access (deterministically: a re-read regenerates
    the same bytes) so that the writer never holds more than one tensor."""

    def __init__(self, cache: _LastTensor, name: str, shape: tuple[int, ...], names: tuple[str, ...]):
        self._cache, self._name, self._shape, self._names = cache, name, shape, names

    def __getitem__(self, part: str) -> memoryview:
        if part not in self._names:
            raise KeyError(part)
        return self._cache.get(self._name, self._shape)[part]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def records(arch: dict, seed: int, scheme: str = "q4") -> list[TensorRecord]:
    cache = _LastTensor(seed, scheme, arch["n_layers"])
    out = []
    for name, shape in fmt.required_tensors(arch).items():
        form = encoding(name, scheme, arch["n_layers"])
        quant = (quant_descriptor(form.encoding, shape[-1], form.block, form.zero, form.scale_type)
                 if form.encoding != "f32" else None)
        names = fmt.PARTS[(form.encoding, form.zero)]
        out.append(TensorRecord(name, tuple(shape), form.encoding, quant,
                                LazyParts(cache, name, tuple(shape), names)))
    return out


def manifest(shape: str, arch: dict, seed: int, scheme: str = "q4") -> dict:
    recipe = {"generator": GENERATOR, "seed": seed, "architecture": arch, "block": BLOCK}
    if scheme != "q4":       # the q4 recipe (and so its artifacts' hashes) as before
        recipe["encoding"] = scheme
    recipe = hashlib.sha256(canonical_json(recipe)).hexdigest()
    generation = dict(fixture.GENERATION, max_new_tokens=min(256, arch["context_length"]))
    return {
        "format": fmt.FORMAT_NAME, "version": fmt.VERSION,
        "architecture": arch, "tokenizer": tokenizer(arch["vocab"]),
        "chat_template": {"format": "jinja", "template": fixture.CHAT_TEMPLATE},
        "generation": generation,
        "source": {"format": "synthetic", "file": "bench/synthetic_model.py", "sha256": recipe,
                   "converter": GENERATOR,
                   "notes": [f"random weights of shape {shape!r} (seed {seed}"
                             + (f", encoding {scheme!r}" if scheme != "q4" else "")
                             + ") for speed benchmarks; not a language model", *SHAPES[shape]["notes"]]},
    }


def write_synthetic(path, shape: str, seed: int = SEED, context_length: int | None = None,
                    scheme: str = "q4") -> str:
    """Write the artifact to `path` (a path or a binary file object); return its sha256."""
    arch = architecture(shape, context_length)
    return write_slm(path, manifest(shape, arch, seed, scheme), records(arch, seed, scheme))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True, help="the .slm file to write")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--encoding", choices=SCHEMES, default="q4",
                    help="q4 (SmolLM2's), q4k_m (llama.cpp's Q4_K_M mix), kmix (every encoding; tests) or "
                         "kmix_layers (encodings mixed across layers as Gemma 3's Q4_K_M GGUF; tests)")
    ap.add_argument("--context-length", type=int, default=None,
                    help="override the shape's context_length (the manifest's; the KV capacity is the plan's)")
    ap.add_argument("--validate", action="store_true", help="then validate the file with webslm.open_model")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    digest = write_synthetic(args.out, args.shape, args.seed, args.context_length, args.encoding)
    elapsed = time.perf_counter() - start
    size = os.path.getsize(args.out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB
    print(f"{args.out}: {args.shape} {args.encoding}, {size / 2**20:.1f} MiB, written in {elapsed:.2f} s "
          f"(peak RSS {peak:.0f} MiB), sha256 {digest}")
    if args.validate:
        import webslm
        start = time.perf_counter()
        model = webslm.open_model(args.out)
        print(f"valid: {model.architecture.n_layers} layers, vocab {model.architecture.vocab}, "
              f"{len(model.manifest.tensors)} tensors, in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
