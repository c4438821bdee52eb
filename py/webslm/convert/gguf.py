"""GGUF (llama.cpp) -> .slm v1, repacking losslessly wherever the bytes allow it.

    convert_gguf(src, out, quant=None, group=None) -> ConversionReport

Reading is the `gguf` package's (GGUFReader, gguf.quants); nothing here parses GGUF bytes.

Tensors. GGUF stores a matrix as ne = [cols, rows] and its rows as a run of blocks; ours are
[rows, cols] with the block fields split into parts (docs/slm-format.md). Without `quant`:
    F32 -> f32, F16 -> f16                       copied
    Q8_0 -> q8  (32-blocks, f16 scales)          Q5_0 -> q5 zero "offset"   Q5_1 -> q5 zero "min"
    Q4_0 -> q4 zero "offset"                     Q4_K -> q4k    Q5_K -> q5k    Q6_K -> q6k
    Q4_1 -> q4 zero "min"
    anything else                                ConversionError (pass `quant` to requantize)
gguf_blocks.py splits each block's fields into the parts (a lossless permutation of bits:
codes go to element order, K-quant six-bit sub-scales to one byte each), and the decoders
(ours and gguf.quants) compute the same f32 expressions, so values are bit-identical.

With `quant` (q4|q8|f16|f32) every 2-D matrix is encoded that way: a source already in exactly
that encoding (Q4_0/Q4_1 for q4 or Q8_0 for q8 at group 32, F16 for f16, F32 for f32) is
repacked as above, since requantizing it could only lose precision; every other matrix is
dequantized with gguf.quants and requantized with webslm.artifact.quant (q4 uses zero "min",
which fits shifted weight distributions better than "offset"), its max abs error reported.
Vectors (norms, biases) stay f32 (F16 vectors stay f16 without `quant`); any other vector
type is dequantized to f32, which is exact.

RoPE. llama.cpp's converter permutes the rows of attn_q/attn_k of the llama architecture
(each head's rotate-half order -> adjacent pairs, for its GGML RoPE). We undo that row
permutation (lossless) so the artifact always says `rope.convention: "rotate-half"`, the
Hugging Face layout; qwen2 and gemma3 GGUFs are not permuted by llama.cpp and are taken as they are.

Architectures: llama and qwen2 become family "llama"; gemma3 becomes family "gemma3" with the
facts its block needs stated in the manifest (_gemma3 below). The tokenizer section and the chat
template come from gguf_tokenizer.py.

Determinism: the output depends only on the source bytes and the arguments (canonical JSON,
fixed tensor order, no timestamps), so assets can pin the converted file's sha256.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .. import __version__
from ..artifact import format as fmt
from ..artifact import quant as q
from ..artifact.writer import TensorRecord, quant_descriptor, write_slm
from . import ConversionError, ConversionReport
from .gguf_blocks import LOSSLESS, split_blocks
from .gguf_tokenizer import chat_template, tokenizer_section

try:
    import gguf
    from gguf import GGMLQuantizationType as GT
except ImportError as exc:  # native-only dependency; say which package is missing
    raise ImportError("webslm.convert.gguf needs the `gguf` package (pip install gguf)") from exc

# GGUF architecture -> whether llama.cpp permuted its attn_q/attn_k rows (see module doc).
ARCHITECTURES = {"llama": True, "qwen2": False, "gemma3": False}
# GGUF architecture -> the .slm family computing it (qwen2 is the llama block with biases)
FAMILIES = {"llama": "llama", "qwen2": "llama", "gemma3": "gemma3"}

# Gemma 3 facts llama.cpp's loader fixes in code rather than reading from the GGUF (llama-model.cpp):
# every 6th layer attends globally, the others over a sliding window with RoPE base 10000, and
# queries are scaled by 1/sqrt(head_dim), except the 62-layer 27B's 1/sqrt(hidden / heads).
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0

# Generation defaults the page starts from. temperature 0.2 / top_p 0.9 are the SmolLM2 model
# card's recommendation and suit small instruct models in general (low temperature keeps them
# on topic); top_k 50 trims the long tail cheaply on the CPU path; repetition_penalty 1.0 (off)
# because penalties distort code and lists; 512 new tokens is a full chat answer.
GENERATION = {"temperature": 0.2, "top_p": 0.9, "top_k": 50, "min_p": 0.0,
              "repetition_penalty": 1.0, "max_new_tokens": 512}

QUANT_CHOICES = ("q4", "q8", "f16", "f32")
DEFAULT_GROUP = 32
# GGUF types with an exact .slm encoding, and that encoding (gguf_blocks.py repacks the blocks).
LOSSLESS_TARGET = {GT.F32: "f32", GT.F16: "f16", **{t: enc for t, (enc, *_) in LOSSLESS.items()}}
GGUF_BLOCK = 32                      # elements per Q8_0 / Q4_0 / Q4_1 block

_MISSING = object()


# ---------------------------------------------------------------- entry point

def convert_gguf(src, out, quant: str | None = None, group: int | None = None) -> ConversionReport:
    """Convert the GGUF file `src` into the .slm file `out` (written atomically)."""
    src, out = Path(src), Path(out)
    if quant not in (None, *QUANT_CHOICES):
        raise ConversionError(f"quant must be one of {', '.join(QUANT_CHOICES)}, not {quant!r}")
    if group is not None and quant is None:
        raise ConversionError("group applies to requantization: give quant too")
    group = DEFAULT_GROUP if group is None else group
    if group not in fmt.BLOCK_ELEMENTS:
        raise ConversionError(f"group must be one of {fmt.BLOCK_ELEMENTS}, not {group}")
    if not src.is_file():
        raise ConversionError(f"{src}: no such file")

    reader = _open(src)
    meta = _Metadata(reader, src.name)
    family = meta.get("general.architecture")
    if family not in ARCHITECTURES:
        raise ConversionError(f"{src.name}: architecture {family!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    sources = {_our_name(t.name): t for t in reader.tensors}
    arch = _architecture(meta, family, sources)
    tokenizer = tokenizer_section(meta, arch["vocab"], family)
    template, template_note = chat_template(meta, family)
    _check_tensor_set(src.name, arch, sources)

    permuted = ARCHITECTURES[family]
    records, lossless, requantized = [], [], {}
    for name, shape in fmt.required_tensors(arch).items():
        record, error = _convert_tensor(name, sources[name], shape, arch, permuted, quant, group)
        records.append(record)
        if error is None:
            lossless.append(name)
        else:
            requantized[name] = error

    notes = [f"GGUF model {meta.get('general.name', src.stem)!r}, {len(sources)} tensors"]
    if family == "gemma3":
        notes.append("norm weights kept as llama.cpp stores them, (1 + w) already added: "
                     "gemma3.norm_weight_offset 0")
        notes.append(f"gemma3: layer pattern (every {GEMMA3_SLIDING_PATTERN}th global), local RoPE base and "
                     "attention scale as llama.cpp's loader sets them")
    if template_note:
        notes.append(template_note)
    if permuted:
        notes.append("attn_q/attn_k rows un-permuted from llama.cpp's adjacent-pair order "
                     "to the rotate-half (Hugging Face) order")
    if requantized:
        notes.append(f"{len(requantized)} tensors requantized to {quant}"
                     f"{'' if quant in ('f16', 'f32') else f'/{group}'}, max abs error "
                     f"{max(requantized.values()):.6g}")
    manifest = {
        "format": fmt.FORMAT_NAME,
        "version": fmt.VERSION,
        "architecture": arch,
        "tokenizer": tokenizer,
        "chat_template": {"format": "jinja", "template": template},
        "generation": dict(GENERATION, max_new_tokens=min(GENERATION["max_new_tokens"],
                                                          arch["context_length"])),
        "source": {"format": "gguf", "file": src.name, "sha256": _sha256_file(src),
                   "converter": f"webslm {__version__}", "notes": notes},
    }
    sha256 = _write_atomically(out, manifest, records)
    return ConversionReport(output=str(out), sha256=sha256, tensors=len(records),
                            lossless=lossless, requantized=requantized, notes=notes)


# ---------------------------------------------------------------- metadata

def _open(src: Path):
    try:
        reader = gguf.GGUFReader(src, "r")
    except (ValueError, OSError, IndexError) as exc:   # what GGUFReader raises on a bad file
        raise ConversionError(f"{src.name}: not a readable GGUF file ({exc})") from None
    if reader.byte_order != "I":
        raise ConversionError(f"{src.name}: big-endian GGUF files are not supported")
    return reader


class _Metadata:
    """Typed access to GGUF key/values; a missing required key is a ConversionError."""

    def __init__(self, reader, file_name: str):
        self.fields, self.file_name = reader.fields, file_name

    def get(self, key: str, default=_MISSING):
        field = self.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise ConversionError(f"{self.file_name}: metadata key {key!r} is missing")
            return default
        return field.contents()

    def int(self, key: str, default=_MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConversionError(f"{self.file_name}: metadata key {key!r} must be one integer, "
                                  f"got {type(value).__name__}")
        return value

    def float(self, key: str, default=_MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConversionError(f"{self.file_name}: metadata key {key!r} must be a number")
        # GGUF stores these as f32: keep the shortest decimal that rounds to the same f32
        # (1e-05, not 9.999999747378752e-06), so the manifest reads like the source config.
        return float(str(np.float32(value)))


def _architecture(meta: _Metadata, family: str, sources: dict) -> dict:
    p = family + "."
    hidden = meta.int(p + "embedding_length")
    n_heads = meta.int(p + "attention.head_count")
    head_dim = meta.int(p + "attention.key_length", hidden // n_heads)
    if meta.int(p + "attention.value_length", head_dim) != head_dim:
        raise ConversionError(f"{meta.file_name}: key and value head sizes differ")
    scaling = meta.get(p + "rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs" in sources:
        raise ConversionError(f"{meta.file_name}: RoPE scaling ({scaling!r}"
                              f"{', rope_freqs tensor' if 'rope_freqs' in sources else ''}) "
                              "is not supported by .slm v1")
    if "token_embd" not in sources:
        raise ConversionError(f"{meta.file_name}: tensor 'token_embd.weight' is missing")
    vocab = int(sources["token_embd"].shape[1])          # GGUF ne = [hidden, vocab]
    arch = {
        "family": FAMILIES[family],
        "n_layers": meta.int(p + "block_count"),
        "n_heads": n_heads,
        "n_kv_heads": meta.int(p + "attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "hidden": hidden,
        "ffn": meta.int(p + "feed_forward_length"),
        "vocab": vocab,
        "context_length": meta.int(p + "context_length"),
        "norm_eps": meta.float(p + "attention.layer_norm_rms_epsilon"),
        "tied_output": "output" not in sources,
        "qkv_bias": "blk.0.attn_q.bias" in sources,
        "rope": {"base": meta.float(p + "rope.freq_base", 10000.0),
                 "rotary_dim": meta.int(p + "rope.dimension_count", head_dim),
                 "convention": "rotate-half", "position_offset": 0, "scaling": None},
    }
    if family == "gemma3":
        arch["gemma3"] = _gemma3(meta, arch)
    problems = []
    if family != "gemma3" and arch["hidden"] != n_heads * head_dim:
        problems.append(f"hidden {hidden} != n_heads {n_heads} * head_dim {head_dim}")
    if arch["n_kv_heads"] < 1 or n_heads % arch["n_kv_heads"]:
        problems.append(f"n_heads {n_heads} is not a multiple of n_kv_heads {arch['n_kv_heads']}")
    if ARCHITECTURES[family] and (arch["rope"]["rotary_dim"] != head_dim or head_dim % 2):
        # llama.cpp's permutation spans the whole head; partial rotary would change its meaning
        problems.append(f"rotary_dim {arch['rope']['rotary_dim']} != head_dim {head_dim}")
    declared_vocab = meta.int(p + "vocab_size", vocab)
    if declared_vocab != vocab:
        problems.append(f"vocab_size {declared_vocab} != token_embd rows {vocab}")
    if problems:
        raise ConversionError(f"{meta.file_name}: inconsistent architecture: {'; '.join(problems)}")
    return arch


def _gemma3(meta: _Metadata, arch: dict) -> dict:
    """What the gemma3 family states beyond the llama block (docs/slm-format.md)."""
    n_layers, hidden, heads = arch["n_layers"], arch["hidden"], arch["n_heads"]
    pattern = meta.int("gemma3.attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    query_width = hidden // heads if n_layers == 62 else arch["head_dim"]      # 27B: hidden / heads
    return {
        "embedding_scale": float(np.sqrt(np.float64(hidden))),
        "norm_weight_offset": 0.0,              # llama.cpp's converter stored 1 + w
        "activation": "gelu-tanh",
        "attention_scale": float(1.0 / np.sqrt(np.float64(query_width))),
        "sliding_window": meta.int("gemma3.attention.sliding_window"),
        "layer_types": ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers)],
        "local_rope_base": meta.float("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE),
    }


# ---------------------------------------------------------------- tensors

def _our_name(gguf_name: str) -> str:
    """token_embd.weight -> token_embd; blk.3.attn_q.bias stays blk.3.attn_q.bias."""
    return gguf_name[:-len(".weight")] if gguf_name.endswith(".weight") else gguf_name


def _check_tensor_set(file_name: str, arch: dict, sources: dict) -> None:
    required = fmt.required_tensors(arch)
    missing = [n for n in required if n not in sources]
    unexpected = [n for n in sources if n not in required]
    if missing or unexpected:
        raise ConversionError(f"{file_name}: tensors do not match the llama tensor set "
                              f"(missing: {missing[:5] or 'none'}; unexpected: {unexpected[:5] or 'none'})")
    for name, shape in required.items():
        got = tuple(int(d) for d in reversed(sources[name].shape))    # GGUF ne is [cols, rows]
        if got != shape:
            raise ConversionError(f"{file_name}: tensor {name} has shape {list(got)}, "
                                  f"the architecture needs {list(shape)}")


def unpermute_rows(n_head: int, rows: int) -> np.ndarray:
    """Index array taking llama.cpp's permuted Q/K rows back to the rotate-half order.

    llama.cpp exports w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2): HF row h*hd + a*hd/2 + i
    becomes GGUF row h*hd + 2i + a. So HF row h*hd + a*hd/2 + i = GGUF row h*hd + 2i + a, i.e.
    hf = gguf[index] with index = arange.reshape(n_head, hd/2, 2).swapaxes(1, 2).
    """
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)


def _convert_tensor(name, tensor, shape, arch, permuted, quant, group):
    """One tensor -> (TensorRecord, None if lossless else max abs error)."""
    qtype = GT(tensor.tensor_type)
    heads = _permuted_heads(name, arch) if permuted else None
    if len(shape) == 1:
        return _vector(name, shape, qtype, np.asarray(tensor.data), heads, quant), None

    raw = np.asarray(tensor.data).reshape(shape[0], -1)   # GGUF rows: values or block bytes
    if heads:
        raw = raw[unpermute_rows(heads, shape[0])]        # whole rows move: lossless for any type
    target = quant or LOSSLESS_TARGET.get(qtype)
    if target is None:
        raise ConversionError(f"tensor {tensor.name} has GGUF type {qtype.name}, which has no lossless "
                              ".slm encoding: requantize it with quant='q4', 'q8', 'f16' or 'f32' "
                              "(CLI: --quant)")
    if LOSSLESS_TARGET.get(qtype) == target and (target in ("f16", "f32") or quant is None or group == GGUF_BLOCK):
        return _repack(name, shape, qtype, raw), None
    return _requantize(name, shape, qtype, raw, target, group)


def _vector(name: str, shape, qtype, raw: np.ndarray, heads: int | None, quant) -> TensorRecord:
    """A 1-D tensor: f16 stays f16 (without `quant`), anything else becomes f32, exactly."""
    if qtype == GT.F16 and quant is None:
        values = raw.reshape(-1)
        encoding = "f16"
    else:
        try:
            values = gguf.quants.dequantize(raw, qtype).reshape(-1)
        except NotImplementedError:
            raise ConversionError(f"tensor {name}: gguf cannot dequantize type {qtype.name}") from None
        encoding = "f32"
    if heads:                                             # a permuted Q/K bias: its elements are rows
        values = values[unpermute_rows(heads, shape[0])]
    encode = q.encode_f16 if encoding == "f16" else q.encode_f32
    return TensorRecord(name, shape, encoding, None, encode(values.reshape(1, -1)))


def _permuted_heads(name: str, arch: dict) -> int | None:
    """Head count whose permutation llama.cpp applied to this tensor's rows, or None."""
    base = name[:-len(".bias")] if name.endswith(".bias") else name
    if base.endswith(".attn_q"):
        return arch["n_heads"]
    if base.endswith(".attn_k"):
        return arch["n_kv_heads"]
    return None


