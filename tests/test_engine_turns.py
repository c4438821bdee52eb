"""The engine across turns and under Stop: KV-cache reuse, cancel during the prefill and the
decode, a slow step abandoned, and the prompt's progress.

- Reuse: a conversation answered turn by turn with the KV cache kept (engine/prompt_cache.py)
  gives the tokens the same conversation gives without it (Engine(reuse_kv=False)), on the
  fixture model with small CPU prefill chunks and on the real SmolLM2 with its chat template,
  where the boundary is checked too: after an answer that ended at EOS the whole cache is
  kept and the new turn's suffix starts with the end-of-turn token.
- Cancel during the prefill (the CPU path pausing at every half layer): the answer ends
  "abort" with no text, nothing commits, the cache keeps exactly the chunks finished before
  the cancel, the record says so, and the next answer reuses them and equals a fresh one.
- Cancel during the decode from another task (the page's Stop): no text after it.
- A step slower than the grace (a software GPU): the answer ends while the step is still
  running; the engine stays CancelPending until it retires, the stale result is counted,
  and the next answer waits for it.
No test asserts a time: ordering and absence of text only.
"""
from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from test_engine import FakeGpuBackend, reference, sampled

import webslm
from webslm.backends.cpu_path import CpuPath
from webslm.cpu import CpuBackend
from webslm.cpu.backend import CpuBackendError
from webslm.engine import Engine, State
from webslm.engine import engine as engine_module
from webslm.semantic.sampler import SamplerSettings

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
GREEDY = SamplerSettings(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


def chunked(model, chunk: int = 4):
    """An Engine on the CPU path whose prefill runs in chunks of `chunk` tokens."""
    return lambda reuse=True: Engine(model, cpu_backend=lambda: CpuBackend(model, prefill_chunk=chunk), reuse_kv=reuse)


async def one_answer(engine, ids, settings, on_progress=None):
    deltas = [d async for d in engine.generate(list(ids), settings, chat=False, on_progress=on_progress)]
    return deltas, engine.ledger.committed_ids, engine.last_timings


async def turns(engine, first: list[int], suffixes: list[list[int]], settings) -> list[dict]:
    """A conversation in ids: each turn's prompt is the last prompt, the answer's committed
    ids, the end-of-turn id and the next suffix (what a chat template renders)."""
    await engine.load()
    prompt, out = list(first), []
    eos = 298
    for suffix in [[]] + suffixes:
        if out:
            prompt = prompt + list(out[-1]["ids"]) + [eos] + suffix
        deltas, ids, timings = await one_answer(engine, prompt, settings)
        out.append({"prompt": prompt, "deltas": deltas, "ids": ids, "cached": timings.cached_tokens,
                    "record": list(engine.prompt_cache.ids), "position": engine._cpu().position})
    return out


SETTINGS = [GREEDY, sampled(7, max_tokens=6), sampled(19, max_tokens=6),
            SamplerSettings(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=3,
                            max_tokens=6)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "seed7", "seed19", "defaults"])
def test_a_conversation_with_reuse_gives_the_tokens_it_gives_without(model, run, settings):
    make = chunked(model)
    first, suffixes = [1, 5, 9, 200, 7, 3, 44, 12, 90, 17, 260], [[20, 30, 40, 50, 60], [61, 62, 63], [101, 102, 103, 104]]
    kept = run(turns(make(True), first, suffixes, settings))
    fresh = run(turns(make(False), first, suffixes, settings))
    assert [t["ids"] for t in kept] == [t["ids"] for t in fresh]
    assert [t["deltas"] for t in kept] == [t["deltas"] for t in fresh]
    assert [t["cached"] for t in fresh] == [0] * len(fresh)
    for before, turn in zip(kept, kept[1:]):
        # the cache held the last prompt and the answer tokens fed back (all but the last
        # one of an answer cut by max_tokens): exactly that prefix is kept
        fed = len(before["prompt"]) + len(before["ids"]) - (1 if len(before["ids"]) == settings.max_tokens else 0)
        assert turn["cached"] == min(fed, len(turn["prompt"]) - 1) > 0
    for turn in kept:
        assert turn["record"] == (turn["prompt"] + list(turn["ids"]))[:turn["position"]]


