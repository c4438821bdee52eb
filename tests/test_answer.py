"""answer.py's Answer.accept, the per-token order both generation loops share, and the
padding id: a vocabulary larger than the tokenizer's token list (the fixture's id 299) can be
sampled, and must be committed with no text while the answer goes on.

The padding id is picked on purpose by a scripted backend: at each position its logits row
puts one chosen token far above the rest, so greedy and sampled decoding alike choose it.
The same script runs under generate.py's loop, the Engine on the CPU path, and the Engine
on a (scripted) GPU that is lost right after the padding id, so the CPU rebuild replays it.
"""
from __future__ import annotations

import numpy as np
import pytest

import webslm
from webslm.answer import Answer, Delta
from webslm.backends.cpu_path import CpuPath
from webslm.backends.scores import BackendLost
from webslm.engine import Engine, State
from webslm.generate import generate
from webslm.request import prompt_ids
from webslm.semantic.ledger import Ledger
from webslm.semantic.sampler import SamplerSettings
from webslm.semantic.tokenizer import BYTE_TO_CHAR, StreamDecoder

GREEDY = SamplerSettings(temperature=0.0)
SAMPLED = SamplerSettings(temperature=0.8, top_k=40, seed=5)


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


@pytest.fixture(scope="module")
def ids(model):
    return prompt_ids(model, "hi", chat=True)


@pytest.fixture(scope="module")
def padding(model):
    pad = len(model.tokenizer.tokens)
    assert pad < model.architecture.vocab, "the fixture must have a padding id to test"
    return pad


def token(model, text: str) -> int:
    return model.tokenizer.token_to_id(text)


def byte(model, value: int) -> int:
    return model.tokenizer.token_to_id(BYTE_TO_CHAR[value])


# -- the stream decoder --------------------------------------------------------------------------

def test_a_padding_id_decodes_to_nothing_and_keeps_a_pending_character(model, padding):
    """é is the bytes C3 A9; a padding id between them must neither raise nor break it."""
    stream = StreamDecoder(model.tokenizer, skip_special=True)
    assert [stream.push(i) for i in (token(model, "he"), byte(model, 0xC3), padding, byte(model, 0xA9))] \
        == ["he", "", "", "é"]
    assert stream.flush() == ""
    assert model.tokenizer.decode([token(model, "he"), padding, padding]) == "he"
    with pytest.raises(IndexError):
        StreamDecoder(model.tokenizer).push(-1)


# -- a scripted backend --------------------------------------------------------------------------

class ScriptedCpu:
    """CpuBackend's surface (reset, prefill, decode_one, rebuild, their step generators,
    truncate, position) with made-up
    logits: at each position after the prompt, the next token of `script` scores 30 and
    every other token 0; past the script, EOS scores 30."""

    def __init__(self, model, prompt_len: int, script: list[int]):
        self.vocab, self.eos = model.architecture.vocab, model.manifest.tokenizer["eos_ids"][0]
        self.prompt_len, self.script = prompt_len, script
        self.position = 0

    def _row(self) -> np.ndarray:
        step = self.position - self.prompt_len
        row = np.zeros(self.vocab, np.float32)
        row[self.script[step] if step < len(self.script) else self.eos] = 30.0
        return row

    def reset(self):
        self.position = 0

    def prefill(self, ids):
        self.position += len(ids)
        return self._row()

    def decode_one(self, token):
        self.position += 1
        return self._row()

    def rebuild(self, ids):
        self.position = len(ids)
        return self._row()

    # CpuBackend's step generators (what the CPU path drives), here without a pause
    def prefill_steps(self, ids):
        yield from ()
        return self.prefill(ids)

    def decode_steps(self, token):
        yield from ()
        return self.decode_one(token)

    def rebuild_steps(self, ids):
        yield from ()
        return self.rebuild(ids)

    def truncate(self, position):
        self.position = position


class LosingScriptedGpu(CpuPath):
    """The scripted backend playing the GPU executor, lost when asked for `lose_at`."""
    kind = "gpu"

    def __init__(self, backend, lose_at: int):
        super().__init__(None, backend)
        self.lose_at = lose_at

    async def decode_one(self, token, want, epoch=0):
        if self.position + 1 >= self.lose_at:
            raise BackendLost("device-lost", "scripted gpu", "the scripted device was lost")
        return await super().decode_one(token, want, epoch)


@pytest.fixture(scope="module")
def script(model, padding):
    """"he", the first byte of é, the padding id, the second byte, " the"; then EOS."""
    return [token(model, "he"), byte(model, 0xC3), padding, byte(model, 0xA9), token(model, "Ġthe")]


