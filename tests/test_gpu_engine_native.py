"""The engine on the real GPU executor (wgpu-native; lavapipe on CI machines).

Every test runs on two paths (the `path` fixture): "fused", the step users run (every
program/fusion.py rule, ALL: 5 dispatches a decode layer) on the stackable tiny model
(bench/synthetic_model.py --shape stacked), and "reference", the unfused program on the tiny
model with odd sizes (hidden 48, head_dim 12, partial q4 blocks).

- The executor against the CPU oracle: logits after prefill and after every decode step, and,
  when set-up built it, teacher-forced conformance on the real SmolLM2.
- Device loss: the device is destroyed (as a driver reset would) at a seeded random token
  position in each of LOSS_TRIALS answers, greedy and seeded sampling alternating (here for
  both programs; tests/test_gpu_loss_native.py tries every loss point, cancels included, on
  the default program users run). The
  delivered tokens are the GPU's committed prefix followed by exactly what a CPU-only run
  produces from that prefix; positions are consecutive; the events say Lost -> CPURebuild ->
  CPUGenerating; every GPU buffer is gone.
- Cancel at random steps: the answer ends "abort" with nothing shown after the cancel, the
  executor allocates nothing per step (the device's live buffer count is unchanged), and the
  next answer equals a fresh one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.engine import Engine, State
from webslm.plan import PlanPolicy
from webslm.program.fusion import ALL
from webslm.generate import generate, prompt_ids
from webslm.semantic.ledger import Ledger
from webslm.semantic.sampler import SamplerSettings, canonical_top_k

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
LOSS_TRIALS = 10                  # fused path: 2 at each LOSS_POINTS entry (every loss point on
                                  # admission's default program: tests/test_gpu_loss_native.py)
MAX_TOKENS = 12
GPU_TOP_K = PlanPolicy().top_k_capacity     # the executor's top-K: a larger top_k reads the whole row
# |GPU - CPU| per logit, relative to the row's largest |logit|: the GPU sums in other orders
# (split-K, subgroups, tiles) and in f32 like numpy; measured up to 4e-4 on the tiny model.
LOGIT_TOLERANCE = 2e-3


# Every admission here runs admission's kernel self-test once per device kind, then replays
# its report (conftest.py self_test_once): 34 admissions, one self-test. Admission and its
# self-test are tests/test_admission.py's subject.
pytestmark = pytest.mark.usefixtures("self_test_once")

# path -> (synthetic shape, fusion rules, decode dispatches a layer, device-loss trials)
PATHS = {"fused": ("stacked", ALL, 5, LOSS_TRIALS), "reference": ("tiny", (), 12, 10)}


@pytest.fixture(scope="module", params=sorted(PATHS))
def path(request):
    return request.param


@pytest.fixture(scope="module")
def model(path, gpu_slm_path, stacked_slm_path):
    return webslm.open_model(gpu_slm_path if PATHS[path][0] == "tiny" else stacked_slm_path)


@pytest.fixture(scope="module")
def policy(path):
    return AdmissionPolicy(fusions=PATHS[path][1])


@pytest.fixture(scope="module")
def ids(model):
    return prompt_ids(model, "hi there", chat=True)


def greedy() -> SamplerSettings:
    return SamplerSettings(temperature=0.0, max_tokens=MAX_TOKENS)


def sampled(seed: int) -> SamplerSettings:
    return SamplerSettings(temperature=0.8, top_k=40, seed=seed, max_tokens=MAX_TOKENS)


def cpu_answer(model, ids, settings) -> tuple[int, ...]:
    """generate.py's loop on a fresh CPU backend: the reference."""
    ledger = Ledger()
    for _ in generate(model, CpuBackend(model), list(ids), settings, ledger=ledger):
        pass
    return ledger.committed_ids


async def gpu_answer(engine, ids, settings, on_delta=None):
    deltas = []
    async for delta in engine.generate(list(ids), settings, chat=False):
        deltas.append(delta)
        if on_delta is not None:
            on_delta(len(deltas))
    return deltas, engine.ledger.committed_ids


def transitions(events) -> list[tuple[str, str]]:
    return [(e["from"], e["to"]) for e in events if e["event"] == "state"]