def test_the_same_prompt_again_reruns_only_its_last_token(model, run):
    engine = chunked(model)()
    ids = [1, 5, 9, 200, 7, 3, 44, 12, 90]

    async def twice():
        await engine.load()
        first = await one_answer(engine, ids, GREEDY)
        second = await one_answer(engine, ids, GREEDY)      # Regenerate: the same conversation
        return first, second
    first, second = run(twice())
    assert second[2].cached_tokens == len(ids) - 1 and first[2].cached_tokens == 0
    assert second[:2] == first[:2] == tuple(reference(model, ids, GREEDY).__dict__[k] for k in ("deltas", "ids"))


def test_reuse_is_dropped_after_an_error_and_when_the_backend_changes(model, run):
    events = []
    from test_engine import fake_gpu
    engine = Engine(model, gpu=object(), on_event=events.append, build_gpu_backend=fake_gpu(lose_at=14))
    ids = [1, 5, 9, 200, 7, 3, 44, 12, 90, 17]

    async def scenario():
        await engine.load()
        lost = await one_answer(engine, ids, GREEDY)                  # lost at position 14: the CPU replays
        again = await one_answer(engine, ids, GREEDY)                 # the CPU path's cache, from the replay
        return lost, again
    lost, again = run(scenario())
    assert lost[2].cached_tokens == 0 and engine.backend_kind == "cpu"
    assert again[2].cached_tokens == len(ids) - 1                   # the replay wrote the prompt
    assert again[1] == reference(model, ids, GREEDY).ids
    too_long = ids * 8
    with pytest.raises(CpuBackendError):
        run(one_answer(engine, too_long, GREEDY))
    assert engine.prompt_cache.ids == [] and engine.prompt_cache.backend is None


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the default model is built by ./dev (tools/assets.py)")
def test_smollm2_turns_keep_the_whole_cache_across_the_template_boundary(run):
    model = webslm.open_model(SMOLLM2)
    settings = SamplerSettings(temperature=0.0, max_tokens=12)
    questions = ["What is the capital of France?", "And of Italy?", "Which one is bigger?"]
    end_of_turn = model.tokenizer.encode("<|im_end|>", add_special=False)

    async def conversation(reuse: bool, system: str | None = None):
        engine = Engine(model, reuse_kv=reuse)
        await engine.load()
        messages = [] if system is None else [{"role": "system", "content": system}]
        rows = []
        for question in questions:
            messages.append({"role": "user", "content": question})
            ids = model.tokenizer.encode(model.chat_template.render(messages, add_generation_prompt=True), add_special=False)
            deltas, committed, timings = await one_answer(engine, ids, settings)
            rows.append({"ids": ids, "answer": committed, "cached": timings.cached_tokens,
                         "finish": deltas[-1].finish_reason})
            messages.append({"role": "assistant", "content": "".join(d.text for d in deltas)})
        await engine.unload()
        return rows
    kept, fresh = run(conversation(True)), run(conversation(False))
    assert [r["answer"] for r in kept] == [r["answer"] for r in fresh]
    first, second = kept[0], kept[1]
    assert first["finish"] == "stop"                               # ended at EOS: all of it was fed back
    assert second["cached"] == len(first["ids"]) + len(first["answer"])
    assert second["ids"][second["cached"]:second["cached"] + len(end_of_turn)] == end_of_turn
    assert all(r["cached"] > 0 for r in kept[1:])
    # another system prompt: only the template's opening is shared; the answer is a fresh one's
    ids = model.tokenizer.encode(model.chat_template.render(
        [{"role": "system", "content": "You are a terse geography teacher."}, {"role": "user", "content": questions[0]}],
        add_generation_prompt=True), add_special=False)

    async def switch_system(reuse: bool):
        engine = Engine(model, reuse_kv=reuse)
        await engine.load()
        await one_answer(engine, first["ids"], settings)
        return await one_answer(engine, ids, settings)
    (_, kept_answer, timings), (_, fresh_answer, _) = run(switch_system(True)), run(switch_system(False))
    assert 0 < timings.cached_tokens < 10 and kept_answer == fresh_answer


# -- Stop during the prefill and the decode (the CPU path) ---------------------------------------

