"""A prompt is checked against the context before it is tokenized in full.

`Tokenizer.encode(text, max_tokens=n)` must give exactly encode(text)'s ids when there are
at most n, and otherwise raise TooManyTokens having looked at about n tokens' worth of text:
the pre-tokenizer runs a window at a time (its pieces must be the whole text's pieces), and
a word whose symbols alone need more than the tokens left is not merged. request.prompt_ids
turns that into InvalidRequest "prompt-too-long" for the CLI, the Python API and the worker.
"""
from __future__ import annotations

import functools
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import webslm
from webslm.request import InvalidRequest, prompt_ids
from webslm.semantic import pretokenize, tokenizer as tokenizer_module
from webslm.semantic.tokenizer import Tokenizer, TooManyTokens

from test_tokenizer import EMOJI, SLM, SPACES, gguf_tokenizer_section, vocab_dir

# Text made of what the split patterns treat specially: runs of letters, digits (single and
# grouped), every kind of space and newline, apostrophes and contractions, punctuation runs,
# non-ASCII letters, combining marks (NFC for qwen2), emoji.
ATOMS = ["a", "b", "Z", "é", "e\u0301", "\u0301", "ß", "ж", "中", "1", "23", "٣", "'", "'s", "'LL", "!", "?.", "-",
         "_", "$", *SPACES, *EMOJI[:4]]
texts = st.lists(st.sampled_from(ATOMS), max_size=80).map("".join)
SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(text=texts, window=st.integers(2, 12), family=st.sampled_from(sorted(pretokenize.SPLITTERS)))
def test_windowed_pieces_are_the_whole_texts_pieces(text, window, family, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "WINDOW", window)
    tok = Tokenizer(["a"], [], byte_level=True, pre_tokenizer=family)
    assert list(tok._windowed(text)) == pretokenize.SPLITTERS[family](text)


@functools.cache
def tokenizers():
    """SmolLM2 (from set-up) and llama.cpp's vocabularies (one of them SentencePiece-style)."""
    found = []
    if SLM.exists():
        found.append(("smollm2", Tokenizer.from_manifest(webslm.open_model(SLM).manifest.tokenizer)))
    try:
        directory = vocab_dir()
    except BaseException:           # noqa: BLE001 - pytest.skip inside: the vocabularies are not there
        return found
    for name in ("llama-spm", "llama-bpe", "qwen2", "gpt-2"):
        found.append((name, Tokenizer.from_manifest(gguf_tokenizer_section(directory / f"ggml-vocab-{name}.gguf"))))
    return found


@pytest.fixture(scope="module", params=["smollm2", "llama-spm", "llama-bpe", "qwen2", "gpt-2"])
def tok(request):
    found = dict(tokenizers())
    if request.param not in found:
        pytest.skip(f"{request.param} is not available (run set-up)")
    return found[request.param]


@SETTINGS
@given(text=texts, window=st.sampled_from([3, 7, 64, 1 << 16]), slack=st.integers(0, 3))
def test_a_bounded_encoding_is_the_encoding_or_too_many_tokens(tok, text, window, slack, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "WINDOW", window)
    ids = tok.encode(text)
    assert tok.encode(text, max_tokens=len(ids) + slack) == ids
    if ids:
        with pytest.raises(TooManyTokens):
            tok.encode(text, max_tokens=len(ids) - 1 - min(slack, len(ids) - 1))