def _repack(name: str, shape, qtype, raw: np.ndarray) -> TensorRecord:
    """GGUF rows of a lossless type -> our parts, byte for byte the same numbers."""
    rows, cols = shape
    if qtype == GT.F32:
        return TensorRecord(name, shape, "f32", None, q.encode_f32(raw))
    if qtype == GT.F16:
        return TensorRecord(name, shape, "f16", None, q.encode_f16(raw))
    encoding, zero, parts = split_blocks(qtype, raw.view(np.uint8))
    for side in ("scales", "mins"):            # f16 NaN/inf scales: the validator would refuse the file
        if side in parts and not np.isfinite(np.frombuffer(parts[side], "<f2")).all():
            raise ConversionError(f"tensor {name}: a {qtype.name} block has a NaN or infinite "
                                  f"{'scale' if side == 'scales' else 'min'}")
    block = LOSSLESS[qtype][2]
    return TensorRecord(name, shape, encoding, quant_descriptor(encoding, cols, block, zero), parts)


def _requantize(name: str, shape, qtype, raw: np.ndarray, target: str, group: int):
    """Dequantize with gguf.quants, encode as `target`; returns (record, max abs error)."""
    try:
        values = gguf.quants.dequantize(raw, qtype).reshape(shape)
    except NotImplementedError:
        raise ConversionError(f"tensor {name}: gguf cannot dequantize type {qtype.name}") from None
    with np.errstate(over="ignore", invalid="ignore"):       # overflow is reported just below
        if target == "f32":
            record = TensorRecord(name, shape, "f32", None, q.encode_f32(values))
        elif target == "f16":
            record = TensorRecord(name, shape, "f16", None, q.encode_f16(values))
        elif target == "q8":
            record = TensorRecord(name, shape, "q8", quant_descriptor("q8", shape[1], group, "none"),
                                  q.quantize_q8(values, group))
        else:
            record = TensorRecord(name, shape, "q4", quant_descriptor("q4", shape[1], group, "min"),
                                  q.quantize_q4(values, group, zero="min"))
        decoded = q.dequantize(record.encoding, shape, record.quant, record.parts)
    if not np.isfinite(decoded).all():
        raise ConversionError(f"tensor {name}: its values (up to {float(np.abs(values).max()):.6g}) overflow "
                              f"{target}'s f16 scales or values; requantize with quant='f32'")
    return record, float(np.max(np.abs(decoded - values)))


# ---------------------------------------------------------------- output

def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomically(out: Path, manifest: dict, records: list[TensorRecord]) -> str:
    """A reader (or an interrupted run) never sees a half-written .slm at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        sha256 = write_slm(tmp, manifest, records)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return sha256
