"""KV-cache reuse and Stop on the real GPU executor (wgpu-native; lavapipe on CI machines), on
the stackable synthetic model (bench/synthetic_model.py --shape stacked: context 320, so a
prompt spans several 64-token prefill chunks).

- The executor keeps a prefix and prefills the rest: its logits follow the CPU oracle's fresh
  prefill of the whole prompt within test_gpu_engine_native's LOGIT_TOLERANCE, for an exact
  extension (a new turn) and for a prefix that diverges mid-way (a re-rendered turn).
- The engine answers a conversation with reuse as it does without: tokens equal, or where
  they differ, the CPU oracle's top-2 margin at that position is within the tolerance (the
  random weights have near ties, and a reused row is summed in another order).
- Stop during a long prefill: the executor stops between chunks (at most two submitted past
  the one the cancel is seen after), nothing commits, the mark buffers are all destroyed,
  and the next answer keeps the chunks that were written.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_gpu_engine_native import LOGIT_TOLERANCE

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend, GpuBackendError
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.engine import Engine, State
from webslm.semantic.sampler import SamplerSettings

FULL = Want("full")
GREEDY = SamplerSettings(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)


def random_ids(model, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.architecture.vocab, n).tolist()


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_a_kept_prefix_gives_the_oracles_logits(native_gpu, model, run):
    first = random_ids(model, 90, 1)                 # two chunks of 64
    answer = random_ids(model, 5, 2)
    extension = first + answer + random_ids(model, 70, 3)            # the next turn
    diverging = first[:40] + random_ids(model, 60, 4)                # a re-rendered earlier turn

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(prefill_chunk=64))
        backend = await GpuBackend.build(session, model)
        errors = []
        try:
            await backend.prefill(first, FULL)
            for token in answer:
                await backend.decode_one(token, FULL)
            for prompt, keep in ((extension, len(first) + len(answer)), (diverging, 40)):
                backend.truncate(keep)
                got = (await backend.prefill(prompt[keep:], FULL)).logits
                oracle = CpuBackend(model).prefill(prompt)
                errors.append(relative_error(got, oracle))
                backend.reset()
                fresh = (await backend.prefill(prompt, FULL)).logits
                errors.append(relative_error(got, fresh))
                assert backend.position == len(prompt)
                backend.reset()                           # the next case rebuilds its prefix
                await backend.prefill(first, FULL)
                for token in answer:
                    await backend.decode_one(token, FULL)
            with pytest.raises(GpuBackendError):
                backend.truncate(backend.position + 1)
            return errors
        finally:
            backend.release()
    errors = run(go())
    assert max(errors) <= LOGIT_TOLERANCE, errors


def oracle_margin(model, ids: list[int]) -> float:
    """The CPU oracle's top-2 logit gap after ids, relative to the row's largest |logit|."""
    logits = CpuBackend(model).prefill(ids)
    top = np.sort(logits)[-2:]
    return float((top[1] - top[0]) / np.abs(logits).max())


def test_a_gpu_conversation_with_reuse_answers_as_without(native_gpu, model, run):
    first, suffixes = random_ids(model, 70, 5), [random_ids(model, 30, 6), random_ids(model, 20, 7)]
    eos = model.manifest.tokenizer["eos_ids"][0]

    async def conversation(reuse: bool):
        engine = Engine(model, gpu=native_gpu, reuse_kv=reuse)
        assert await engine.load() is State.GPU_READY
        prompt, rows = list(first), []
        for suffix in [[]] + suffixes:
            if rows:
                prompt = prompt + list(rows[-1][1]) + [eos] + suffix
            deltas = [d async for d in engine.generate(prompt, GREEDY, chat=False)]
            rows.append((list(prompt), engine.ledger.committed_ids, engine.last_timings.cached_tokens))
            assert engine.backend_kind == "gpu" and deltas[-1].finish_reason in ("stop", "length")
        await engine.unload()
        return rows
    kept, fresh = run(conversation(True)), run(conversation(False))
    assert [r[2] for r in kept][1:] and all(r[2] > 0 for r in kept[1:])
    for (prompt, a, _), (same_prompt, b, _) in zip(kept, fresh):
        if prompt != same_prompt:                  # an earlier turn differed: the conversations part
            break
        diverge = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if diverge is not None:
            assert oracle_margin(model, prompt + list(a[:diverge])) <= 2 * LOGIT_TOLERANCE


def test_a_stop_in_a_long_gpu_prefill_ends_between_chunks(native_gpu, model, run):
    ids = random_ids(model, 250, 8)                  # four chunks of 64
    engine = Engine(model, gpu=native_gpu, policy=AdmissionPolicy(prefill_chunk=64))
    seen, at = [], {}

    def on_progress(progress):
        seen.append(progress)
        if progress["done"] >= 64 and "cancelled" not in at:
            at["cancelled"] = engine.cancel()
            at["reports"] = len(seen)

    async def scenario():
        assert await engine.load() is State.GPU_READY
        device = engine._gpu.device
        buffers = len(device.live_buffers)                 # admission's TrackedDevice counts them
        deltas = [d async for d in engine.generate(ids, GREEDY, chat=False, on_progress=on_progress)]
        await engine.idle()
        position = engine._gpu.position
        after = len(device.live_buffers)
        record = list(engine.prompt_cache.ids)
        again = [d async for d in engine.generate(ids, GREEDY, chat=False)]
        cached = engine.last_timings.cached_tokens
        again_ids = engine.ledger.committed_ids
        await engine.unload()
        return deltas, position, (buffers, after), record, again, cached, again_ids
    deltas, position, buffers, record, again, cached, again_ids = run(scenario())
    assert at["cancelled"] and [(d.text, d.finish_reason) for d in deltas] == [("", "abort")]
    assert len(seen) == at["reports"]                      # nothing reported after the cancel
    assert position % 64 == 0 and 64 <= position <= 192   # whole chunks, stopped before the last
    assert record == ids[:position] and cached == position
    assert buffers[0] == buffers[1]                        # the chunk marks' staging buffers are gone
    assert again[-1].finish_reason in ("stop", "length") and len(again_ids) >= 1
