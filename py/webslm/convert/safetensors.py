"""Hugging Face safetensors directory -> .slm v1 (docs/slm-format.md), round-to-nearest quantization.

Reads, from one model directory:

    config.json               LlamaForCausalLM / Qwen2ForCausalLM hyper-parameters
    tokenizer.json            HF `tokenizers` BPE: vocab, merges, added tokens, pre-tokenizer, decoder
    tokenizer_config.json     chat template, bos/eos/pad tokens, add_bos_token / add_eos_token
    chat_template.jinja       the chat template, when tokenizer_config.json has none
    generation_config.json    optional: sampling defaults, extra eos ids
    *.safetensors             the weights; model.safetensors.index.json picks the files when present

Weights keep the Hugging Face (rotate-half) row order of attn_q/attn_k: the artifact says
`rope.convention = "rotate-half"` instead of permuting rows. 2-D matrices are encoded as asked
(q4 = `quantize_q4(zero="min")`, q8, f16, f32) with f16 scales; 1-D tensors (norms, biases) are
f32. Every encoded tensor is decoded again and compared with its source: the max abs error goes
to `report.requantized`, bit-exact tensors to `report.lossless`.

Pre-tokenizer detection (tokenizer.json `pre_tokenizer`, `decoder`, `normalizer`; anything not
in this table is rejected, because a tokenizer that splits text differently yields different ids):

    name           pre_tokenizer steps                                           other requirements
    gpt2           ByteLevel(use_regex=true)                                     decoder ByteLevel
    smollm         Digits(individual_digits=true), ByteLevel(use_regex=true)     decoder ByteLevel
    qwen2          Split(QWEN2_SPLIT, Isolated), ByteLevel(use_regex=false)      decoder ByteLevel
    llama3         Split(LLAMA3_SPLIT, Isolated), ByteLevel(use_regex=false)     decoder ByteLevel, ignore_merges
    sentencepiece  none + normalizer Prepend("▁"), Replace(" ", "▁")             byte_fallback, decoder has ByteFallback
                   or Metaspace("▁", split=false) and no normalizer

ByteLevel must have add_prefix_space=false. A byte-level tokenizer's normalizer must be null, or
NFC (what Qwen2 ships): NFC is not represented in .slm v1 and is dropped with a note, as llama.cpp
does. `ignore_merges` (take a whole pre-token that is in the vocabulary as is) is Llama 3
behaviour and is accepted only with the llama3 split.

Source identity (`manifest.source.sha256`): the sha256 of `sha256sum`-style lines
("<hex>  <file name>\\n", sorted by name) over every file the conversion read, so the same
directory always gives the same artifact, byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import math
import pathlib
import re
import struct

import numpy as np
from safetensors import SafetensorError, safe_open

from .. import __version__
from ..artifact import format as fmt
from ..artifact.quant import dequantize, encode_f16, encode_f32, quantize_q4, quantize_q8
from ..artifact.writer import TensorRecord, quant_descriptor, write_slm
from . import ConversionError, ConversionReport
from .hf_tokenizer import tokenizer_entry

QUANTS = ("q4", "q8", "f16", "f32")
DEFAULT_GROUP = 32
SCALE_TYPE = "f16"            # GGML's choice for Q8_0/Q4_1: half the side-data bytes of f32

# Hugging Face class name -> (model_type, whether q/k/v always carry biases)
ARCHITECTURES = {"LlamaForCausalLM": ("llama", False), "Qwen2ForCausalLM": ("qwen2", True)}

# Buffers some checkpoints carry that are not weights (recomputed from rope_theta).
IGNORED_TENSOR = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

# Our name (per layer, after "blk.N.") -> Hugging Face name (after "model.layers.N.").
LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight",
                "output": "lm_head.weight"}


def convert_safetensors(src_dir, out, quant: str = "q4", group: int | None = None) -> ConversionReport:
    """Convert a Hugging Face model directory into a .slm file at `out`."""
    src = pathlib.Path(src_dir)
    if not src.is_dir():
        raise ConversionError(f"{src}: not a directory")
    block = _check_encoding(quant, group)
    notes: list[str] = []
    files = _Inputs(src)

    config = files.json("config.json")
    architecture = _architecture(config, notes)
    tokenizer_config = files.json("tokenizer_config.json")
    generation_config = files.json("generation_config.json", required=False) or {}
    tokenizer = tokenizer_entry(files.json("tokenizer.json"), tokenizer_config, generation_config, config, notes)
    if len(tokenizer["tokens"]) > architecture["vocab"]:
        raise ConversionError(f"tokenizer.json has {len(tokenizer['tokens'])} tokens but config.json "
                              f"vocab_size is {architecture['vocab']}")
    chat_template = _chat_template(tokenizer_config, files)
    generation = _generation(generation_config, architecture["context_length"], notes)

    weights = _Weights(src, files)
    names = hf_tensor_names(architecture)
    _check_tensor_set(weights, names, architecture, notes)

    report = ConversionReport(output=str(out), sha256="", tensors=len(names), notes=notes)
    records = []
    for name, hf_name in names.items():
        source = weights.load(hf_name)
        expected = fmt.required_tensors(architecture)[name]
        if source.shape != expected:
            raise ConversionError(f"{hf_name}: shape {list(source.shape)}, the config implies {list(expected)}")
        record, error = _encode(name, source, quant, block)
        records.append(record)
        if error == 0.0:
            report.lossless.append(name)
        else:
            report.requantized[name] = error

    manifest = {
        "format": fmt.FORMAT_NAME, "version": fmt.VERSION,
        "architecture": architecture, "tokenizer": tokenizer, "chat_template": chat_template,
        "generation": generation,
        "source": {"format": "safetensors", "file": src.resolve().name, "sha256": files.identity(),
                   "converter": f"webslm {__version__}", "notes": list(notes)},
    }
    report.sha256 = write_slm(out, manifest, records)
    return report


def hf_tensor_names(architecture: dict) -> dict[str, str]:
    """Every .slm tensor the architecture needs -> its Hugging Face name, in .slm table order."""
    names = {}
    for name in fmt.required_tensors(architecture):
        if name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            names[name] = f"model.layers.{layer}.{LAYER_NAMES[rest]}"
        else:
            names[name] = GLOBAL_NAMES[name]
    return names


# -- options -------------------------------------------------------------------------------

def _check_encoding(quant: str, group: int | None) -> int | None:
    if quant not in QUANTS:
        raise ConversionError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    if quant in ("f16", "f32"):
        if group is not None:
            raise ConversionError(f"--group applies to q4 and q8 only, not {quant}")
        return None
    block = DEFAULT_GROUP if group is None else group
    if block not in fmt.BLOCK_ELEMENTS:
        raise ConversionError(f"group must be one of {', '.join(map(str, fmt.BLOCK_ELEMENTS))}, not {block}")
    return block


# -- input files ---------------------------------------------------------------------------

class _Inputs:
    """The directory's files, read once each, with a sha256 of everything read (the source identity)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.digests: dict[str, str] = {}

    def read(self, name: str) -> bytes:
        data = (self.root / name).read_bytes()
        self.digests[name] = hashlib.sha256(data).hexdigest()
        return data

    def hash_file(self, name: str) -> None:
        """Hash a (possibly large) file in chunks without keeping it."""
        digest = hashlib.sha256()
        with open(self.root / name, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 24), b""):
                digest.update(chunk)
        self.digests[name] = digest.hexdigest()

    def json(self, name: str, required: bool = True):
        if not (self.root / name).is_file():
            if required:
                raise ConversionError(f"{self.root}: {name} is missing")
            return None
        try:
            return json.loads(self.read(name).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConversionError(f"{name}: not valid UTF-8 JSON ({exc})") from None

    def identity(self) -> str:
        lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(self.digests.items()))
        return hashlib.sha256(lines.encode("utf-8")).hexdigest()