def test_twenty_megabytes_are_refused_after_about_one_contexts_worth(tok, monkeypatch):
    """Counted, not timed: the characters pre-tokenized, the symbols merged, the traced peak."""
    split_chars, merged = [0], [0]
    split = tok._split_normalized if tok.byte_level else None
    if split is not None:
        def counting_split(text):
            split_chars[0] += len(text)
            return split(text)
        monkeypatch.setattr(tok, "_split_normalized", counting_split)
    merge = tokenizer_module._merge

    def counting_merge(symbols, ranks):
        merged[0] = max(merged[0], len(symbols))
        return merge(symbols, ranks)
    monkeypatch.setattr(tokenizer_module, "_merge", counting_merge)
    text = "The quick brown fox jumps over the lazy dog. 12345 " * (20_000_000 // 51)
    tracemalloc.start()
    with pytest.raises(TooManyTokens):
        tok.encode(text, max_tokens=8192)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 48 << 20, f"traced peak {peak >> 20} MiB"
    assert split_chars[0] < 4 * tokenizer_module.WINDOW
    assert merged[0] <= 8192 * tok.max_token_chars


@pytest.mark.parametrize("run", ["a", "\U0001f600", " ", "1"])
def test_one_huge_word_is_refused_without_merging_it(tok, run):
    text = run * 2_000_000
    tracemalloc.start()
    with pytest.raises(TooManyTokens):
        tok.encode(text, max_tokens=100)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 << 20, f"traced peak {peak >> 20} MiB for {len(text)} characters"


# -- request.prompt_ids: the bound every caller goes through ---------------------------------------

@pytest.fixture(scope="module")
def model(fixture_slm_path):
    return webslm.open_model(fixture_slm_path)


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_tokenized(model):
    context = model.architecture.context_length
    with pytest.raises(InvalidRequest) as caught:
        prompt_ids(model, "word " * 5_000_000, chat=False)
    assert caught.value.code == "prompt-too-long" and str(context) in caught.value.sentence
    with pytest.raises(InvalidRequest) as caught:
        prompt_ids(model, [{"role": "user", "content": "\U0001f600" * 100_000}] * 39)
    assert caught.value.code == "prompt-too-long"


def test_a_prompt_that_fills_the_context_exactly_is_taken(model):
    text, ids = "", []
    while True:                      # the longest "a a a ..." that fits
        longer = text + " a"
        longer_ids = model.tokenizer.encode(longer)
        if len(longer_ids) > model.architecture.context_length:
            break
        text, ids = longer, longer_ids
    assert len(ids) == model.architecture.context_length
    assert prompt_ids(model, text, chat=False) == ids
    with pytest.raises(InvalidRequest):
        prompt_ids(model, text + " a", chat=False)


@pytest.mark.parametrize("prompt, chat, system", [
    ("a\udcff", False, None),                         # invalid UTF-8 on a command line, surrogate-escaped
    ("fine", True, "\ud800"),
    ([{"role": "user", "content": "x\udc80"}], True, None),
])
def test_text_that_is_not_unicode_is_a_bad_prompt(model, prompt, chat, system):
    with pytest.raises(InvalidRequest) as caught:
        prompt_ids(model, prompt, chat, system)
    assert caught.value.code == "bad-prompt"


def test_a_template_that_fails_is_a_typed_refusal(model, monkeypatch):
    from webslm.semantic.chat_template import ChatTemplate
    monkeypatch.setattr(model, "chat_template", ChatTemplate("{{ '%(a)999999999s' % {'a': 1} }}"))
    with pytest.raises(InvalidRequest) as caught:
        prompt_ids(model, "hi")
    assert caught.value.code == "bad-template"


def test_too_many_tokens_names_the_limit_asked_for(tok):
    with pytest.raises(TooManyTokens) as caught:
        tok.encode("word " * 100 + "a" * 100_000, max_tokens=50)
    assert caught.value.limit == 50


def test_the_python_api_refuses_it_before_any_work(model):
    """Engine.generate goes through prompt_ids: the same refusal, as an EngineError."""
    import asyncio

    from webslm.engine import Engine
    from webslm.engine.engine import EngineError

    async def scenario():
        engine = Engine(model)
        await engine.load()
        try:
            async for _ in engine.generate("word " * 1_000_000, chat=False):
                pass
        finally:
            await engine.unload()
    with pytest.raises(EngineError) as caught:
        asyncio.run(scenario())
    assert caught.value.code == "prompt-too-long"
