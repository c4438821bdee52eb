"""An independent reading of docs/slm-format.md: is this file a valid .slm v1 artifact?

The fuzz tests (test_validate_fuzz.py, bench/fuzz_validate.py) hold the validator against
this: for every mutated file, the validator must accept it exactly when `violation(data)`
is None. Without it a fuzz test can only say "no exception escaped"; a validator that
accepted everything would pass. So this is written from the specification, not from
validate.py: one straight pass over the file, top to bottom, returning the first rule
that fails as a sentence (no error codes: only the verdict is compared). It shares no code
with webslm.artifact: constants, formulas and the tensor set are restated here.

Where the specification leaves a bound to the reader (the longest token, string fields,
the layer count), the bound restated here is the one the specification's "Limits" names.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import struct

import numpy as np

MAGIC = b"\x89SLM\r\n\x1a\n"
MiB, GiB = 1 << 20, 1 << 30
DIM_MAX = 1 << 24


class Invalid(Exception):
    pass


def need(condition, sentence: str) -> None:
    if not condition:
        raise Invalid(sentence)


def violation(data: bytes) -> str | None:
    """None when `data` is a valid .slm v1 file, else the first rule it breaks."""
    try:
        check(bytes(data))
    except Invalid as broken:
        return str(broken)
    return None


# -- small readers -------------------------------------------------------------------------------

class _TooLong:
    """A JSON number with more digits than any field of the format can hold."""


def is_int(v, lo, hi) -> bool:
    return type(v) is int and lo <= v <= hi


def is_real(v, lo, hi, lo_open=False, hi_open=False) -> bool:
    if type(v) not in (int, float):
        return False
    if type(v) is float and not math.isfinite(v):
        return False
    above = v > lo if lo_open else v >= lo
    below = v < hi if hi_open else v <= hi
    return above and below


def is_str(v, max_chars=MiB) -> bool:
    return type(v) is str and len(v) <= max_chars


def exact_keys(v, keys, what) -> dict:
    need(type(v) is dict and set(v) == set(keys), f"{what}: must be an object with exactly {sorted(keys)}")
    return v


def zeros(raw: bytes) -> bool:
    return raw.count(0) == len(raw)


def strict_json(raw: bytes, what: str):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid(f"{what}: not UTF-8") from None

    def pairs(items):
        keys = [k for k, _ in items]
        need(len(keys) == len(set(keys)), f"{what}: duplicate key")
        return dict(items)

    def constant(name):
        raise Invalid(f"{what}: {name} is not JSON")

    def integer(digits):
        return _TooLong() if len(digits) > 40 else int(digits)

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=integer)
    except (ValueError, RecursionError):
        raise Invalid(f"{what}: not JSON") from None
    try:
        json.dumps(value, ensure_ascii=False, default=lambda _: None).encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(f"{what}: a string holds a lone surrogate (not representable in UTF-8)") from None
    return value


# -- the file --------------------------------------------------------------------------------------

def check(data: bytes) -> None:
    need(len(data) >= 128, "shorter than the 128-byte header")
    (magic, version, header_length, m_off, m_len, t_off, t_len, p_off, p_len, file_length,
     alignment) = struct.unpack_from("<8sIIQQQQQQQI", data)
    need(magic == MAGIC, "magic")
    need(version == 1, "format_version")
    need(header_length == 128 and alignment == 256 and m_off == 128, "fixed header fields")
    need(1 <= m_len <= 64 * MiB, "manifest_length")
    need(1 <= t_len <= 16 * MiB, "table_length")
    need(t_off == m_off + m_len, "table_offset")
    need(p_off == -(-(t_off + t_len) // 256) * 256, "payload_offset")
    need(file_length == p_off + p_len + 32, "file_length")
    need(file_length <= 16 * GiB, "file_length over 16 GiB")
    need(data[76:128] == bytes(52), "reserved bytes")
    need(len(data) == file_length, "the file's size is not file_length")
    need(hashlib.sha256(data[:-32]).digest() == data[-32:], "trailer sha256")
    need(zeros(data[t_off + t_len:p_off]), "padding before the payload")

    manifest = exact_keys(strict_json(data[m_off:m_off + m_len], "manifest"), (
        "format", "version", "architecture", "tokenizer", "chat_template", "generation", "source"), "manifest")
    need(manifest["format"] == "webslm.slm" and type(manifest["format"]) is str, "manifest.format")
    need(is_int(manifest["version"], 1, 1), "manifest.version")
    arch = check_architecture(manifest["architecture"])
    check_tokenizer(manifest["tokenizer"], arch["vocab"])
    template = exact_keys(manifest["chat_template"], ("format", "template"), "chat_template")
    need(template["format"] == "jinja" and is_str(template["template"]), "chat_template")
    check_generation(manifest["generation"], arch["context_length"])
    check_source(manifest["source"])

    table = exact_keys(strict_json(data[t_off:t_off + t_len], "table"), ("tensors",), "table")
    check_tensors(table["tensors"], arch, data, p_off, p_len)


def check_architecture(a) -> dict:
    a = exact_keys(a, ("family", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden", "ffn", "vocab",
                       "context_length", "norm_eps", "tied_output", "qkv_bias", "rope"), "architecture")
    need(a["family"] == "llama" and type(a["family"]) is str, "family")
    need(is_int(a["n_layers"], 1, 4096), "n_layers")
    for key in ("n_heads", "n_kv_heads", "head_dim", "hidden", "ffn", "vocab", "context_length"):
        need(is_int(a[key], 1, DIM_MAX), key)
    need(is_real(a["norm_eps"], 0, 1, lo_open=True, hi_open=True), "norm_eps")
    need(type(a["tied_output"]) is bool and type(a["qkv_bias"]) is bool, "tied_output/qkv_bias")
    r = exact_keys(a["rope"], ("base", "rotary_dim", "convention", "position_offset", "scaling"), "rope")
    need(is_real(r["base"], 0, 1e12, lo_open=True), "rope.base")
    need(is_int(r["rotary_dim"], 2, DIM_MAX), "rope.rotary_dim")
    need(r["convention"] in ("rotate-half", "adjacent-pair") and type(r["convention"]) is str, "rope.convention")
    need(is_int(r["position_offset"], 0, DIM_MAX), "rope.position_offset")
    need(r["scaling"] is None, "rope.scaling")
    need(a["hidden"] == a["n_heads"] * a["head_dim"], "hidden != n_heads * head_dim")
    need(a["n_heads"] % a["n_kv_heads"] == 0, "n_heads % n_kv_heads")
    need(r["rotary_dim"] % 2 == 0 and r["rotary_dim"] <= a["head_dim"], "rotary_dim")
    need(r["position_offset"] < a["context_length"], "position_offset leaves no context")
    return a


def check_tokenizer(t, vocab: int) -> None:
    t = exact_keys(t, ("model", "byte_level", "byte_fallback", "pre_tokenizer", "tokens", "merges",
                       "special_tokens", "bos_id", "eos_ids", "pad_id", "unk_id", "add_bos", "add_eos"), "tokenizer")
    need(t["model"] == "bpe" and type(t["model"]) is str, "tokenizer.model")
    need(type(t["byte_level"]) is bool and type(t["byte_fallback"]) is bool, "byte_level/byte_fallback")
    if t["byte_level"]:
        need(t["pre_tokenizer"] in ("gpt2", "smollm", "qwen2", "llama3") and not t["byte_fallback"],
             "byte-level BPE: a GPT-2-style pre-tokenizer, no byte fallback")
    else:
        need(t["pre_tokenizer"] == "sentencepiece" and t["byte_fallback"], "SentencePiece BPE: byte fallback")
    need(type(t["pre_tokenizer"]) is str, "pre_tokenizer")
    tokens = t["tokens"]
    need(type(tokens) is list and 1 <= len(tokens) <= vocab, "tokens: 1 to vocab strings")
    need(all(type(s) is str and 1 <= len(s) <= 4096 for s in tokens), "tokens: non-empty strings")
    need(len(set(tokens)) == len(tokens), "tokens: unique")
    known = set(tokens)
    need(type(t["merges"]) is list, "merges: a list")
    for merge in t["merges"]:
        need(type(merge) is str and merge.count(" ") == 1, "merge: \"left right\"")
        left, right = merge.split(" ")
        need(left in known and right in known and left + right in known, "merge: sides and result are tokens")

    def is_id(v) -> bool:
        return is_int(v, 0, len(tokens) - 1)

    need(type(t["special_tokens"]) is list, "special_tokens: a list")
    for special in t["special_tokens"]:
        special = exact_keys(special, ("id", "content"), "special token")
        need(is_id(special["id"]) and special["content"] == tokens[special["id"]], "special token")
    need(all(t[k] is None or is_id(t[k]) for k in ("bos_id", "pad_id", "unk_id")), "bos/pad/unk id")
    need(type(t["eos_ids"]) is list and len(t["eos_ids"]) >= 1 and all(is_id(e) for e in t["eos_ids"]), "eos_ids")
    need(type(t["add_bos"]) is bool and type(t["add_eos"]) is bool, "add_bos/add_eos")
    need(not t["add_bos"] or t["bos_id"] is not None, "add_bos without bos_id")


def check_generation(g, context_length: int) -> None:
    g = exact_keys(g, ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens"), "generation")
    need(is_real(g["temperature"], 0, 100), "temperature")
    need(is_real(g["top_p"], 0, 1, lo_open=True), "top_p")
    need(is_int(g["top_k"], 0, DIM_MAX), "top_k")
    need(is_real(g["min_p"], 0, 1, hi_open=True), "min_p")
    need(is_real(g["repetition_penalty"], 0, 100, lo_open=True), "repetition_penalty")
    need(is_int(g["max_new_tokens"], 1, context_length), "max_new_tokens")


def check_source(s) -> None:
    s = exact_keys(s, ("format", "file", "sha256", "converter", "notes"), "source")
    need(all(is_str(s[k], 4096) for k in ("format", "file", "converter")), "source strings")
    need(s["sha256"] is None or is_hex64(s["sha256"]), "source.sha256")
    need(type(s["notes"]) is list and all(type(n) is str for n in s["notes"]), "source.notes")


def is_hex64(v) -> bool:
    return type(v) is str and re.fullmatch("[0-9a-f]{64}", v) is not None


# -- the tensor table and the payload --------------------------------------------------------------

def tensor_set(a: dict) -> dict:
    h, q, kv, ffn, vocab = a["hidden"], a["n_heads"] * a["head_dim"], a["n_kv_heads"] * a["head_dim"], a["ffn"], a["vocab"]
    shapes = {"token_embd": [vocab, h], "output_norm": [h]}
    if not a["tied_output"]:
        shapes["output"] = [vocab, h]
    for i in range(a["n_layers"]):
        layer = {"attn_norm": [h], "attn_q": [q, h], "attn_k": [kv, h], "attn_v": [kv, h], "attn_output": [h, q],
                 "ffn_norm": [h], "ffn_gate": [ffn, h], "ffn_up": [ffn, h], "ffn_down": [h, ffn]}
        if a["qkv_bias"]:
            layer |= {"attn_q.bias": [q], "attn_k.bias": [kv], "attn_v.bias": [kv]}
        shapes |= {f"blk.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


QUANT_KEYS = ("block_elements", "blocks_per_row", "tail_elements", "scale_type", "scale_layout", "zero",
              "zero_offset", "min_type", "code_signedness", "nibble_order")


def check_tensors(entries, arch: dict, data: bytes, p_off: int, p_len: int) -> None:
    need(type(entries) is list and len(entries) <= 65536, "tensors: a list")
    wanted = tensor_set(arch)
    seen, cursor = set(), 0
    for e in entries:
        e = exact_keys(e, ("name", "shape", "encoding", "quant", "row_stride", "parts", "sha256"), "tensor")
        name = e["name"]
        need(type(name) is str and name in wanted and name not in seen, "tensor name")
        seen.add(name)
        shape = e["shape"]
        need(type(shape) is list and all(type(d) is int for d in shape) and shape == wanted[name], f"{name}: shape")
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
        encoding = e["encoding"]
        need(encoding in ("f32", "f16", "q8", "q4") and type(encoding) is str, f"{name}: encoding")
        need(len(shape) == 2 or encoding in ("f32", "f16"), f"{name}: a vector must be f32 or f16")
        if encoding in ("f32", "f16"):
            need(e["quant"] is None, f"{name}: quant must be null")
            stride = 4 * cols if encoding == "f32" else -(-2 * cols // 4) * 4
            order, lengths = ["data"], {"data": rows * stride}
            block = scale_bytes = None
        else:
            q = exact_keys(e["quant"], QUANT_KEYS, f"{name}.quant")
            block = q["block_elements"]
            need(type(block) is int and block in (32, 64, 128, 256), f"{name}: block_elements")
            blocks = -(-cols // block)
            zero = q["zero"]
            need(zero == "none" if encoding == "q8" else zero in ("offset", "min"), f"{name}: zero")
            need(q["scale_type"] in ("f16", "f32"), f"{name}: scale_type")
            expect = {"blocks_per_row": blocks, "tail_elements": cols - (blocks - 1) * block,
                      "scale_layout": "rows-by-blocks",
                      "zero_offset": 8 if zero == "offset" else None,
                      "min_type": q["scale_type"] if zero == "min" else None,
                      "code_signedness": "signed" if encoding == "q8" else "unsigned",
                      "nibble_order": "low-first" if encoding == "q4" else None}
            for key, value in expect.items():
                need(q[key] == value and type(q[key]) is type(value), f"{name}: quant.{key}")
            stride = blocks * block if encoding == "q8" else blocks * block // 2
            scale_bytes = 2 if q["scale_type"] == "f16" else 4
            order = ["codes", "scales"] + (["mins"] if zero == "min" else [])
            lengths = {"codes": rows * stride, "scales": rows * blocks * scale_bytes, "mins": rows * blocks * scale_bytes}
        need(type(e["row_stride"]) is int and e["row_stride"] == stride, f"{name}: row_stride")
        parts = e["parts"]
        need(type(parts) is dict and set(parts) == set(order), f"{name}: parts")
        spans = {}
        for part in order:
            span = parts[part]
            need(type(span) is list and len(span) == 2 and all(type(v) is int for v in span), f"{name}.{part}")
            offset, length = span
            need(length == lengths[part], f"{name}.{part}: length")
            need(offset == -(-cursor // 256) * 256, f"{name}.{part}: offset")
            need(offset + length <= p_len, f"{name}.{part}: past the payload")
            need(zeros(data[p_off + cursor:p_off + offset]), f"{name}.{part}: padding before it")
            spans[part] = data[p_off + offset:p_off + offset + length]
            cursor = offset + length
        need(is_hex64(e["sha256"]), f"{name}: sha256 field")
        need(hashlib.sha256(b"".join(spans[p] for p in order)).hexdigest() == e["sha256"], f"{name}: sha256")
        check_values(name, encoding, rows, cols, stride, block, scale_bytes, spans)
    need(set(wanted) <= seen, "a required tensor is missing")
    need(cursor == p_len, "payload_length is not the end of the last part")


def check_values(name, encoding, rows, cols, stride, block, scale_bytes, spans) -> None:
    if encoding in ("f32", "f16"):
        itemsize = 4 if encoding == "f32" else 2
        values = np.frombuffer(spans["data"], f"<f{itemsize}").reshape(rows, stride // itemsize)
        need(np.isfinite(values[:, :cols]).all(), f"{name}: NaN or infinity")
        need(not values[:, cols:].view(f"<u{itemsize}").any(), f"{name}: row padding")
        return
    for side in ("scales", "mins"):
        if side in spans:
            need(np.isfinite(np.frombuffer(spans[side], f"<f{scale_bytes}")).all(), f"{name}.{side}: NaN or infinity")
    codes = np.frombuffer(spans["codes"], np.uint8).reshape(rows, stride)
    if encoding == "q8":
        padding = codes[:, cols:]
    else:   # two codes a byte, element 2i in the low nibble of byte i
        nibbles = np.stack([codes & 15, codes >> 4], axis=2).reshape(rows, 2 * stride)
        padding = nibbles[:, cols:]
    need(not padding.any(), f"{name}: codes past the last element are not zero")