def test_a_cancel_in_the_prefill_keeps_the_finished_chunks_and_shows_nothing(model, run, monkeypatch):
    monkeypatch.setattr(CpuPath, "PAUSE_S", 0.0)         # a turn of the loop at every half layer
    engine = chunked(model, chunk=4)()
    ids = [1, 5, 9, 200, 7, 3, 44, 12, 90, 17, 260, 31, 8, 77, 150, 2]
    seen, at = [], {}

    def on_progress(progress):
        seen.append(progress)
        if "position" not in at and progress["done"] >= 9:
            at["position"] = engine._cpu().position          # chunks finished before the cancel
            at["cancelled"] = engine.cancel()
            at["reports"] = len(seen)

    async def scenario():
        await engine.load()
        deltas = [d async for d in engine.generate(ids, GREEDY, chat=False, on_progress=on_progress)]
        return deltas
    deltas = run(scenario())
    assert at["cancelled"] and at["position"] == 8
    assert [(d.text, d.finish_reason) for d in deltas] == [("", "abort")]
    assert len(seen) == at["reports"]                        # no more work reported after the cancel
    assert engine.ledger.committed_ids == () and not engine.ledger.is_open
    assert engine._cpu().position == 8 and engine.prompt_cache.ids == ids[:8]
    assert engine.state is State.CPU_READY
    again = run(one_answer(engine, ids, GREEDY))
    assert again[2].cached_tokens == 8
    expected = reference(model, ids, GREEDY)
    assert (again[0], again[1]) == (expected.deltas, expected.ids)


def test_progress_runs_from_the_kept_prefix_to_the_whole_prompt(model, run, monkeypatch):
    monkeypatch.setattr(CpuPath, "PAUSE_S", 0.0)
    engine = chunked(model, chunk=4)()
    ids = [1, 5, 9, 200, 7, 3, 44, 12, 90, 17, 260, 31, 8]
    reports = [[], []]

    async def scenario():
        await engine.load()
        first = await one_answer(engine, ids, GREEDY, reports[0].append)
        longer = ids + list(first[1]) + [298, 40, 41, 42, 43, 44, 45]
        await one_answer(engine, longer, GREEDY, reports[1].append)
        return longer
    longer = run(scenario())
    for report, prompt in zip(reports, (ids, longer)):
        done = [r["done"] for r in report]
        assert done == sorted(done) and done[-1] == report[-1]["total"] == len(prompt)
        assert {r["phase"] for r in report} == {"prefill"} and done[0] == report[0]["cached"]
        assert len(report) > 3
    assert reports[0][0]["cached"] == 0 and reports[1][0]["cached"] >= len(ids)    # the first prompt, at least, kept


def test_a_stop_from_another_task_mid_decode_shows_no_more_text(model, run, monkeypatch):
    monkeypatch.setattr(CpuPath, "PAUSE_S", 0.0)
    engine = chunked(model)()
    ids = [1, 5, 9, 200, 7, 3]
    settings = SamplerSettings(temperature=0.0, max_tokens=30)
    expected = reference(model, ids, settings)
    log = []

    async def read():
        async for delta in engine.generate(ids, settings, chat=False):
            log.append(("delta", delta.text, delta.finish_reason))

    async def stop():
        while sum(1 for e in log if e[0] == "delta" and e[1]) < 3:
            await asyncio.sleep(0)
        log.append(("cancel", engine.cancel(), engine.ledger.committed_ids))

    async def scenario():
        await engine.load()
        await asyncio.gather(read(), stop())
    run(scenario())
    cancel = next(i for i, e in enumerate(log) if e[0] == "cancel")
    assert log[cancel][1] is True
    assert log[cancel + 1:] == [("delta", "", "abort")]
    committed = log[cancel][2]
    assert engine.ledger.committed_ids == committed == expected.ids[:len(committed)]
    assert [r.position for r in engine.ledger.records] == list(range(len(ids), len(ids) + len(committed)))


# -- a step slower than cancel's grace (a software GPU) ------------------------------------------