def assert_went_to_the_cpu(pairs: list[tuple[str, str]], point: str) -> None:
    """The state changes of an answer the GPU lost and the CPU continued: Lost -> CPURebuild ->
    CPUGenerating from the answer, or (a loss the engine saw before the answer began: only at
    "before-prefill") GPUReady -> Lost -> CPUReady -> CPUGenerating."""
    if ("GPUReady", "Lost") in pairs:
        assert point == "before-prefill" and pairs[3:6] == [
            ("GPUReady", "Lost"), ("Lost", "CPUReady"), ("CPUReady", "CPUGenerating")], pairs
    else:
        i = pairs.index(("Generating", "Lost"))
        assert pairs[i:i + 3] == [("Generating", "Lost"), ("Lost", "CPURebuild"),
                                  ("CPURebuild", "CPUGenerating")], (point, pairs)


# -- the executor against the oracle ----------------------------------------------------------

def test_gpu_logits_follow_the_cpu_oracle_through_prefill_and_decode(native_gpu, model, ids, run, path, policy):
    async def go():
        session = await admit(native_gpu, model, policy)
        backend = await GpuBackend.build(session, model)
        assert backend.forward.programs["decode"].dispatches_per_layer() == PATHS[path][2]
        cpu = CpuBackend(model)
        try:
            errors = []
            got, want = (await backend.prefill(ids, Want("full"))).logits, cpu.prefill(ids)
            for step in range(10):
                scale = float(np.abs(want).max())
                errors.append(float(np.abs(got - want).max()) / scale)
                token = int(np.argmax(want))
                got, want = (await backend.decode_one(token, Want("full"))).logits, cpu.decode_one(token)
                for asked in (Want("top-k", 8), Want("argmax")):   # the same step again, reduced on the GPU
                    backend.position -= 1                          # (rewrites the same cache row)
                    top = await backend.decode_one(token, asked)
                    assert list(top.ids) == list(canonical_top_k(got, top.ids.size))
                    assert top.values.tobytes() == got[top.ids].tobytes()
            return errors, backend.stats
        finally:
            backend.release()
    errors, stats = run(go())
    assert max(errors) <= LOGIT_TOLERANCE, errors
    assert stats["decode_steps"] == 30


@pytest.mark.parametrize("chain", [2, 1, 0], ids=["chained-2", "chained-1", "unchained"])
def test_greedy_chaining_is_exact_and_a_miss_rewrites_the_row(native_gpu, model, ids, run, path, policy,
                                                               monkeypatch, chain):
    """Greedy steps chained (the next `chain` steps submitted before this one is read, each
    one's token the GPU's own argmax of the step before, the next one encoded ahead) follow
    the CPU oracle fed the same tokens; a token other than the argmax (or a full-logits step)
    forgets the chained steps, and the step run instead rewrites their KV rows: its full
    logits, and the next steps', equal the CPU's. Unchained (a slow adapter), no step is
    chained."""
    from webslm.backends.gpu import executor
    monkeypatch.setattr(executor, "CHAIN_MAX_STEP_S", 60.0 if chain else 0.0)

    async def go():
        session = await admit(native_gpu, model, policy)
        backend = await GpuBackend.build(session, model)
        backend.chain_depth = max(chain, 1)
        cpu = CpuBackend(model)
        try:
            want = cpu.prefill(ids)
            token = int((await backend.prefill(ids, Want("argmax"))).ids[0])
            assert token == int(canonical_top_k(want, 1)[0])
            for _ in range(8):                         # greedy: the chained steps are used
                want = cpu.decode_one(token)
                token = int((await backend.decode_one(token, Want("argmax"))).ids[0])
                assert token == int(canonical_top_k(want, 1)[0])
            errors = []
            for other in ((token + 1) % model.architecture.vocab, token):   # a miss, then a full row
                got, want = (await backend.decode_one(other, Want("full"))).logits, cpu.decode_one(other)
                errors.append(float(np.abs(got - want).max()) / float(np.abs(want).max()))
                token = int(np.argmax(want))
            return errors, dict(backend.stats)
        finally:
            backend.release()
    errors, stats = run(go())
    assert max(errors) <= LOGIT_TOLERANCE, errors
    if chain:
        # the first decode step has no time measured yet; the second submits the third: 6 of 8
        assert stats["chained_steps"] == 6 and stats["chain_misses"] == 1, stats
    else:
        assert stats["chained_steps"] == 0 and stats["chain_misses"] == 0, stats


