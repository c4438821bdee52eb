"""The manifest's "tokenizer" section (and a chat template) from a GGUF's tokenizer metadata.

    tokenizer_section(meta, vocab, family) -> dict      docs/slm-format.md, "tokenizer"

tokenizer.ggml.model "gpt2" is GPT-2 byte-level BPE with merges; "llama" is SentencePiece-style
BPE with byte fallback. Gemma's GGUFs ("llama" model, family gemma3) differ from Llama 2's:

- no merges: llama.cpp tokenizes them by token scores. We recover merges from the vocabulary
  as transformers' GGUF loader does for Gemma: every cut of a token into two tokens is a merge,
  ranked by the merged token's place in the vocabulary (earlier first; Gemma's scores do not
  follow its merge order, its token order does), then the longer left piece first;
- tokens made only of whitespace with a space in them ("  ", 30 of them, user-defined) are
  stored with real spaces; Gemma's tokenizer spells spaces "▁", so they are respelled "▁▁";
- no "▁" is prepended to the text (tokenizer.ggml.add_space_prefix false): pre_tokenizer "gemma";
- CONTROL tokens are special (skipped when decoding skips specials); USER_DEFINED ones ("\n\n",
  "\t", "<start_of_image>") become `added_tokens`: matched whole in the text, decoded as text.

A base Gemma 3 GGUF carries no chat template; Gemma 3's turn format is written here (our own
Jinja) so that chat prompts render as the model family expects, and <end_of_turn> ends an answer.
"""
from __future__ import annotations

from . import ConversionError

# tokenizer.ggml.pre (llama.cpp's names) -> our pre_tokenizer for byte-level BPE.
PRE_TOKENIZERS = {"default": "gpt2", "gpt-2": "gpt2", "gpt2": "gpt2", "smollm": "smollm",
                  "qwen2": "qwen2", "llama-bpe": "llama3", "llama3": "llama3"}

# gguf.TokenType values: CONTROL and USER_DEFINED.
CONTROL, USER_DEFINED = 3, 4
SPACE_MARK = "\u2581"

# Gemma 3's chat format: <bos>, then per turn "<start_of_turn>{role}\n{content}<end_of_turn>\n"
# with role "user" or "model" (an "assistant" message is the model's turn); a leading system
# message is folded into the first user turn, followed by a blank line; contents are trimmed.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] | trim + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n"
    "{{ (prefix if loop.first else '') + message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
GEMMA3_END_OF_TURN = "<end_of_turn>"


def tokenizer_section(meta, vocab: int, family: str) -> dict:
    """`meta` is gguf.py's _Metadata (typed access, ConversionError on a missing key)."""
    model = meta.get("tokenizer.ggml.model")
    gemma = family == "gemma3" and model == "llama"
    if model == "gpt2":                                    # GPT-2 byte-level BPE
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ConversionError(f"{meta.file_name}: pre-tokenizer {pre!r} is not supported "
                                  f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        kind = {"byte_level": True, "byte_fallback": False, "pre_tokenizer": PRE_TOKENIZERS[pre]}
        add_bos_default = False
    elif model == "llama":                                 # SentencePiece-style BPE
        kind = {"byte_level": False, "byte_fallback": True, "pre_tokenizer": "gemma" if gemma else "sentencepiece"}
        add_bos_default = True
    else:
        raise ConversionError(f"{meta.file_name}: tokenizer model {model!r} is not supported "
                              "(supported: gpt2, llama)")
    tokens = list(meta.get("tokenizer.ggml.tokens"))
    if gemma:
        tokens = [SPACE_MARK * len(t) if " " in t and not t.strip() else t for t in tokens]
        if meta.get("tokenizer.ggml.add_space_prefix", False):
            raise ConversionError(f"{meta.file_name}: a Gemma tokenizer that adds a space prefix is not supported")
    merges = meta.get("tokenizer.ggml.merges", None)
    if merges is None and gemma:
        merges = merges_from_vocabulary(tokens)
    if merges is None:
        raise ConversionError(f"{meta.file_name}: tokenizer has no merges "
                              "(score-based SentencePiece vocabularies are supported for Gemma only)")
    if len(tokens) > vocab:
        raise ConversionError(f"{meta.file_name}: {len(tokens)} tokens but only {vocab} embedding rows")
    if len(set(tokens)) != len(tokens):
        raise ConversionError(f"{meta.file_name}: token strings are not unique")
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))

    def token_id(key: str):
        value = meta.get(key, None)
        if value is not None and not 0 <= value < len(tokens):
            raise ConversionError(f"{meta.file_name}: {key} {value} is not a token id")
        return value

    eos_ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = token_id(key)
        if value is not None and value not in eos_ids:
            eos_ids.append(value)
    if gemma and GEMMA3_END_OF_TURN in tokens and tokens.index(GEMMA3_END_OF_TURN) not in eos_ids:
        eos_ids.append(tokens.index(GEMMA3_END_OF_TURN))      # a chat answer ends its turn with it
    special_types = (CONTROL,) if gemma else (CONTROL, USER_DEFINED)
    section = {
        "model": "bpe", **kind,
        "tokens": tokens,
        "merges": merges,
        "special_tokens": [{"id": i, "content": tokens[i]} for i, t in enumerate(types) if t in special_types],
        "bos_id": token_id("tokenizer.ggml.bos_token_id"),
        "eos_ids": eos_ids,
        "pad_id": token_id("tokenizer.ggml.padding_token_id"),
        "unk_id": token_id("tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        "add_eos": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    if gemma:
        section["added_tokens"] = [{"id": i, "content": tokens[i]} for i, t in enumerate(types) if t == USER_DEFINED]
    return section


def merges_from_vocabulary(tokens: list[str]) -> list[str]:
    """A SentencePiece BPE vocabulary's merges, recovered from the tokens alone: for each token
    in vocabulary order, each cut into two tokens, the longer left piece first."""
    index = set(tokens)
    merges = []
    for token in tokens:
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                if " " in token:
                    raise ConversionError(f"token {token!r} has a space: it cannot be written as a merge")
                merges.append(f"{left} {right}")
    return merges


def chat_template(meta, family: str) -> tuple[str, str | None]:
    """(the template, a note when it is not the GGUF's own)."""
    template = meta.get("tokenizer.chat_template", None)
    if template is not None:
        return template, None
    if family == "gemma3":
        return GEMMA3_CHAT_TEMPLATE, ("chat template: the GGUF has none; Gemma 3's turn format "
                                      "(<start_of_turn>user/model ... <end_of_turn>) was supplied")
    raise ConversionError(f"{meta.file_name}: metadata key 'tokenizer.chat_template' is missing")
