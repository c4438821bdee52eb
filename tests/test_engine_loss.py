"""Device loss and cancellation in the middle of an answer, in seeded random trials.

Loss: the fake GPU dies at a random position (the prompt's prefill included). The delivered
answer must be the committed prefix followed by exactly what a CPU-only run produces from
that prefix: the token ids equal those of generate.py's loop started on prompt + prefix
(same absolute positions, so the same sampler RNG draws). For the noise-free fake that is
the plain CPU answer. No position may be duplicated or missing, the events must say
Lost -> CPURebuild -> CPUGenerating, and the GPU must have been released.

Cancel: at a random moment (while a step is in flight, during the prefill, or by the reader
right after a delta). After cancel() returns no text is shown, nothing commits, the answer
ends "abort", and the next answer starts clean and equals a fresh one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from webslm.engine import Engine, EngineError, State
from webslm.generate import Delta

from test_engine import GREEDY, FakeGpuBackend, answer, fake_gpu, gpu_engine, reference, sampled, transitions

LOSS_TRIALS = 24
CANCEL_TRIALS = 24
# Turns of the event loop one fake step takes: 4 before it computes (the engine's task for the
# call starts, the fake yields twice, the CPU path once) and 2 after (the task's end wakes the
# answer). A cancel in the first 4 finds the step not yet computed.
TURNS_PER_STEP = 6


@pytest.fixture(scope="module")
def model(fixture_slm):
    import webslm
    return webslm.open_model(fixture_slm)


@pytest.fixture(scope="module")
def ids(model):
    from webslm.generate import prompt_ids
    return prompt_ids(model, "hi", chat=True)


def assert_positions_consecutive(engine, ids):
    records = engine.ledger.records
    assert [r.position for r in records] == list(range(len(ids), len(ids) + len(records)))
    assert len({r.generation_epoch for r in records}) <= 1


def assert_in_order(pairs, wanted):
    """wanted appears in pairs as a contiguous run."""
    n = len(wanted)
    assert any(pairs[i:i + n] == wanted for i in range(len(pairs) - n + 1)), pairs


# -- device loss ---------------------------------------------------------------------------------

NOISE = 1e-2     # about 1% of the fixture's logit spread: enough to change some answers


def loss_trial(model, ids, run, trial: int):
    """(settings, noise, n, what the GPU alone answers) for one seeded trial: greedy and
    sampled alternate, every other pair on the noisy fake; n tokens commit before the loss,
    which comes while the GPU is still answering."""
    rng = random.Random(8100 + trial)
    settings = sampled(rng.randrange(1 << 32)) if trial % 2 else GREEDY
    noise = NOISE if trial % 4 >= 2 else 0.0
    alone_engine, _ = gpu_engine(model, noise=noise)
    run(alone_engine.load())
    alone = run(answer(alone_engine, ids, settings))
    n = rng.randrange(len(alone.ids)) if alone.ids else 0
    return settings, noise, n, alone


def test_the_noisy_trials_commit_prefixes_the_cpu_would_not(model, ids, run):
    """The forced-prefix comparison has teeth only where the GPU's prefix differs from the
    CPU's own answer; enough trials must be such."""
    differing = 0
    for trial in range(LOSS_TRIALS):
        settings, noise, n, alone = loss_trial(model, ids, run, trial)
        differing += alone.ids[:n] != reference(model, ids, settings).ids[:n]
    assert differing >= 4


@pytest.mark.parametrize("trial", range(LOSS_TRIALS))
def test_a_loss_mid_answer_continues_exactly_on_the_cpu(model, ids, run, trial):
    settings, noise, n, alone = loss_trial(model, ids, run, trial)
    events = []
    engine, build = gpu_engine(model, events, lose_at=len(ids) + n, noise=noise)
    run(engine.load())
    got = run(answer(engine, ids, settings))
    fake = build.built[0]
    assert fake.lost and fake.live_buffers == 0                  # lost, and released at once

    prefix = got.ids[:n]
    assert prefix == alone.ids[:n]                               # the GPU's own tokens
    continuation = reference(model, list(ids) + list(prefix), settings)
    assert got.ids == prefix + continuation.ids
    assert got.finish == continuation.finish
    if not noise:
        assert got == reference(model, ids, settings)            # deltas and all
    else:
        shown = "".join(d.text for d in got.deltas)
        assert shown == model.tokenizer.decode(got.ids, skip_special=True)

    assert_positions_consecutive(engine, ids)
    assert engine.ledger.dropped == {"stale": 0, "duplicate": 0, "out-of-order": 0}
    pairs = transitions(events)
    assert_in_order(pairs, [("Generating", "Lost"), ("Lost", "CPURebuild"), ("CPURebuild", "CPUGenerating")])
    assert pairs[-1] == ("CPUGenerating", "CPUReady")
    lost = next(e for e in events if e.get("to") == "Lost")
    assert lost["code"] == "device-lost"
    assert [e["reason"] for e in events if e["event"] == "released"] == ["device-lost"]

    # The engine stays on the CPU path, and its next answer is a CPU answer.
    assert engine.state is State.CPU_READY and engine.backend_kind == "cpu"
    assert run(answer(engine, ids, settings)) == reference(model, ids, settings)
    assert transitions(events)[-2:] == [("CPUReady", "CPUGenerating"), ("CPUGenerating", "CPUReady")]


