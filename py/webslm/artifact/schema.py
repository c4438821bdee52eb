"""Checks for the manifest's JSON sections (docs/slm-format.md, "Manifest").

Each check takes parsed JSON and either returns typed values or raises ArtifactError with
the dotted path of the offending field. Nothing is clamped or defaulted.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from . import format as fmt
from .errors import ArtifactError
from .model import Architecture, Gemma3, Rope

PRE_TOKENIZERS = ("gpt2", "smollm", "qwen2", "llama3", "sentencepiece", "gemma")
SENTENCEPIECE_STYLE = ("sentencepiece", "gemma")     # the pre-tokenizers of byte_level false
FAMILIES = ("llama", "gemma3")
ARCHITECTURE_KEYS = ("family", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden", "ffn",
                     "vocab", "context_length", "norm_eps", "tied_output", "qkv_bias", "rope")
GEMMA3_KEYS = ("embedding_scale", "norm_weight_offset", "activation", "attention_scale", "sliding_window",
               "layer_types", "local_rope_base")
TOKENIZER_KEYS = ("model", "byte_level", "byte_fallback", "pre_tokenizer", "tokens", "merges",
                  "special_tokens", "bos_id", "eos_ids", "pad_id", "unk_id", "add_bos", "add_eos")


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # the only way JSON text can make one


def strict_json(data: bytes, where: str) -> Any:
    """UTF-8 JSON with no duplicate keys, no NaN/Infinity, no number of more digits than
    Python converts (ValueError past 4300), and no string that UTF-8 cannot hold: JSON's
    \\ud800 escape decodes to a lone surrogate, which would validate here and then fail
    wherever the text is encoded (the tokenizer, the page)."""
    def no_duplicates(pairs):
        obj = {}
        for key, value in pairs:
            if key in obj:
                raise ArtifactError("bad-json", where, f"duplicate key {key!r}")
            obj[key] = value
        return obj

    def no_constants(name):
        raise ArtifactError("bad-json", where, f"{name} is not allowed in JSON")

    try:
        text = bytes(data).decode("utf-8")
        value = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except ArtifactError:
        raise
    except UnicodeDecodeError as exc:
        raise ArtifactError("bad-json", where, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:      # JSONDecodeError is a ValueError
        raise ArtifactError("bad-json", where, f"not valid JSON ({exc})"[:300]) from None
    if SURROGATE_ESCAPE.search(text):        # rare: skip the walk over every string otherwise
        _no_lone_surrogates(value, where)
    return value


def _no_lone_surrogates(value: Any, where: str) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                raise ArtifactError("bad-json", where, f"a string holds a lone surrogate: {item[:40]!r}")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# -- field readers -------------------------------------------------------------------------

def obj(value: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ArtifactError("bad-field", where, "must be a JSON object")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ArtifactError("bad-field", f"{where}.{missing[0]}", "is missing")
    extra = [k for k in value if k not in keys]
    if extra:
        raise ArtifactError("bad-field", f"{where}.{extra[0]}", "is not a field of this format version")
    return value


def integer(value: Any, where: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ArtifactError("bad-field", where, f"must be an integer in [{lo}, {hi}], got {value!r}"[:200])
    return value


def number(value: Any, where: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    # The range is compared before any float(): a JSON integer may have thousands of digits.
    if type(value) not in (int, float) or (type(value) is float and not math.isfinite(value)) \
            or not lo <= value <= hi or (lo_open and value == lo) or (hi_open and value == hi):
        bound = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ArtifactError("bad-field", where, f"must be a number in {bound}, got {_short(value)}")
    return float(value)


def _short(value: Any) -> str:
    """A value for an error sentence, cut short (and never str() of a huge int: ValueError)."""
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:120]


def boolean(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise ArtifactError("bad-field", where, f"must be true or false, got {value!r}"[:200])
    return value


def string(value: Any, where: str, choices: tuple[str, ...] | None = None, max_len: int = 1 << 20) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise ArtifactError("bad-field", where, "must be a string" + (f" of at most {max_len} characters" if isinstance(value, str) else ""))
    if choices is not None and value not in choices:
        raise ArtifactError("bad-field", where, f"must be one of {', '.join(choices)}, got {value!r}"[:200])
    return value


# -- sections ------------------------------------------------------------------------------

def architecture(value: Any) -> Architecture:
    w = "manifest.architecture"
    # the key set depends on the family: "gemma3" adds its own section
    family = value.get("family") if isinstance(value, dict) else None
    a = obj(value, w, ARCHITECTURE_KEYS + (("gemma3",) if family == "gemma3" else ()))
    string(a["family"], f"{w}.family", FAMILIES)
    dims = {"n_layers": integer(a["n_layers"], f"{w}.n_layers", 1, fmt.MAX_LAYERS)}
    dims |= {k: integer(a[k], f"{w}.{k}", 1, fmt.MAX_DIMENSION)
             for k in ("n_heads", "n_kv_heads", "head_dim", "hidden", "ffn", "vocab", "context_length")}
    r = obj(a["rope"], f"{w}.rope", ("base", "rotary_dim", "convention", "position_offset", "scaling"))
    rope = Rope(
        base=number(r["base"], f"{w}.rope.base", 0, 1e12, lo_open=True),
        rotary_dim=integer(r["rotary_dim"], f"{w}.rope.rotary_dim", 2, fmt.MAX_DIMENSION),
        convention=string(r["convention"], f"{w}.rope.convention", fmt.ROPE_CONVENTIONS),
        position_offset=integer(r["position_offset"], f"{w}.rope.position_offset", 0, fmt.MAX_DIMENSION),
        scaling=None)
    if r["scaling"] is not None:
        raise ArtifactError("bad-field", f"{w}.rope.scaling", "RoPE scaling is not defined in format v1; must be null")
    gemma3 = _gemma3(a["gemma3"], dims) if family == "gemma3" else None
    arch = Architecture(family=a["family"], **dims,
                        norm_eps=number(a["norm_eps"], f"{w}.norm_eps", 0, 1, lo_open=True, hi_open=True),
                        tied_output=boolean(a["tied_output"], f"{w}.tied_output"),
                        qkv_bias=boolean(a["qkv_bias"], f"{w}.qkv_bias"), rope=rope, gemma3=gemma3)
    if family == "llama" and arch.hidden != arch.n_heads * arch.head_dim:    # gemma3's heads are wider
        raise ArtifactError("bad-architecture", f"{w}.hidden",
                            f"hidden {arch.hidden} != n_heads {arch.n_heads} x head_dim {arch.head_dim}")
    if arch.n_heads % arch.n_kv_heads:
        raise ArtifactError("bad-architecture", f"{w}.n_kv_heads",
                            f"n_heads {arch.n_heads} is not a multiple of n_kv_heads {arch.n_kv_heads}")
    if rope.rotary_dim % 2 or rope.rotary_dim > arch.head_dim:
        raise ArtifactError("bad-architecture", f"{w}.rope.rotary_dim",
                            f"rotary_dim {rope.rotary_dim} must be even and at most head_dim {arch.head_dim}")
    if rope.position_offset >= arch.context_length:
        raise ArtifactError("bad-architecture", f"{w}.rope.position_offset",
                            f"position_offset {rope.position_offset} leaves no room in context_length {arch.context_length}")
    return arch


def _gemma3(value: Any, dims: dict) -> Gemma3:
    w = "manifest.architecture.gemma3"
    g = obj(value, w, GEMMA3_KEYS)
    types = g["layer_types"]
    if not isinstance(types, list) or len(types) != dims["n_layers"] \
            or not all(t in ("sliding", "full") for t in types):
        raise ArtifactError("bad-architecture", f"{w}.layer_types",
                            f"must list \"sliding\" or \"full\" for each of the {dims['n_layers']} layers")
    offset = number(g["norm_weight_offset"], f"{w}.norm_weight_offset", 0, 1)
    if offset not in (0.0, 1.0):
        raise ArtifactError("bad-field", f"{w}.norm_weight_offset", f"must be 0 or 1, got {offset!r}")
    return Gemma3(
        embedding_scale=number(g["embedding_scale"], f"{w}.embedding_scale", 0, 1e6, lo_open=True),
        norm_weight_offset=offset,
        activation=string(g["activation"], f"{w}.activation", ("gelu-tanh",)),
        attention_scale=number(g["attention_scale"], f"{w}.attention_scale", 0, 1e6, lo_open=True),
        sliding_window=integer(g["sliding_window"], f"{w}.sliding_window", 1, dims["context_length"]),
        layer_types=tuple(types),
        local_rope_base=number(g["local_rope_base"], f"{w}.local_rope_base", 0, 1e12, lo_open=True))


def tokenizer(value: Any, vocab: int) -> dict:
    w = "manifest.tokenizer"
    # pre_tokenizer "gemma" adds added_tokens: matched whole in the text like special tokens,
    # but text, not control (HF's non-special added tokens, e.g. Gemma's "\n\n")
    gemma = isinstance(value, dict) and value.get("pre_tokenizer") == "gemma"
    t = obj(value, w, TOKENIZER_KEYS + (("added_tokens",) if gemma else ()))
    string(t["model"], f"{w}.model", ("bpe",))
    byte_level = boolean(t["byte_level"], f"{w}.byte_level")
    byte_fallback = boolean(t["byte_fallback"], f"{w}.byte_fallback")
    pre = string(t["pre_tokenizer"], f"{w}.pre_tokenizer", PRE_TOKENIZERS)
    if byte_level == (pre in SENTENCEPIECE_STYLE) or byte_level == byte_fallback:
        raise ArtifactError("bad-tokenizer", f"{w}.pre_tokenizer",
                            "byte-level BPE needs a GPT-2-style pre-tokenizer and no byte fallback; "
                            "SentencePiece-style BPE needs pre_tokenizer sentencepiece or gemma, and byte_fallback")
    tokens = t["tokens"]
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= vocab:
        raise ArtifactError("bad-tokenizer", f"{w}.tokens", f"must be a list of 1 to vocab ({vocab}) strings")
    if not all(isinstance(s, str) and 0 < len(s) <= 4096 for s in tokens):
        raise ArtifactError("bad-tokenizer", f"{w}.tokens", "every token must be a non-empty string")
    index = {s: i for i, s in enumerate(tokens)}
    if len(index) != len(tokens):
        raise ArtifactError("bad-tokenizer", f"{w}.tokens", "token strings must be unique")
    merges = t["merges"]
    if not isinstance(merges, list):
        raise ArtifactError("bad-tokenizer", f"{w}.merges", "must be a list of \"left right\" strings")
    for n, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else ()
        if len(parts) != 2 or parts[0] not in index or parts[1] not in index or parts[0] + parts[1] not in index:
            raise ArtifactError("bad-tokenizer", f"{w}.merges[{n}]",
                                "must be \"left right\" where left, right and left+right are tokens")
    count = len(tokens)

    def token_id(value: Any, where: str) -> int:
        if type(value) is not int or not 0 <= value < count:
            raise ArtifactError("bad-tokenizer", where, f"must be a token id in [0, {count}), got {value!r}"[:200])
        return value

    listed: set[int] = set()
    for key in ("special_tokens", "added_tokens") if gemma else ("special_tokens",):
        entries = t[key]
        if not isinstance(entries, list):
            raise ArtifactError("bad-tokenizer", f"{w}.{key}", "must be a list")
        for n, entry in enumerate(entries):
            e = obj(entry, f"{w}.{key}[{n}]", ("id", "content"))
            eid = token_id(e["id"], f"{w}.{key}[{n}].id")
            if e["content"] != tokens[eid]:
                raise ArtifactError("bad-tokenizer", f"{w}.{key}[{n}]", f"content differs from tokens[{eid}]")
            if key == "added_tokens" and eid in listed:
                raise ArtifactError("bad-tokenizer", f"{w}.{key}[{n}]", f"token {eid} is also a special token")
            listed.add(eid)
    for key in ("bos_id", "pad_id", "unk_id"):
        if t[key] is not None:
            token_id(t[key], f"{w}.{key}")
    if not isinstance(t["eos_ids"], list) or not t["eos_ids"]:
        raise ArtifactError("bad-tokenizer", f"{w}.eos_ids", "must be a non-empty list of token ids")
    for n, eos in enumerate(t["eos_ids"]):
        token_id(eos, f"{w}.eos_ids[{n}]")
    boolean(t["add_bos"], f"{w}.add_bos")
    boolean(t["add_eos"], f"{w}.add_eos")
    if t["add_bos"] and t["bos_id"] is None:
        raise ArtifactError("bad-tokenizer", f"{w}.add_bos", "add_bos is true but bos_id is null")
    return t


def chat_template(value: Any) -> dict:
    c = obj(value, "manifest.chat_template", ("format", "template"))
    string(c["format"], "manifest.chat_template.format", ("jinja",))
    string(c["template"], "manifest.chat_template.template", max_len=1 << 20)
    return c


def generation(value: Any, context_length: int) -> dict:
    w = "manifest.generation"
    g = obj(value, w, ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens"))
    number(g["temperature"], f"{w}.temperature", 0, 100)
    number(g["top_p"], f"{w}.top_p", 0, 1, lo_open=True)
    integer(g["top_k"], f"{w}.top_k", 0, fmt.MAX_DIMENSION)
    number(g["min_p"], f"{w}.min_p", 0, 1, hi_open=True)
    number(g["repetition_penalty"], f"{w}.repetition_penalty", 0, 100, lo_open=True)
    integer(g["max_new_tokens"], f"{w}.max_new_tokens", 1, context_length)
    return g


def source(value: Any) -> dict:
    w = "manifest.source"
    s = obj(value, w, ("format", "file", "sha256", "converter", "notes"))
    for key in ("format", "file", "converter"):
        string(s[key], f"{w}.{key}", max_len=4096)
    if s["sha256"] is not None:
        sha256_hex(s["sha256"], f"{w}.sha256")
    if not isinstance(s["notes"], list) or not all(isinstance(n, str) for n in s["notes"]):
        raise ArtifactError("bad-field", f"{w}.notes", "must be a list of strings")
    return s


def sha256_hex(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ArtifactError("bad-field", where, "must be 64 lowercase hex digits")
    return value