class SlowGpu(FakeGpuBackend):
    """The fake GPU whose decode steps wait for `go_on` (a software adapter's seconds)."""

    def __init__(self, model, **kw):
        super().__init__(model, check_epoch=False, **kw)
        self.go_on = asyncio.Event()
        self.running = False

    async def decode_one(self, token, want, epoch=0):
        self.running = True
        try:
            await self.go_on.wait()
            return await super().decode_one(token, want, epoch)
        finally:
            self.running = False


def test_a_slow_step_is_abandoned_and_the_next_answer_waits_for_it(model, run, monkeypatch):
    monkeypatch.setattr(engine_module, "CANCEL_GRACE_S", 0.01)
    events, built = [], []

    async def build(gpu, model_, policy, on_stage):
        backend = SlowGpu(model_)
        built.append(backend)
        return backend, {"outcome_code": "admitted"}
    engine = Engine(model, gpu=object(), on_event=events.append, build_gpu_backend=build)
    ids = [1, 5, 9, 200, 7, 3]
    log = []

    async def read(tag):
        async for delta in engine.generate(ids, GREEDY, chat=False):
            log.append((tag, delta.text, delta.finish_reason, built[0].running))

    async def scenario():
        await engine.load()
        fake = built[0]
        first = asyncio.ensure_future(read("first"))
        while not fake.running:                                 # the first decode step is in flight
            await asyncio.sleep(0)
        assert engine.cancel()
        log.append(("cancel",))
        await first                                             # ends without the step
        states = [engine.state]
        second = asyncio.ensure_future(read("second"))
        for _ in range(20):
            await asyncio.sleep(0)
        states.append(len([e for e in log if e[0] == "second"]))   # nothing yet: it waits for the step
        fake.go_on.set()
        await second
        states.append(engine.state)
        return states
    states = run(scenario())
    cancel = log.index(("cancel",))
    assert [e for e in log[cancel + 1:] if e[0] == "first"] == [("first", "", "abort", True)]   # ended while the step ran
    assert states[0] is State.CANCEL_PENDING and states[1] == 0 and states[2] is State.GPU_READY
    assert engine.ledger.dropped["stale"] == 1                  # the abandoned step's result, refused
    expected = reference(model, ids, GREEDY)
    assert [(e[1], e[2]) for e in log if e[0] == "second"] == [(d.text, d.finish_reason) for d in expected.deltas]
    pairs = [(e["from"], e["to"]) for e in events if e["event"] == "state"]
    i = pairs.index(("Generating", "CancelPending"))
    assert pairs[i:i + 3] == [("Generating", "CancelPending"), ("CancelPending", "GPUReady"), ("GPUReady", "Generating")]


def test_unload_waits_for_an_abandoned_step(model, run, monkeypatch):
    monkeypatch.setattr(engine_module, "CANCEL_GRACE_S", 0.01)
    built = []

    async def build(gpu, model_, policy, on_stage):
        built.append(SlowGpu(model_))
        return built[-1], {"outcome_code": "admitted"}
    engine = Engine(model, gpu=object(), build_gpu_backend=build)

    async def scenario():
        await engine.load()
        reader = asyncio.ensure_future(one_answer(engine, [1, 5, 9], GREEDY))
        while not built[0].running:
            await asyncio.sleep(0)
        engine.cancel()
        await reader
        unloading = asyncio.ensure_future(engine.unload())
        for _ in range(10):
            await asyncio.sleep(0)
        buffers_while_running = built[0].live_buffers
        built[0].go_on.set()
        await unloading
        return buffers_while_running
    assert run(scenario()) == FakeGpuBackend.BUFFERS           # not released under a running step
    assert built[0].live_buffers == 0 and engine.state is State.EMPTY


def test_cpu_prefill_chunks_agree_with_one_pass(model):
    """Chunking the prompt changes only the float rounding, never a greedy token here."""
    ids = [1, 5, 9, 200, 7, 3, 44, 12, 90, 17, 260, 31, 8]
    whole = CpuBackend(model, prefill_chunk=64).prefill(ids, all_logits=True)
    for chunk in (1, 3, 4, 7):
        rows = CpuBackend(model, prefill_chunk=chunk).prefill(ids, all_logits=True)
        np.testing.assert_allclose(rows, whole, rtol=0, atol=1e-5)
        assert (rows.argmax(axis=1) == whole.argmax(axis=1)).all()