def test_a_loss_during_the_prefill_rebuilds_the_prompt_alone(model, ids, run):
    events = []
    engine, build = gpu_engine(model, events, lose_at=len(ids))
    run(engine.load())
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)
    assert build.built[0].wants == []                            # the GPU never answered
    rebuilt = next(e for e in events if e.get("to") == "CPUGenerating")
    assert rebuilt["position"] == len(ids)


def test_a_replay_that_does_not_match_is_a_visible_failure(model, ids, run):
    events = []
    engine, build = gpu_engine(model, events, lose_at=len(ids) + 4)
    run(engine.load())
    honest = engine.ledger.replay
    engine.ledger.replay = lambda: dataclasses.replace(honest(), sampler_state_hash="f" * 64)
    with pytest.raises(EngineError) as info:
        run(answer(engine, ids, GREEDY))
    assert info.value.code == "replay-mismatch"
    assert engine.state is State.VISIBLE_FAILURE and build.built[0].live_buffers == 0
    assert transitions(events)[-1] == ("CPURebuild", "VisibleFailure")
    assert not engine.ledger.is_open and len(engine.ledger.committed_ids) == 4
    engine.ledger.replay = honest
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)   # a retry acknowledges
    assert ("VisibleFailure", "CPUReady") in transitions(events)


def test_a_loss_after_cancel_ends_on_the_cpu_with_nothing_to_rebuild(model, ids, run):
    events = []
    engine = None

    def cancel_then_die(fake, position):
        if position == len(ids) + 3:
            engine.cancel()
            fake.lose_at = 0
    engine, build = gpu_engine(model, events, on_call=cancel_then_die)
    run(engine.load())
    got = run(answer(engine, ids, GREEDY))
    assert got.finish == "abort" and got.deltas[-1] == Delta("", None, "abort")
    assert len(got.ids) == 3 and build.built[0].live_buffers == 0
    assert_in_order(transitions(events), [("Generating", "CancelPending"), ("CancelPending", "Lost"),
                                          ("Lost", "CPUReady")])
    assert engine.state is State.CPU_READY
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)


def test_a_cancel_while_rebuilding_ends_the_answer(model, ids, run):
    events = []
    engine = None

    def on_event(event):
        events.append(event)
        if event.get("to") == "CPURebuild":
            engine.cancel()
    engine = Engine(model, gpu=object(), on_event=on_event, build_gpu_backend=fake_gpu(lose_at=len(ids) + 2))
    run(engine.load())
    got = run(answer(engine, ids, GREEDY))
    assert got.finish == "abort" and len(got.ids) == 2
    assert engine.state is State.CPU_READY
    # the CPU path checks the epoch before it replays anything: the replay stops there
    assert transitions(events)[-3:] == [("Lost", "CPURebuild"), ("CPURebuild", "CancelPending"),
                                        ("CancelPending", "CPUReady")]
    assert run(answer(engine, ids, GREEDY)) == reference(model, ids, GREEDY)


# -- cancellation --------------------------------------------------------------------------------