# -- config.json -> architecture -----------------------------------------------------------

def _architecture(config: dict, notes: list[str]) -> dict:
    names = config.get("architectures") or []
    known = [n for n in names if n in ARCHITECTURES]
    if len(known) != 1:
        raise ConversionError(f"config.json architectures {names!r}: expected exactly one of "
                              f"{', '.join(ARCHITECTURES)}")
    model_type, implied_qkv_bias = ARCHITECTURES[known[0]]

    def integer(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if type(value) is not int or not 1 <= value <= fmt.MAX_DIMENSION:
            raise ConversionError(f"config.json {key}: expected a positive integer, got {value!r}")
        return value

    def number(key: str, default: float | None = None) -> float:
        value = config.get(key, default)
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise ConversionError(f"config.json {key}: expected a positive number, got {value!r}")
        return float(value)

    hidden, heads = integer("hidden_size"), integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads", heads)            # HF default: no grouping
    if config.get("head_dim") is None and hidden % heads:
        raise ConversionError(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    head_dim = integer("head_dim") if config.get("head_dim") is not None else hidden // heads
    if heads * head_dim != hidden:
        raise ConversionError(f"config.json: num_attention_heads {heads} x head_dim {head_dim} != hidden_size "
                              f"{hidden}; .slm v1 needs hidden == n_heads * head_dim")
    if heads % kv_heads:
        raise ConversionError(f"config.json: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")

    if config.get("rope_scaling") is not None:
        raise ConversionError(f"config.json rope_scaling {config['rope_scaling']!r}: RoPE scaling is not "
                              "defined in .slm v1 (only unscaled RoPE)")
    rope_theta = number("rope_theta", 10000.0)                    # LlamaConfig's default
    parameters = config.get("rope_parameters")                     # transformers 5 spelling
    if parameters is not None:
        if not isinstance(parameters, dict) or parameters.get("rope_type", "default") != "default":
            raise ConversionError(f"config.json rope_parameters {parameters!r}: only rope_type 'default' "
                                  "(no scaling) is defined in .slm v1")
        rope_theta = float(parameters.get("rope_theta", rope_theta))
    # HF computes the rotated width as int(head_dim * partial_rotary_factor).
    factor = config.get("partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * factor) if type(factor) in (int, float) and 0 < factor <= 1 else -1
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConversionError(f"config.json partial_rotary_factor {factor!r} gives rotary width {rotary_dim}; "
                              "it must be even and at least 2")

    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"config.json hidden_act {config['hidden_act']!r}: the llama family uses SwiGLU (silu)")
    if config.get("mlp_bias"):
        raise ConversionError("config.json mlp_bias: .slm v1 has no tensors for MLP biases")
    if config.get("attention_bias") and not implied_qkv_bias:
        raise ConversionError("config.json attention_bias: Llama's attention_bias also biases o_proj, "
                              "which .slm v1 has no tensor for")
    if config.get("use_sliding_window"):
        raise ConversionError("config.json use_sliding_window: sliding-window attention is not in .slm v1")

    eps = number("rms_norm_eps")
    if eps >= 1:
        raise ConversionError(f"config.json rms_norm_eps {eps}: must be below 1")
    tied = config.get("tie_word_embeddings", False)               # Llama/Qwen2 configs' default
    if type(tied) is not bool:
        raise ConversionError(f"config.json tie_word_embeddings: expected true or false, got {tied!r}")
    if model_type == "qwen2":
        notes.append("Qwen2: q/k/v projections carry biases (qkv_bias true)")
    return {
        "family": "llama",
        "n_layers": integer("num_hidden_layers"), "n_heads": heads, "n_kv_heads": kv_heads,
        "head_dim": head_dim, "hidden": hidden, "ffn": integer("intermediate_size"),
        "vocab": integer("vocab_size"), "context_length": integer("max_position_embeddings"),
        "norm_eps": eps, "tied_output": tied, "qkv_bias": implied_qkv_bias,
        "rope": {"base": rope_theta, "rotary_dim": rotary_dim, "convention": "rotate-half",
                 "position_offset": 0, "scaling": None},
    }


# -- tokenizer.json + tokenizer_config.json -> tokenizer -----------------------------------

def _chat_template(tokenizer_config: dict, files: _Inputs) -> dict:
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):                                 # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ConversionError(f"tokenizer_config.json has chat templates {sorted(named)} but none named 'default'")
        template = named["default"]
    if template is None and (files.root / "chat_template.jinja").is_file():
        template = files.read("chat_template.jinja").decode("utf-8")
    if not isinstance(template, str) or not template:
        raise ConversionError("no chat template: tokenizer_config.json chat_template and chat_template.jinja "
                              "are both missing")
    return {"format": "jinja", "template": template}


def _generation(gen: dict, context_length: int, notes: list[str]) -> dict:
    """Sampling defaults with transformers' generate() semantics: greedy unless do_sample."""

    def value(key: str, default):
        return default if gen.get(key) is None else gen[key]

    out = {
        "temperature": float(value("temperature", 1.0)) if gen.get("do_sample") is True else 0.0,
        "top_p": float(value("top_p", 1.0)), "top_k": int(value("top_k", 50)),
        "min_p": float(value("min_p", 0.0)), "repetition_penalty": float(value("repetition_penalty", 1.0)),
        "max_new_tokens": int(value("max_new_tokens", 256)),
    }
    if gen.get("do_sample") is not True:
        notes.append("generation_config.json does not set do_sample true: default temperature 0 (greedy), "
                     "as transformers' generate() would")
    if out["max_new_tokens"] > context_length:
        notes.append(f"max_new_tokens {out['max_new_tokens']} capped at context_length {context_length}")
        out["max_new_tokens"] = context_length
    if not (0 <= out["temperature"] <= 100 and 0 < out["top_p"] <= 1 and out["top_k"] >= 0
            and 0 <= out["min_p"] < 1 and out["repetition_penalty"] > 0 and out["max_new_tokens"] >= 1):
        raise ConversionError(f"generation_config.json: sampling defaults out of range: {out}")
    return out


# -- weights -------------------------------------------------------------------------------

class _Weights:
    """Every tensor of the directory's *.safetensors files, read on demand as float32.

    F32/F16/F64 go through `safe_open(framework="numpy")`. numpy has no bfloat16, and the
    safetensors numpy backend raises "data type 'bfloat16' not understood" for BF16 tensors,
    so their raw bytes are read at the offsets of the file's header (8-byte length + JSON,
    already validated by safe_open when it opened the file) and widened exactly: a bf16 is
    the top half of the f32 with the same value, so `u16 << 16` viewed as f32 is lossless.
    This avoids needing torch just to read bf16.
    """

    WIDTHS = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}

    def __init__(self, root: pathlib.Path, files: _Inputs):
        index_name = "model.safetensors.index.json"
        if (root / index_name).is_file():
            weight_map = (files.json(index_name).get("weight_map") or {})
            shards = sorted(set(weight_map.values()))
        else:
            weight_map, shards = None, sorted(p.name for p in root.glob("*.safetensors"))
        if not shards:
            raise ConversionError(f"{root}: no *.safetensors files")
        self.tensors: dict[str, tuple[pathlib.Path, str, tuple[int, ...]]] = {}
        for shard in shards:
            path = root / shard
            if not path.is_file():
                raise ConversionError(f"{index_name} names {shard}, which is missing")
            files.hash_file(shard)
            try:
                with safe_open(path, framework="numpy") as handle:
                    for name in handle.keys():
                        if name in self.tensors:
                            raise ConversionError(f"tensor {name} appears in both {self.tensors[name][0].name} "
                                                  f"and {shard}")
                        piece = handle.get_slice(name)
                        self.tensors[name] = (path, piece.get_dtype(), tuple(piece.get_shape()))
            except SafetensorError as exc:
                raise ConversionError(f"{shard}: not a valid safetensors file ({exc})") from None
        if weight_map is not None:
            misplaced = [n for n, shard in weight_map.items()
                         if n not in self.tensors or self.tensors[n][0].name != shard]
            if misplaced:
                raise ConversionError(f"{index_name} places tensors where they are not: {misplaced[:5]}")

    def load(self, name: str) -> np.ndarray:
        path, dtype, shape = self.tensors[name]
        if dtype not in self.WIDTHS:
            raise ConversionError(f"{name}: dtype {dtype} is not supported (F32, F16, BF16, F64)")
        if dtype == "BF16":
            raw = np.frombuffer(self._raw(path, name), "<u2").astype(np.uint32) << 16
            values = raw.view(np.float32).reshape(shape)
        else:
            with safe_open(path, framework="numpy") as handle:
                values = handle.get_tensor(name).astype(np.float32)
        if not np.isfinite(values).all():
            raise ConversionError(f"{name}: non-finite values (NaN or infinity) in the source")
        return values

    @staticmethod
    def _raw(path: pathlib.Path, name: str) -> bytes:
        with open(path, "rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            begin, end = json.loads(handle.read(header_length))[name]["data_offsets"]
            handle.seek(8 + header_length + begin)
            return handle.read(end - begin)


def _check_tensor_set(weights: _Weights, names: dict[str, str], architecture: dict, notes: list[str]) -> None:
    wanted = set(names.values())
    missing = sorted(wanted - weights.tensors.keys())
    extra = sorted(n for n in weights.tensors.keys() - wanted if not IGNORED_TENSOR.fullmatch(n))
    if architecture["tied_output"] and "lm_head.weight" in extra:
        # Some exports store the tied head anyway; harmless only if it really is the embedding.
        if not np.array_equal(weights.load("lm_head.weight"), weights.load("model.embed_tokens.weight")):
            raise ConversionError("tie_word_embeddings is true but lm_head.weight differs from the embedding")
        extra.remove("lm_head.weight")
        notes.append("lm_head.weight equals the tied embedding and was dropped")
    if missing or extra:
        raise ConversionError("tensor set does not match config.json: "
                              + (f"missing {', '.join(missing)}" if missing else "")
                              + ("; " if missing and extra else "")
                              + (f"unexpected {', '.join(extra)}" if extra else ""))


def _encode(name: str, source: np.ndarray, quant: str, block: int | None) -> tuple[TensorRecord, float]:
    """One tensor -> its record, and the max abs error of decoding it against the source."""
    rows = source.reshape(1, -1) if source.ndim == 1 else source
    # Values (or scales, mins) beyond f16's range become inf here; numpy's overflow warnings are
    # silenced because the decoded check below turns any of them into a ConversionError.
    with np.errstate(over="ignore", invalid="ignore"):
        if source.ndim == 1 or quant == "f32":
            encoding, descriptor, parts = "f32", None, encode_f32(rows)
        elif quant == "f16":
            encoding, descriptor, parts = "f16", None, encode_f16(rows)
        elif quant == "q8":
            encoding, parts = "q8", quantize_q8(rows, block, SCALE_TYPE)
            descriptor = quant_descriptor("q8", rows.shape[1], block, "none", SCALE_TYPE)
        else:
            encoding, parts = "q4", quantize_q4(rows, block, zero="min", scale_type=SCALE_TYPE)
            descriptor = quant_descriptor("q4", rows.shape[1], block, "min", SCALE_TYPE)
        decoded = dequantize(encoding, source.shape, descriptor, parts)
    if not np.isfinite(decoded).all():
        raise ConversionError(f"{name}: values overflow {encoding} (largest |value| {np.abs(source).max():.6g})")
    error = float(np.abs(decoded.astype(np.float64) - source).max())
    return TensorRecord(name, tuple(source.shape), encoding, descriptor, parts), error