def test_prefill_in_several_chunks_follows_the_cpu_oracle(native_gpu, model, run, path):
    """A prompt longer than the plan's chunk runs as several submits (prefill_chunk 8: 23 tokens
    in 8 + 8 + 7), each chunk attending to the rows the earlier ones put in the cache."""
    ids = [int(i) for i in np.random.default_rng(23).integers(3, model.architecture.vocab, 23)]

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=PATHS[path][1], prefill_chunk=8))
        backend = await GpuBackend.build(session, model)
        try:
            assert backend.forward.chunk == 8
            return (await backend.prefill(ids, Want("full"))).logits
        finally:
            backend.release()
    got, want = run(go()), CpuBackend(model).prefill(ids)
    assert float(np.abs(got - want).max()) / float(np.abs(want).max()) <= LOGIT_TOLERANCE


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the default model is built by ./dev (tools/assets.py)")
def test_smollm2_conformance_on_the_native_gpu(native_gpu):
    out = subprocess.run([sys.executable, "-m", "webslm.cli", "conformance", "--model", str(SMOLLM2),
                          "--backend", "native", "--tokens", "16", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["backend"] == "gpu" and report["passed"]
    assert report["top1_agreement"] == 1.0 or all(d["margin"] < report["margin_tolerance"]
                                                  for d in report["disagreements"])
    assert report["max_abs_logit_error"] < 0.05


# -- device loss ---------------------------------------------------------------------------------

# Where the device dies: just before the decode step that would compute the chosen position;
# on the first GPU command (right after admission, before any prefill); at the second submit
# of a prefill (with the default 512-token chunk, the LM head after the one chunk); while the decode step's readback is in flight (the map
# pending, nothing polling it); and on a step that reads the whole logits row (top_k past the
# GPU's top-K). The reference path runs the first point only.
LOSS_POINTS = ("decode", "before-prefill", "within-prefill", "pending-readback", "full-logits")
LONG_PROMPT = "tell me a long story about " * 4         # a prefill whose second submit is its head


def losing_build(point: str, at_position: int, policy: AdmissionPolicy):
    """A build_gpu_backend that admits and builds the real executor, then destroys its device
    (the native equivalent of device.destroy()) at `point`."""
    built = []

    async def build(gpu, model, engine_policy, on_stage):
        session = await admit(gpu, model, policy, on_stage=on_stage)
        backend = await GpuBackend.build(session, model)
        device = session.device.inner
        if point == "before-prefill":
            device.destroy()
        elif point == "within-prefill":
            run, calls = device.run, []

            async def dying_run(*args, **kwargs):
                calls.append(1)
                if len(calls) == 2:
                    device.destroy()
                return await run(*args, **kwargs)
            device.run = dying_run
        else:
            decode_one, read_mapped = backend.decode_one, device.read_mapped

            async def dying_read(*args):          # the map is requested; the device dies before it lands
                asyncio.get_running_loop().call_soon(device.destroy)
                return await read_mapped(*args)

            async def dying(token, want, epoch=0):
                if backend.position + 1 >= at_position:
                    if point == "pending-readback":
                        device.read_mapped = dying_read
                    else:
                        device.destroy()
                return await decode_one(token, want, epoch)
            backend.decode_one = dying
        built.append(session)
        return backend, session.receipt.as_dict()
    build.built = built
    return build


@pytest.mark.parametrize("trial", range(LOSS_TRIALS))
def test_a_device_loss_continues_exactly_on_the_cpu(native_gpu, model, run, trial, path, policy):
    if trial >= PATHS[path][3]:
        pytest.skip(f"the {path} path runs {PATHS[path][3]} loss trials")
    point = LOSS_POINTS[trial % len(LOSS_POINTS)] if path == "fused" else "decode"
    rng = random.Random(4200 + trial)
    if point == "full-logits":
        settings = dataclasses.replace(sampled(rng.randrange(1 << 32)), top_k=GPU_TOP_K + 1)
    else:
        settings = sampled(rng.randrange(1 << 32)) if trial % 2 else greedy()
    ids = prompt_ids(model, LONG_PROMPT if point == "within-prefill" else "hi there", chat=True)
    n = 0 if "prefill" in point else rng.randrange(1, MAX_TOKENS)   # tokens the GPU commits first
    events, build = [], losing_build(point, len(ids) + n, policy)
    engine = Engine(model, gpu=native_gpu, on_event=events.append, build_gpu_backend=build)
    assert run(engine.load()) is State.GPU_READY
    deltas, got = run(gpu_answer(engine, ids, settings))

    prefix = got[:n]
    rest = dataclasses.replace(settings, max_tokens=MAX_TOKENS - n)
    assert got == prefix + cpu_answer(model, list(ids) + list(prefix), rest), point
    assert "".join(d.text for d in deltas) == model.tokenizer.decode(got, skip_special=True)   # shown = committed
    records = engine.ledger.records
    assert [r.position for r in records] == list(range(len(ids), len(ids) + len(records)))
    assert_went_to_the_cpu(transitions(events), point)
    session = build.built[0]
    assert session.device.destroyed and not session.device.live_buffers and not session.buffers
    assert engine.backend_kind == "cpu" and deltas[-1].finish_reason in ("stop", "length")


# -- cancellation --------------------------------------------------------------------------------

def test_random_cancels_leave_no_trace_and_no_new_buffers(native_gpu, model, ids, run, policy):
    events, built = [], []

    async def build(gpu, model, engine_policy, on_stage):
        session = await admit(gpu, model, policy, on_stage=on_stage)
        built.append(session)
        return await GpuBackend.build(session, model), session.receipt.as_dict()
    engine = Engine(model, gpu=native_gpu, on_event=events.append, build_gpu_backend=build)
    assert run(engine.load()) is State.GPU_READY
    fresh = run(gpu_answer(engine, ids, greedy()))[1]
    device = built[0].device
    buffers = len(device.live_buffers)
    rng = random.Random(77)
    for trial in range(6):
        cut = rng.randrange(1, MAX_TOKENS)
        shown_after_cancel, at_cancel = [], []

        def on_delta(count, cut=cut, at_cancel=at_cancel, shown_after_cancel=shown_after_cancel):
            if count == cut:
                at_cancel.append(len(engine.ledger.committed_ids))   # a token may commit with no text
                assert engine.cancel()
            elif count > cut:
                shown_after_cancel.append(count)
        deltas, committed = run(gpu_answer(engine, ids, greedy(), on_delta))
        assert deltas[-1].finish_reason == "abort" and not deltas[-1].text
        assert [d for d in deltas[cut:-1] if d.text] == [] and not engine.ledger.is_open
        assert committed == fresh[:len(committed)] and len(committed) == at_cancel[0]   # nothing commits after
        assert len(device.live_buffers) == buffers
    assert run(gpu_answer(engine, ids, greedy()))[1] == fresh           # the next answer is clean
    assert engine.backend_kind == "gpu"
    run(engine.unload())
    assert device.destroyed and not device.live_buffers


def test_a_gpu_answer_streams_through_the_cli(gpu_slm_path, native_gpu):
    out = subprocess.run([sys.executable, "-m", "webslm.cli", "generate", "--model", str(gpu_slm_path),
                          "--backend", "native", "--prompt", "hi there", "--greedy", "--max-tokens", "6",
                          "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    model = webslm.open_model(gpu_slm_path)
    # The GPU's own greedy answer (random weights have near ties, where GPU and CPU rounding
    # may pick differently: conformance measures that), streamed as the committed tokens.
    assert report["backend"] == "gpu" and len(report["token_ids"]) == 6
    assert report["text"] == model.tokenizer.decode(report["token_ids"], skip_special=True)
    states = [e["to"] for e in report["events"] if e.get("event") == "state"]
    assert "Generating" in states and "CPUGenerating" not in states and states[-1] == "Empty"   # unloaded at exit