def cancel_trial(model, ids, run, trial: int) -> dict:
    """One seeded random cancel: from another task after a random number of loop turns
    (TURNS_PER_STEP a step, so turns 0-5 are the prefill), or by the reader right after
    a random delta; greedy and sampled alternate, and so does whether the fake abandons stale
    work itself; every fifth trial cancels in the prefill. Then one more answer on the same
    engine. What happened, for the asserts."""
    rng = random.Random(9100 + trial)
    settings = sampled(rng.randrange(1 << 32)) if trial % 2 else GREEDY
    expected = reference(model, ids, settings)
    by_reader = trial % 3 == 2
    events = []
    engine, build = gpu_engine(model, events, check_epoch=trial % 4 < 2)
    seen, ack = [], {}

    def cancel():
        ack["committed"] = engine.ledger.committed_ids
        ack["cancelled"] = engine.cancel()
        ack["at"] = len(seen)

    async def read():
        async for delta in engine.generate(ids, settings, chat=False):
            seen.append(delta)
            if by_reader and len(seen) == ack.get("after_delta"):
                cancel()

    async def scenario():
        await engine.load()
        if by_reader:
            ack["after_delta"] = rng.randrange(1, len(expected.deltas) + 1)
            await read()
        else:
            steps = 1 if trial % 5 == 0 else len(expected.ids) + 1
            ticks = rng.randrange(TURNS_PER_STEP * steps)

            async def canceller():
                for _ in range(ticks):
                    await asyncio.sleep(0)
                cancel()
            await asyncio.gather(read(), canceller())
        ack["final"], ack["open"] = engine.ledger.committed_ids, engine.ledger.is_open
        ack["events"] = transitions(events)
        return await answer(engine, ids, settings)

    again = run(scenario())
    return {**ack, "seen": seen, "expected": expected, "again": again, "engine": engine,
            "fake": build.built[0]}


@pytest.mark.parametrize("trial", range(CANCEL_TRIALS))
def test_a_random_cancel_shows_nothing_more_and_leaves_a_clean_engine(model, ids, run, trial):
    t = cancel_trial(model, ids, run, trial)
    expected, engine = t["expected"], t["engine"]
    if t["cancelled"]:
        assert [(d.text, d.finish_reason) for d in t["seen"][t["at"]:]] == [("", "abort")]
        assert t["final"] == t["committed"]                  # nothing committed after cancel()
        assert t["final"] == expected.ids[: len(t["final"])]
        assert not t["open"]
        pairs = t["events"]
        assert pairs[-2:] == [("Generating", "CancelPending"), ("CancelPending", "GPUReady")]
    else:
        assert t["seen"] == expected.deltas                  # the answer had ended already
    assert t["again"] == expected                            # the next answer starts clean
    assert engine.state is State.GPU_READY and t["fake"].live_buffers == FakeGpuBackend.BUFFERS
    run(engine.unload())
    assert t["fake"].live_buffers == 0


def test_the_random_cancels_hit_every_phase(model, ids, run):
    """The trials above are worth something only if most of them really cancel, some in the
    prefill, some with a step in flight (a stale result or an abandoned step) and some from
    the reader."""
    trials = [cancel_trial(model, ids, run, trial) for trial in range(CANCEL_TRIALS)]
    cancelled = [t for t in trials if t["cancelled"]]
    assert len(cancelled) >= CANCEL_TRIALS * 3 // 4
    assert any(not t["final"] for t in cancelled)                               # in the prefill
    assert any(t["engine"].ledger.dropped["stale"] for t in cancelled)          # a result refused
    assert any(i % 3 == 2 for i, t in enumerate(trials) if t["cancelled"])      # by the reader


def cancel_scenario(model, ids, run, ticks: int, check_epoch: bool, settings=GREEDY):
    """Cancel from another task after `ticks` turns of the loop; what happened."""
    engine, build = gpu_engine(model, check_epoch=check_epoch)
    seen, at = [], {}

    async def read():
        async for delta in engine.generate(ids, settings, chat=False):
            seen.append(delta)

    async def canceller():
        for _ in range(ticks):
            await asyncio.sleep(0)
        at["committed"] = engine.ledger.committed_ids
        at["cancelled"] = engine.cancel()
        at["seen"] = len(seen)
        at["open"] = engine.ledger.is_open

    async def scenario():
        await engine.load()
        await asyncio.gather(read(), canceller())
    run(scenario())
    return engine, build.built[0], seen, at


@pytest.mark.parametrize("ticks", [0, 1, 2])
def test_a_cancel_during_the_prefill_shows_nothing(model, ids, run, ticks):
    engine, fake, seen, at = cancel_scenario(model, ids, run, ticks, check_epoch=False)
    assert at["cancelled"] and at["seen"] == 0 and not at["open"]
    assert [(d.text, d.finish_reason) for d in seen] == [("", "abort")]
    assert engine.ledger.committed_ids == ()
    assert engine.ledger.dropped["stale"] == 1               # the prefill's result, refused


