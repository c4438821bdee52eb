"""The semantic host end to end on the default model: chat template -> tokenizer -> sampler
-> ledger -> streamed text, as the engine will drive it, with logits made up for the test.
What the page shows (the ledger's committed text) must be exactly decode(committed ids)."""
import pathlib

import numpy as np
import pytest

import webslm
from webslm.semantic.tokenizer import StreamDecoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"


@pytest.fixture(scope="module")
def model():
    if not MODEL.is_file():
        pytest.skip("default model not built: run `python tools/assets.py` (part of set-up)")
    return webslm.open_model(MODEL)


def fake_logits(step: int, vocab: int) -> np.ndarray:
    """Deterministic logits favouring ordinary text tokens (ids 300..5000)."""
    logits = np.full(vocab, -20.0, dtype=np.float32)
    span = np.arange(300, 5000)
    logits[span] = np.sin(span * (0.37 + step * 0.011)).astype(np.float32) * 4
    return logits


def generate(model, seed: int, cancel_after: int | None = None):
    prompt = model.chat_template.render([{"role": "user", "content": "Name three colours. Ça va? 你好"}])
    prompt_ids = model.tokenizer.encode(prompt)
    assert model.tokenizer.decode(prompt_ids) == prompt
    settings = webslm.SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=seed)
    sampler = webslm.Sampler(settings, model.architecture.vocab, history=prompt_ids, position=len(prompt_ids))
    ledger = webslm.Ledger()
    epoch = ledger.begin(prompt_ids)
    stream = StreamDecoder(model.tokenizer)
    for step in range(24):
        position = len(prompt_ids) + step
        token = sampler.choose(fake_logits(step, model.architecture.vocab), position)
        record = ledger.offer(epoch, position, token, sampler.state_hash_after(token), stream.push(token))
        assert record is not None
        sampler.commit(token)
        assert ledger.offer(epoch, position, token, record.sampler_state_hash, "") is None   # a duplicate is dropped
        if cancel_after is not None and step == cancel_after:
            ledger.cancel()
            assert ledger.offer(epoch, position + 1, token, record.sampler_state_hash, "x") is None
            break
    return prompt_ids, ledger


def test_committed_text_is_the_streamed_decoding_of_committed_ids(model):
    prompt_ids, ledger = generate(model, seed=7)
    ids = list(ledger.committed_ids)
    assert len(ids) == 24
    assert ledger.committed_text == model.tokenizer.decode(ids)
    assert ledger.replay().committed_ids == tuple(ids)


def test_same_seed_same_answer_other_seed_other_answer(model):
    assert generate(model, 7)[1].committed_ids == generate(model, 7)[1].committed_ids
    assert generate(model, 7)[1].committed_ids != generate(model, 8)[1].committed_ids


def test_nothing_commits_after_cancel(model):
    _, ledger = generate(model, seed=3, cancel_after=5)
    assert len(ledger.committed_ids) == 6
    assert ledger.dropped["stale"] == 1 and ledger.dropped["duplicate"] == 6
