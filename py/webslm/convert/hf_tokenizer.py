"""The tokenizer of a Hugging Face model directory (tokenizer.json, tokenizer_config.json,
generation_config.json) as the .slm manifest's tokenizer entry: BPE only, with the
pre-tokenizer detected from the table in convert/safetensors.py's docstring (anything else is
refused: a tokenizer that splits text differently yields different ids)."""
from __future__ import annotations

import json

from . import ConversionError

# The GPT-4-style splits as Qwen2 and Llama 3 ship them in tokenizer.json; they differ only in
# how digits group (one at a time vs. up to three).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL_PRE_TOKENIZERS = {
    (("ByteLevel", True),): "gpt2",
    (("Digits", True), ("ByteLevel", True)): "smollm",
    (("Split", QWEN2_SPLIT, "Isolated", False), ("ByteLevel", False)): "qwen2",
    (("Split", LLAMA3_SPLIT, "Isolated", False), ("ByteLevel", False)): "llama3",
}
SPIECE_SPACE = "\u2581"       # ▁


def tokenizer_entry(tj: dict, tc: dict, gen: dict, config: dict, notes: list[str]) -> dict:
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConversionError(f"tokenizer.json model type {model.get('type')!r}: only BPE is supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ConversionError(f"tokenizer.json model.{key} {model[key]!r} is not supported")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ConversionError("tokenizer.json model.dropout: BPE dropout makes tokenization random")
    byte_level, pre_tokenizer = _pre_tokenizer(tj, notes)
    byte_fallback = bool(model.get("byte_fallback", False))
    if byte_level and byte_fallback:
        raise ConversionError("tokenizer.json: byte-level BPE with byte_fallback is not a .slm v1 tokenizer")
    if not byte_level and not byte_fallback:
        raise ConversionError("tokenizer.json: SentencePiece-style BPE without byte_fallback is not supported")
    if bool(model.get("ignore_merges", False)) != (pre_tokenizer == "llama3"):
        raise ConversionError(f"tokenizer.json model.ignore_merges {model.get('ignore_merges')!r} with "
                              f"pre-tokenizer {pre_tokenizer}: only the llama3 split ignores merges")

    tokens, specials = _token_list(model.get("vocab") or {}, tj.get("added_tokens") or [])
    index = {token: i for i, token in enumerate(tokens)}
    merges = _merges(model.get("merges") or [], index)
    unsplit = [s["content"] for s in specials if not s.pop("special")]
    if unsplit:
        notes.append(f"{len(unsplit)} added tokens not marked special are listed as special tokens "
                     f"(tokenizers matches every added token whole): {unsplit[:5]}")

    def token_id(value, what: str) -> int | None:
        content = value.get("content") if isinstance(value, dict) else value
        if content is None:
            return None
        if content not in index:
            raise ConversionError(f"tokenizer_config.json {what} {content!r} is not a token")
        return index[content]

    def config_ids(key: str) -> list[int]:
        for source in (gen, config):
            value = source.get(key)
            if value is not None:
                return [value] if isinstance(value, int) else list(value)
        return []

    bos_id = token_id(tc.get("bos_token"), "bos_token")
    if bos_id is None and config_ids("bos_token_id"):
        bos_id = config_ids("bos_token_id")[0]
    eos_ids = []
    for eos in [token_id(tc.get("eos_token"), "eos_token")] + config_ids("eos_token_id"):
        if eos is not None and eos not in eos_ids:
            eos_ids.append(eos)
    if not eos_ids:
        raise ConversionError("no eos token: tokenizer_config.json eos_token and generation_config/config "
                              "eos_token_id are all missing")
    for what, value in [("bos_token_id", bos_id)] + [("eos_token_id", e) for e in eos_ids]:
        if value is not None and not (type(value) is int and 0 <= value < len(tokens)):
            raise ConversionError(f"{what} {value!r} is not a token id (the tokenizer has {len(tokens)})")

    pad_content = tc.get("pad_token")
    pad_content = pad_content.get("content") if isinstance(pad_content, dict) else pad_content
    pad_id = index.get(pad_content) if pad_content is not None else None
    if pad_content is not None and pad_id is None:
        notes.append(f"pad_token {pad_content!r} is not a token; pad_id left null")
    unk = model.get("unk_token")
    if unk is not None and unk not in index:
        raise ConversionError(f"tokenizer.json unk_token {unk!r} is not a token")

    add_bos, add_eos = _added_by_post_processor(tj.get("post_processor"), tokens, bos_id, eos_ids)
    if tc.get("add_bos_token") is not None:                        # the flag overrides the template
        add_bos = tc["add_bos_token"]
    if tc.get("add_eos_token") is not None:
        add_eos = tc["add_eos_token"]
    if type(add_bos) is not bool or type(add_eos) is not bool:
        raise ConversionError("tokenizer_config.json add_bos_token / add_eos_token must be true or false")
    if add_bos and bos_id is None:
        raise ConversionError("tokenizer_config.json add_bos_token is true but there is no bos token")
    return {
        "model": "bpe", "byte_level": byte_level, "byte_fallback": byte_fallback,
        "pre_tokenizer": pre_tokenizer, "tokens": tokens, "merges": merges, "special_tokens": specials,
        "bos_id": bos_id, "eos_ids": eos_ids, "pad_id": pad_id,
        "unk_id": index[unk] if unk is not None else None, "add_bos": add_bos, "add_eos": add_eos,
    }


def _pre_tokenizer(tj: dict, notes: list[str]) -> tuple[bool, str]:
    """(byte_level, our pre-tokenizer name), by the table in the module docstring."""
    pre, normalizer, decoder = tj.get("pre_tokenizer"), tj.get("normalizer"), tj.get("decoder")
    steps = (pre.get("pretokenizers") or []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    decoders = (decoder.get("decoders") or []) if decoder and decoder.get("type") == "Sequence" \
        else [decoder] if decoder else []
    shown = json.dumps(pre, sort_keys=True)[:300]

    if any(step.get("type") == "ByteLevel" for step in steps):
        signature = []
        for step in steps:
            kind = step.get("type")
            if kind == "ByteLevel":
                if step.get("add_prefix_space", True):
                    raise ConversionError("tokenizer.json ByteLevel add_prefix_space=true is not supported")
                signature.append((kind, bool(step.get("use_regex", True))))
            elif kind == "Digits":
                signature.append((kind, bool(step.get("individual_digits", False))))
            elif kind == "Split":
                signature.append((kind, (step.get("pattern") or {}).get("Regex"), step.get("behavior"),
                                  bool(step.get("invert", False))))
            else:
                signature.append((kind,))
        name = BYTE_LEVEL_PRE_TOKENIZERS.get(tuple(signature))
        if name is None:
            raise ConversionError(f"unknown byte-level pre-tokenizer {shown}; supported: "
                                  f"{', '.join(BYTE_LEVEL_PRE_TOKENIZERS.values())}")
        if [d.get("type") for d in decoders] != ["ByteLevel"]:
            raise ConversionError(f"tokenizer.json decoder {json.dumps(decoder)[:200]}: byte-level BPE "
                                  "needs the ByteLevel decoder")
        if normalizer is not None:
            if normalizer.get("type") != "NFC":
                raise ConversionError(f"tokenizer.json normalizer {json.dumps(normalizer)[:200]} is not supported")
            notes.append("tokenizer.json normalizer NFC is not represented in .slm v1 and was dropped")
        return True, name

    if _is_sentencepiece(steps, normalizer) and any(d.get("type") == "ByteFallback" for d in decoders):
        return False, "sentencepiece"
    raise ConversionError(f"unknown pre-tokenizer {shown} (normalizer {json.dumps(normalizer)[:200]}); "
                          f"supported: {', '.join(BYTE_LEVEL_PRE_TOKENIZERS.values())}, sentencepiece")


def _is_sentencepiece(steps: list[dict], normalizer: dict | None) -> bool:
    """SentencePiece-style: spaces become ▁ and one ▁ is prepended, whichever of the two
    spellings tokenizers uses (normalizer Prepend+Replace, or the Metaspace pre-tokenizer)."""
    if not steps:
        parts = (normalizer or {}).get("normalizers") or []
        return [(p.get("type"), p.get("prepend") or p.get("content")) for p in parts] == \
            [("Prepend", SPIECE_SPACE), ("Replace", SPIECE_SPACE)] and \
            (parts[1].get("pattern") or {}).get("String") == " "
    if len(steps) == 1 and steps[0].get("type") == "Metaspace" and normalizer is None:
        step = steps[0]
        prepends = step.get("prepend_scheme", "always" if step.get("add_prefix_space", True) else "never")
        return step.get("replacement") == SPIECE_SPACE and not step.get("split", False) \
            and prepends in ("first", "always")
    return False


def _token_list(vocab: dict, added: list[dict]) -> tuple[list[str], list[dict]]:
    """tokens[id] from the model vocabulary plus the added tokens; ids must run 0..n-1."""
    by_id: dict[int, str] = {}
    for content, i in vocab.items():
        if type(i) is not int or i < 0 or i in by_id:
            raise ConversionError(f"tokenizer.json vocab: id {i!r} of {content!r} is invalid or repeated")
        by_id[i] = content
    specials = []
    for token in added:
        i, content = token.get("id"), token.get("content")
        if type(i) is not int or i < 0 or not isinstance(content, str) or by_id.get(i, content) != content:
            raise ConversionError(f"tokenizer.json added token {token!r} conflicts with the vocabulary")
        by_id[i] = content
        specials.append({"id": i, "content": content, "special": bool(token.get("special", False))})
    count = max(by_id, default=-1) + 1
    gaps = [i for i in range(count) if i not in by_id]
    if gaps or not count:
        raise ConversionError(f"tokenizer.json: token ids must run 0..n-1; missing {gaps[:10]}")
    tokens = [by_id[i] for i in range(count)]
    if len(set(tokens)) != count:
        raise ConversionError("tokenizer.json: two ids share one token string")
    return tokens, sorted(specials, key=lambda s: s["id"])


def _merges(merges: list, index: dict[str, int]) -> list[str]:
    """Either spelling ("a b" or ["a", "b"]) -> "a b", checked against the vocabulary."""
    out = []
    for n, merge in enumerate(merges):
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(pair) != 2 or not all(isinstance(p, str) and p and " " not in p for p in pair):
            raise ConversionError(f"tokenizer.json merges[{n}] {merge!r}: .slm v1 merges are two "
                                  "space-free tokens")
        left, right = pair
        if left not in index or right not in index or left + right not in index:
            raise ConversionError(f"tokenizer.json merges[{n}] {merge!r}: its sides and their "
                                  "concatenation must all be tokens")
        out.append(f"{left} {right}")
    return out


def _added_by_post_processor(post: dict | None, tokens: list[str], bos_id, eos_ids) -> tuple[bool, bool]:
    """Whether tokenizer.json's TemplateProcessing adds bos before / eos after a single sequence."""
    processors = (post.get("processors") or []) if post and post.get("type") == "Sequence" \
        else [post] if post else []
    add_bos = add_eos = False
    for processor in processors:
        if processor.get("type") != "TemplateProcessing":
            continue
        single = processor.get("single") or []
        around = [i for i, piece in enumerate(single) if "SpecialToken" in piece]
        for i in around:
            content = single[i]["SpecialToken"].get("id")
            if i == 0 and bos_id is not None and content == tokens[bos_id]:
                add_bos = True
            elif i == len(single) - 1 and content in [tokens[e] for e in eos_ids]:
                add_eos = True
            else:
                raise ConversionError(f"tokenizer.json post_processor adds {content!r}, which is neither "
                                      "the bos token in front nor an eos token at the end")
    return add_bos, add_eos


# -- chat template and generation defaults -------------------------------------------------