def test_a_stale_result_is_dropped_and_counted_or_abandoned_by_the_gpu(model, ids, run):
    ticks = TURNS_PER_STEP * 5 + 1                           # inside the sixth step, before it computes
    engine, fake, seen, at = cancel_scenario(model, ids, run, ticks, check_epoch=False)
    assert at["cancelled"] and engine.ledger.dropped["stale"] == 1
    assert engine.ledger.committed_ids == at["committed"]
    engine, fake, seen, at = cancel_scenario(model, ids, run, ticks, check_epoch=True)
    assert at["cancelled"] and engine.ledger.dropped["stale"] == 0   # abandoned before computing
    assert engine.ledger.committed_ids == at["committed"]


def test_a_new_answer_right_after_cancel_waits_for_the_step_in_flight(model, ids, run):
    engine, build = gpu_engine(model, check_epoch=False)
    expected = reference(model, ids, GREEDY)
    first = []

    async def read():
        async for delta in engine.generate(ids, GREEDY, chat=False):
            first.append(delta)

    async def supersede():
        for _ in range(TURNS_PER_STEP * 4 + 1):
            await asyncio.sleep(0)
        assert engine.cancel()
        return await answer(engine, ids, GREEDY)

    async def scenario():
        await engine.load()
        return (await asyncio.gather(read(), supersede()))[1]
    assert run(scenario()) == expected
    assert first[-1].finish_reason == "abort" and first[-1].text == ""
    assert engine.state is State.GPU_READY


def test_a_cancel_while_the_next_answer_waits_to_begin_ends_that_answer(model, ids, run):
    """The Stop the user clicks while the next answer still waits for the cancelled one's
    step to retire is meant for that answer: it ends "abort" with no text and nothing
    committed, without submitting a step, and the engine is ready; the answer after is a
    fresh one."""
    events = []
    engine, build = gpu_engine(model, events, check_epoch=False)
    expected = reference(model, ids, GREEDY)
    first, waiting = [], []

    async def read(into):
        async for delta in engine.generate(ids, GREEDY, chat=False):
            into.append(delta)

    async def scenario():
        await engine.load()
        reading = asyncio.ensure_future(read(first))
        for _ in range(TURNS_PER_STEP * 4 + 1):              # a decode step is in flight
            await asyncio.sleep(0)
        assert engine.cancel() and engine._in_flight is not None
        second = asyncio.ensure_future(read(waiting))
        for _ in range(2):                                    # it waits in _supersede
            await asyncio.sleep(0)
        assert engine._starting is not None and engine._in_flight is not None
        assert engine.cancel() is True
        await asyncio.gather(reading, second)
        prefills = [position for position, _ in build.built[0].wants].count(len(ids))
        assert prefills == 1                                  # the waiting answer read no prompt
        assert engine.ledger.committed_ids == ()
        return await answer(engine, ids, GREEDY)
    assert run(scenario()) == expected
    assert first[-1].finish_reason == "abort"
    assert [(d.text, d.finish_reason) for d in waiting] == [("", "abort")]
    assert engine.state is State.GPU_READY and engine.cancel() is False
    assert ("Generating", "CancelPending") in transitions(events)


def test_a_new_answer_supersedes_one_in_progress(model, ids, run):
    events = []
    engine, _ = gpu_engine(model, events)
    expected = reference(model, ids, GREEDY)
    first = []

    async def read():
        async for delta in engine.generate(ids, GREEDY, chat=False):
            first.append(delta)

    async def second():
        for _ in range(TURNS_PER_STEP * 3 + 1):
            await asyncio.sleep(0)
        return await answer(engine, ids, GREEDY)

    async def scenario():
        await engine.load()
        return (await asyncio.gather(read(), second()))[1]
    assert run(scenario()) == expected
    assert first[-1].finish_reason == "abort"
    assert transitions(events)[-4:] == [("Generating", "CancelPending"), ("CancelPending", "GPUReady"),
                                        ("GPUReady", "Generating"), ("Generating", "GPUReady")]


def test_cancel_without_an_answer_does_nothing(model, ids, run):
    engine, _ = gpu_engine(model)
    run(engine.load())
    assert engine.cancel() is False
    run(answer(engine, ids, GREEDY))
    assert engine.cancel() is False and engine.state is State.GPU_READY