def expected_deltas(model, script):
    he, _, _, a9, the = script
    return [Delta("he", he), Delta("é", a9), Delta(" the", the), Delta("", None, "stop")]


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_generate_commits_a_padding_id_with_no_text_and_goes_on(model, ids, script, settings):
    ledger = Ledger()
    deltas = list(generate(model, ScriptedCpu(model, len(ids), script), ids, settings, ledger=ledger))
    assert deltas == expected_deltas(model, script)
    assert ledger.committed_ids == tuple(script)
    assert ledger.committed_text == "heé the"
    assert [r.position for r in ledger.records] == list(range(len(ids), len(ids) + len(script)))


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_engine_commits_a_padding_id_with_no_text_and_goes_on(model, ids, script, settings, run):
    engine = Engine(model, cpu_backend=lambda: ScriptedCpu(model, len(ids), script))
    run(engine.load())

    async def answer():
        return [d async for d in engine.generate(ids, settings)]
    assert run(answer()) == expected_deltas(model, script)
    assert engine.ledger.committed_ids == tuple(script)
    assert engine.last_timings.generated_tokens == len(script)


def test_a_loss_right_after_a_padding_id_replays_it_on_the_cpu(model, ids, script, run):
    after_padding = len(ids) + 3                 # the GPU is lost asked for the token after it
    events = []

    async def build(gpu, model_, policy, on_stage):
        return LosingScriptedGpu(ScriptedCpu(model, len(ids), script), after_padding), {}
    engine = Engine(model, gpu=object(), on_event=events.append, build_gpu_backend=build,
                    cpu_backend=lambda: ScriptedCpu(model, len(ids), script))
    assert run(engine.load()) is State.GPU_READY

    async def answer():
        return [d async for d in engine.generate(ids, SAMPLED)]
    assert run(answer()) == expected_deltas(model, script)
    assert engine.ledger.committed_ids == tuple(script)
    assert any(e.get("to") == "CPURebuild" for e in events) and engine.backend_kind == "cpu"


# -- accept's order ------------------------------------------------------------------------------

def fresh(model, ids, settings=GREEDY) -> Answer:
    return Answer(model, ids, settings, Ledger())


def test_eos_ends_the_answer_without_committing_it(model, ids):
    answer = fresh(model, ids)
    eos = model.manifest.tokenizer["eos_ids"][0]
    assert answer.accept(eos, answer.epoch) == Delta("", None, "stop")
    assert answer.ledger.committed_ids == () and answer.position == len(ids)
    assert answer.end("stop") == Delta("", None, "stop") and not answer.ledger.is_open


def test_a_token_the_ledger_refuses_is_not_committed_by_the_sampler(model, ids):
    answer = fresh(model, ids)
    answer.ledger.cancel()                       # cancelled between the choice and accept()
    he = token(model, "he")
    assert answer.accept(he, answer.epoch) == Delta("", None, "abort")
    assert answer.position == len(ids) and answer.timings.generated_tokens == 0
    assert answer.end("abort") == Delta("", None, "abort")


def test_a_stop_sequence_is_held_back_and_never_shown(model, ids):
    answer = fresh(model, ids, SamplerSettings(temperature=0.0, stop=("e t",)))
    assert answer.accept(token(model, "he"), answer.epoch) == Delta("h", token(model, "he"))   # "e" held
    assert answer.accept(token(model, "Ġthe"), answer.epoch) == Delta("", None, "stop")
    assert answer.ledger.committed_text == "he the"             # committed, not shown


def test_the_last_token_allowed_ends_the_answer_with_what_was_held(model, ids):
    answer = fresh(model, ids, SamplerSettings(temperature=0.0, stop=("e t",), max_tokens=1))
    assert answer.has_room
    assert answer.accept(token(model, "he"), answer.epoch) == Delta("he", None, "length")
    assert not answer.has_room


def test_an_answer_ends_once(model, ids):
    answer = fresh(model, ids)
    answer.accept(token(model, "he"), answer.epoch)
    assert answer.end("length", "tail") == Delta("tail", None, "length")
    epoch = answer.ledger.epoch
    assert answer.end("stop", "again") == Delta("", None, "length")
    assert answer.ledger.epoch == epoch and answer.finish_reason == "length"


def test_an_answer_cancelled_meanwhile_ends_abort_with_no_text(model, ids):
    answer = fresh(model, ids)
    answer.ledger.begin([1, 2])                  # another answer superseded this one
    assert answer.end("stop", "text") == Delta("", None, "abort")


def test_a_prompt_that_fills_the_context_ends_length_at_once(model, ids):
    full = (ids * 64)[: model.architecture.context_length]
    assert list(generate(model, ScriptedCpu(model, len(full), []), full, GREEDY)) == [Delta("", None, "length")]
